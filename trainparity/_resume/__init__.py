"""`check_resume`: save, real process exit, fresh-process load and continue vs uninterrupted training.

- `_check`: the check: its runs (worlds of ranks included) and the order of events;
- `_trace`: what one run records (`RunTrace`), the child task that trains and records it;
- `_ranks`: merging the traces of a run's ranks into one;
- `_judge`: the verdict on the four runs' traces (shared with the scripts' resume check);
- `_values`: fetching the values of differing tensors known by their digests.
"""

from trainparity._resume._check import check_resume

__all__ = ["check_resume"]
