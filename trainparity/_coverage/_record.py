"""Where coverage observations come from: worker provenance for DataLoader batches, and `CoverageRecorder`.

`tag_workers()` is a collate function that wraps each batch in a `WorkerBatch` carrying the
id of the DataLoader worker that produced it (`torch.utils.data.get_worker_info()`), so a
replica bug (an IterableDataset iterated by every worker) names the workers that repeated a
sample. `CoverageRecorder` collects one rank's IDs inside a real training loop; records of
all ranks are merged (or all-gathered with torch.distributed) and audited by `check_coverage`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils.data

from trainparity._batches._sample_ids import IdArray, batch_id_array
from trainparity._validation import InvalidArgument, check_argument, check_callable, check_int


class WorkerBatch(NamedTuple):
    """A batch tagged with the DataLoader worker that produced it (`worker` is None in the main process).

    `check_coverage` and `CoverageRecorder.record` unwrap it: `sample_ids` receives `.batch`,
    and violations carry `.worker`. `pin_memory=True` keeps the tag (it is a named tuple).
    """

    batch: Any
    worker: int | None


def tag_workers(collate_fn: Callable[[Any], Any] | None = None) -> Callable[[Any], WorkerBatch]:
    """A collate function for `DataLoader(collate_fn=...)` that returns `WorkerBatch(collate_fn(samples), worker)`.

    `collate_fn` defaults to `torch.utils.data.default_collate`. The result pickles, so it
    works with every worker start method.
    """
    if collate_fn is not None:
        check_callable("tag_workers(collate_fn)", collate_fn, "a collate function")
    return functools.partial(_collate_tagged, collate_fn or torch.utils.data.default_collate)


def _collate_tagged(collate_fn: Callable[[Any], Any], samples: Any) -> WorkerBatch:
    info = torch.utils.data.get_worker_info()
    return WorkerBatch(collate_fn(samples), None if info is None else int(info.id))


class _Stream:
    """One rank's IDs in one epoch, batch by batch (compacted to one array when pickled)."""

    def __init__(self) -> None:
        self.parts: list[IdArray] = []
        self.workers: list[int] = []

    def append(self, ids: IdArray, worker: int | None) -> None:
        self.parts.append(ids)
        self.workers.append(-1 if worker is None else worker)

    def batches(self) -> list[WorkerBatch]:
        return [WorkerBatch(ids, None if worker < 0 else worker) for ids, worker in zip(self.parts, self.workers,
                                                                                         strict=True)]

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def joined(self, later: _Stream) -> _Stream:
        """A new stream: this one's batches, then `later`'s."""
        stream = _Stream()
        stream.parts, stream.workers = self.parts + later.parts, self.workers + later.workers
        return stream

    def __getstate__(self) -> dict[str, Any]:
        parts = [p for p in self.parts if len(p)]
        ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return {"ids": ids, "lengths": np.array([len(p) for p in self.parts], dtype=np.int64),
                "workers": np.array(self.workers, dtype=np.int64)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        bounds = np.concatenate([[0], np.cumsum(state["lengths"])]).tolist()
        self.parts = [state["ids"][a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self.workers = [int(w) for w in state["workers"]]


class CoverageRecorder:
    """Collects the sample IDs that one rank trains on, epoch by epoch, inside a training loop.

    `rank` defaults to `torch.distributed.get_rank()` when a process group is initialized,
    else 0. `sample_ids(batch)` extracts the IDs (default: the batch is the IDs). A record is
    small (its IDs as one numpy array per epoch) and picklable (without `sample_ids`); records
    of all ranks, and of the jobs that trained one epoch in turn, are combined with
    `CoverageRecorder.merge(records)` or, inside a torch.distributed job, `recorder.gather()`,
    and the combined record is audited with `tp.check_coverage(record, policy=...)` (its windows
    are the recorded epochs).
    """

    def __init__(self, rank: int | None = None, *, sample_ids: Callable[[Any], Any] | None = None) -> None:
        if rank is None:
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            rank = torch.distributed.get_rank() if distributed else 0
        rank = check_int("CoverageRecorder(rank=...)", rank, 0)
        if sample_ids is not None:
            check_callable("CoverageRecorder(sample_ids=...)", sample_ids, "callable")
        self._rank: int | None = rank
        self._sample_ids = sample_ids
        self._epoch = 0
        self._streams: dict[int, dict[int, _Stream]] = {int(rank): {}}

    @property
    def ranks(self) -> list[int]:
        """The ranks this record holds (one, until records are merged)."""
        return sorted(self._streams)

    @property
    def epochs(self) -> list[int]:
        """The epochs recorded by any rank."""
        return sorted({epoch for streams in self._streams.values() for epoch in streams})

    def __len__(self) -> int:
        """How many IDs were recorded, over all ranks and epochs."""
        return sum(len(stream) for streams in self._streams.values() for stream in streams.values())

    def __repr__(self) -> str:
        return f"CoverageRecorder(ranks={self.ranks}, epochs={self.epochs}, ids={len(self)})"

    def set_epoch(self, epoch: int) -> None:
        """Record the following batches as epoch `epoch` (call it where you call `sampler.set_epoch`)."""
        self._epoch = check_int("CoverageRecorder.set_epoch(epoch)", epoch, 0)

    def record(self, batch: Any, *, worker: int | None = None) -> None:
        """Record one batch's IDs for the current epoch. A `WorkerBatch` gives its worker and is unwrapped."""
        if self._rank is None:
            raise InvalidArgument("this record merges several ranks; record() on each rank's own CoverageRecorder")
        if isinstance(batch, WorkerBatch):
            batch, worker = batch.batch, batch.worker if worker is None else worker
        ids = self._sample_ids(batch) if self._sample_ids is not None else batch
        stream = self._streams[self._rank].setdefault(self._epoch, _Stream())
        where = f"CoverageRecorder.record: rank {self._rank}, epoch {self._epoch}, batch {len(stream.parts)}"
        stream.append(batch_id_array(ids, where, copy=True), worker)

    def __getstate__(self) -> dict[str, Any]:
        # sample_ids is often a lambda: what travels is the record, not the extraction.
        return {"rank": self._rank, "epoch": self._epoch, "streams": self._streams}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._rank, self._epoch, self._streams = state["rank"], state["epoch"], state["streams"]
        self._sample_ids = None

    @classmethod
    def merge(cls, records: Iterable[CoverageRecorder]) -> CoverageRecorder:
        """One record holding every rank and epoch of `records`.

        A rank that recorded the same epoch in several records (the jobs before and after a
        preemption, each with its own recorders) has one stream in that epoch: its records'
        streams joined in the order of `records`, so pass the earlier job's records first. Its
        positions and batch numbers then count on from where the earlier record stopped.
        """
        merged = cls.__new__(cls)
        merged._rank, merged._epoch, merged._sample_ids, merged._streams = None, 0, None, {}
        seen: list[CoverageRecorder] = []
        for record in records:
            check_argument(isinstance(record, CoverageRecorder), f"CoverageRecorder.merge() takes CoverageRecorder "
                           f"records, got {type(record).__name__}")
            check_argument(all(record is not earlier for earlier in seen), f"CoverageRecorder.merge() got the same "
                           f"record twice ({record!r}); merge each record once")
            seen.append(record)
            for rank, streams in record._streams.items():
                into = merged._streams.setdefault(rank, {})
                for epoch, stream in streams.items():
                    into[epoch] = into[epoch].joined(stream) if epoch in into else stream
        check_argument(merged._streams, "CoverageRecorder.merge() got no records")
        return merged

    def gather(self, group: Any = None) -> CoverageRecorder:
        """All-gather the records of every rank of `group` (default: the world) and return them merged.

        Call it on every rank (it is a collective, `torch.distributed.all_gather_object`); every
        rank receives the merged record, and one of them (usually rank 0) audits it.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("CoverageRecorder.gather() needs an initialized torch.distributed process group; "
                               "without one, merge records with CoverageRecorder.merge(records)")
        records: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(records, self, group=group)
        return CoverageRecorder.merge(records)

    def windows(self) -> list[tuple[int, Mapping[int, list[WorkerBatch]]]]:
        """(epoch, {rank: batches}) for every recorded epoch; a rank that recorded nothing has no batches."""
        return [(epoch, {rank: (streams[epoch].batches() if epoch in streams else [])
                         for rank, streams in sorted(self._streams.items())})
                for epoch in (self.epochs or [0])]
