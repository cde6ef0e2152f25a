"""One-line calls a training script may add for what trainparity's hooks cannot see.

    from trainparity import probe
    probe.sample_ids(ids)          # the IDs of the batch about to be trained on
    probe.track(ema=ema, step=it)  # more state to compare: an EMA, counters, a loader

Outside a `tp.check_resume_script` run they do nothing and cost a dictionary lookup.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sample_ids", "track"]


def sample_ids(ids: Any) -> None:
    """Record the sample IDs of the next optimizer step's batch (enables `data_replayed`/`data_skipped`)."""
    from trainparity._script import _hook

    if _hook.RECORDER is not None:
        _hook.RECORDER.add_sample_ids(ids)


def track(**objects: Any) -> None:
    """Compare these objects too, under their names, at every optimizer step."""
    from trainparity._script import _hook

    if _hook.RECORDER is not None:
        _hook.RECORDER.tracked.update(objects)
