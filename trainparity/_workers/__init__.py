"""Worker randomness: whether a DataLoader's workers, or its epochs, draw the same random numbers.

- `_streams`: the random streams a worker may consume (the global ones, and the generators reachable from the
  dataset), and digests of their states;
- `_record`: the recording `worker_init_fn` and `collate_fn` that run inside the workers;
- `_check`: `tp.check_worker_randomness`: iterates the loader with them, in this process;
- `_judge`: the streams two workers of an epoch, or two epochs, walk alike.

Like coverage, the check reads the user's loader in this process and shares `_batches/_reading.py`'s handling of
the user's errors, of timeouts and of the workers' shutdown.
"""

from trainparity._workers._check import check_worker_randomness

__all__ = ["check_worker_randomness"]
