"""Collection: iterate the user's iterables rank by rank into one array of IDs with its segment and batch tables.

Everything the user's code does here (`iter()`, `next()`, `sample_ids(batch)`, reading the
iterable that a batch or `sample_ids` returned) runs inside a guard: an exception it raises
becomes `UserCodeFailed`, which `check_coverage` turns into an ERROR result. IDs of the wrong
type are this module's own TypeError naming the batch and position, raised as it is.

An iterator is released as soon as its rank is done or fails: a generator is closed (its
cleanup runs), and a multiprocessing DataLoader iterator that did not finish shuts its workers
down. The traceback an ERROR result keeps would otherwise keep that iterator, and its worker
processes, alive as long as the result.
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import torch

from trainparity._batches._reading import ReadingTimedOut, UserCodeFailed, release_iterator, start_iterator
from trainparity._batches._sample_ids import IdArray, batch_id_array, plain_int_ids, read_ids
from trainparity._coverage._audit import Observations
from trainparity._coverage._record import WorkerBatch
from trainparity._process._alarm import DeadlinePassed

Window = tuple[int, Mapping[int, Any]]
#: the bytes of one int64 ID
_WORD = 8
#: the most IDs reserved ahead of need from an iterator's length hint
_MAX_AHEAD = 2**24
_DTYPE, _NDIM = operator.attrgetter("dtype"), operator.attrgetter("ndim")


def _empty(size: int, dtype: np.dtype[Any]) -> IdArray:
    """An uninitialized array in memory that torch allocates: numpy advises the kernel to back its own large
    buffers with huge pages, and where the kernel then compacts memory on the first touch (transparent huge pages
    in `madvise` mode with `defrag` on madvise) that first touch cost several times the whole audit (measured with
    `python tools/bench.py coverage`, first call). A CPU storage whatever torch's default device, and not
    `torch.empty`, which fills every byte under `torch.use_deterministic_algorithms(True)`."""
    storage = cast(Any, torch.UntypedStorage)(size * dtype.itemsize, device="cpu")  # untyped in torch's stubs
    return torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage).numpy().view(dtype)


class _Streams:
    """Every batch's IDs, copied in as the batch arrives (the pipeline may refill a batch's buffer later), with
    where each batch starts and the DataLoader worker that produced it (-1: unknown).

    The IDs grow by doubling, or at once to what the rank's iterator announces for it and for the ranks of its
    window after it (`_reserve`), in memory torch allocates (`_empty`); a first
    batch as large as the whole input (IDs already extracted) is copied once. A list of ID tensors is read
    without the per-batch loop (`read_tensors`). `read` is the per-batch loop, whose cost per batch bounds the
    audit's throughput on small batches from an iterator (`python tools/bench.py coverage`): a contiguous int64
    CPU tensor, the common batch, is copied by address (`ctypes.memmove`, after the checks that make its bytes
    exactly its IDs); other integer tensors and arrays are copied by numpy; anything else takes the general
    conversion (`batch_id_array`).
    """

    def __init__(self) -> None:
        self._data: IdArray = np.empty(0, dtype=np.int64)
        self._address = self._data.ctypes.data
        self.size = 0
        self.batch_starts: list[int] = []
        self.batch_workers: list[int] = []
        #: the kind of the first non-empty batch ("int" or "str") and where it was read
        self._first_kind: tuple[str, str] | None = None
        #: whether the first non-empty batch held ints (the buffer is then int64)
        self._ints = False
        #: the rank being read: its iterator's length hint, the ranks of its window after it, and the IDs and
        #: batches read before it
        self._rank_hint = self._ranks_after = self._rank_size = self._rank_batch = 0

    def ids(self) -> IdArray:
        return self._data[:self.size]

    def _begin_rank(self, batches_hint: int, ranks_after: int) -> None:
        self._rank_hint, self._ranks_after = batches_hint, ranks_after
        self._rank_size, self._rank_batch = self.size, len(self.batch_starts)

    def _reserve(self, end: int, dtype: np.dtype[Any]) -> IdArray:
        """Room for `end` IDs of `dtype`: at least double, and room for the rest of the rank's stream as far as
        its iterator's length hint and the batches so far tell, and for the window's ranks after it as long as
        this one (at most `_MAX_AHEAD` IDs ahead): one buffer for the common case, ranks of equal streams."""
        if end > len(self._data) or dtype != self._data.dtype:
            batches = len(self.batch_starts) - self._rank_batch
            announced = max(self._rank_hint - batches, 0) + self._ranks_after * self._rank_hint
            ahead = announced * (end - self._rank_size) // batches if batches else 0
            grown = _empty(max(end, 2 * len(self._data), end + min(ahead, _MAX_AHEAD)), dtype)
            grown[:self.size] = self._data[:self.size]
            self._data, self._address = grown, grown.ctypes.data
        return self._data

    def _append(self, array: IdArray, phase: str, index: int) -> None:
        """Int IDs (into the int64 buffer) or str IDs (the buffer widens its strings), of the first batch's kind."""
        kind = "str" if array.dtype.kind == "U" else "int"
        if self._first_kind is None:
            self._first_kind, self._ints = (kind, f"{phase}, batch {index}"), kind == "int"
        elif kind != self._first_kind[0]:
            raise TypeError(f"check_coverage: {phase}, batch {index} has {kind} IDs but {self._first_kind[1]} has "
                            f"{self._first_kind[0]} IDs; IDs must be all ints or all strings")
        end = self.size + len(array)
        dtype = np.dtype(np.int64) if self._ints else np.promote_types(self._data.dtype, array.dtype)
        self._reserve(end, dtype)[self.size:end] = array
        self.size = end

    def read_tensors(self, batches: list[Any] | tuple[Any, ...], phase: str, ranks_after: int) -> bool:
        """A list of ID tensors as a test or a recorder collects them, each an exact one-dimensional int64 CPU
        tensor (dense, strided or not): read without the per-batch loop (whose cost bounds the audit's throughput on
        small batches), by `torch.cat` into the buffer. False, reading nothing, when the list holds anything
        else, or the IDs read so far are not ints: `read` takes it then."""
        if not batches or self._first_kind is not None and not self._ints or set(map(type, batches)) != {
                torch.Tensor} or set(map(_DTYPE, batches)) != {torch.int64} or set(map(_NDIM, batches)) != {1}:
            return False
        self._begin_rank(len(batches), ranks_after)
        lengths = np.fromiter(map(torch.Tensor.numel, batches), dtype=np.int64, count=len(batches))
        ends = self.size + np.cumsum(lengths)
        starts, end = ends - lengths, int(ends[-1])
        self.batch_starts += starts.tolist()  # before `_reserve`, which reads how many batches the rank has
        self.batch_workers += [-1] * len(batches)
        ids = torch.from_numpy(self._reserve(end, np.dtype(np.int64)))
        try:
            # One call per run of equal lengths rather than one for the whole list (`_cat_ranges`); either is a
            # fraction of the time of a `ctypes.memmove` per batch.
            for first, stop in _cat_ranges(lengths):
                torch.cat(batches[first:stop], out=ids[int(starts[first]):int(ends[stop - 1])])
        except (RuntimeError, NotImplementedError):
            # A tensor on another device (CUDA, meta) or of another layout (sparse), which torch.cat refuses: asking
            # every tensor first would cost as much as the copy. Nothing counts as read.
            del self.batch_starts[self._rank_batch:], self.batch_workers[self._rank_batch:]
            return False
        if self._first_kind is None and end > self.size:
            self._first_kind, self._ints = ("int", f"{phase}, batch {int(np.flatnonzero(lengths)[0])}"), True
        self.size = end
        return True

    def read(self, iterator: Any, sample_ids: Callable[[Any], Any] | None, phase: str, rank: int,
             ranks_after: int) -> None:
        """Read one rank's batches from `iterator` to its end; the user's code runs guarded (`UserCodeFailed`)."""
        starts, workers = self.batch_starts, self.batch_workers
        self._begin_rank(_length_hint(iterator), ranks_after)
        index = 0
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as error:  # noqa: BLE001 - the user's data pipeline failed: an ERROR result
                raise UserCodeFailed(error, f"{phase}, batch {index}", rank) from error
            worker = -1
            if isinstance(batch, WorkerBatch):
                batch, worker = batch.batch, _worker(batch.worker, phase, index)
            try:
                ids = batch if sample_ids is None else sample_ids(batch)
                if type(ids) is not torch.Tensor:
                    ids = read_ids(ids)
            except Exception as error:  # noqa: BLE001 - sample_ids or the IDs it returned raised: ERROR
                where = f"{phase}, batch {index}"
                raise UserCodeFailed(error, where if sample_ids is None else f"sample_ids() at {where}",
                                     rank) from error
            size = self.size
            starts.append(size)
            workers.append(worker)
            # An exact torch.Tensor (no subclass) on the CPU, of int64, one-dimensional and contiguous (a sparse
            # or nested tensor is not both): its IDs are the `numel` int64 words at `data_ptr`.
            if self._ints and type(ids) is torch.Tensor and ids.dtype is torch.int64 and ids.ndim == 1 \
                    and ids.is_cpu and ids.is_contiguous():
                end = size + ids.numel()
                if end > len(self._data):
                    self._reserve(end, self._data.dtype)
                ctypes.memmove(self._address + _WORD * size, ids.data_ptr(), _WORD * (end - size))
                self.size = end
            else:
                array = plain_int_ids(ids)
                if array is None:
                    array = batch_id_array(ids, f"check_coverage: {phase}, batch {index}", copy=False)
                if len(array):
                    self._append(array, phase, index)
            index += 1


#: equal-length batches that `_cat_ranges` gives a `torch.cat` call of their own
_RUN = 16


def _cat_ranges(lengths: np.ndarray[Any, np.dtype[np.int64]]) -> list[tuple[int, int]]:
    """The [first, stop) ranges of batches to concatenate with one `torch.cat` each.

    torch.cat copies inputs of one shape through one reused iterator, and builds an iterator per input (about four
    times the cost per 64-ID batch) when their shapes differ: a list of batches as a sampler deals them, all of one
    size but a shorter last one, costs a quarter as much in two calls as in one. So each run of at least `_RUN`
    equal lengths gets its own call, and what lies between such runs one call, so that batches of many sizes
    cost no more calls than they have long runs.
    """
    bounds = [0, *(np.flatnonzero(np.diff(lengths)) + 1).tolist(), len(lengths)]
    ranges: list[tuple[int, int]] = []
    joining = False  # whether the last range holds short runs, which a next short run joins
    for first, stop in zip(bounds[:-1], bounds[1:], strict=True):
        short = stop - first < _RUN
        if short and joining:
            ranges[-1] = (ranges[-1][0], stop)
        else:
            ranges.append((first, stop))
        joining = short
    return ranges


def epoch_groups(windows: list[Window]) -> list[int]:
    """The epoch of each window as an index into the distinct epochs: consecutive windows of one epoch share it."""
    groups: list[int] = []
    for i, (label, _) in enumerate(windows):
        groups.append(0 if i == 0 else groups[-1] + (label != windows[i - 1][0]))
    return groups


def _read_rank(streams: _Streams, mapping: Any, rank: Any, phase: str, sample_ids: Callable[[Any], Any] | None,
               ranks_after: int) -> None:
    """Read one rank's batches of one window into `streams`; the user's errors and the deadline say where."""
    iterable: Any = None
    iterator: Any = None
    finished = late = False
    try:
        try:
            iterable = mapping[rank]
            iterator = start_iterator(iterable)
        except Exception as error:  # noqa: BLE001 - the user's __iter__ failed: an ERROR result
            raise UserCodeFailed(error, phase, int(rank)) from error
        if sample_ids is not None or type(iterable) not in (list, tuple) \
                or not streams.read_tensors(iterable, phase, ranks_after):
            streams.read(iterator, sample_ids, phase, int(rank), ranks_after)
        finished = True
    except DeadlinePassed as interruption:
        late = True
        raise ReadingTimedOut(interruption, phase, int(rank)) from None
    finally:
        # Only a generator is closed: another iterator may be its own iterable, reused in the next epoch.
        release_iterator(iterator, iterable, finished, late)
        del iterator, iterable


def collect(windows: list[Window], sample_ids: Callable[[Any], Any] | None) -> Observations:
    """Iterate every rank's batches into one array of IDs with its segment and batch tables.

    A segment is one rank's stream in one epoch: the windows of one epoch (consecutive in
    `windows`) are joined, rank by rank, in the order given.
    """
    groups = epoch_groups(windows)
    several = len(groups) != len(set(groups))  # some epoch is observed in several windows
    streams = _Streams()
    #: one piece per (window, rank): (epoch group, rank, window, first ID, end ID, first batch, end batch)
    pieces: list[tuple[int, int, int, int, int, int, int]] = []
    for window, (label, mapping) in enumerate(windows):
        ranks = sorted(mapping)
        for position, rank in enumerate(ranks):
            ranks_after = len(ranks) - position - 1
            phase = f"window {window} (epoch {label}), rank {rank}" if several else f"epoch {label}, rank {rank}"
            first_id, first_batch = streams.size, len(streams.batch_starts)
            _read_rank(streams, mapping, rank, phase, sample_ids, ranks_after)
            pieces.append((groups[window], int(rank), window, first_id, streams.size, first_batch,
                           len(streams.batch_starts)))
    total = streams.size
    ids = streams.ids()
    starts = np.array(streams.batch_starts, dtype=np.int64)
    workers = np.array(streams.batch_workers, dtype=np.int64)
    piece_starts = piece_clocks = None
    if several:  # join each rank's pieces of an epoch: (epoch, rank), the windows in the order given
        longest = [0] * len(windows)
        for _, _, window, first_id, end_id, _, _ in pieces:
            longest[window] = max(longest[window], end_id - first_id)
        clock_at = [0] * len(windows)  # a window starts when the epoch's earlier windows' longest streams end
        for window in range(1, len(windows)):
            if groups[window] == groups[window - 1]:
                clock_at[window] = clock_at[window - 1] + longest[window - 1]
        pieces.sort(key=lambda piece: piece[:2])
        ids = np.concatenate([ids[a:b] for _, _, _, a, b, _, _ in pieces])
        batches = np.concatenate([np.arange(c, d, dtype=np.int64) for *_, c, d in pieces])
        lengths = np.diff(np.append(starts, total))[batches]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(batches) else starts
        workers = workers[batches]
        piece_starts = np.cumsum([0] + [b - a for _, _, _, a, b, _, _ in pieces[:-1]], dtype=np.int64)
        piece_clocks = np.array([clock_at[window] for _, _, window, *_ in pieces], dtype=np.int64)
    segment_starts, segment_batches = [0], [0]
    segment_window: list[int] = []
    segment_rank: list[int] = []
    for group, rank, _, first_id, end_id, first_batch, end_batch in pieces:
        if segment_window and (segment_window[-1], segment_rank[-1]) == (group, rank):
            segment_starts[-1] += end_id - first_id
            segment_batches[-1] += end_batch - first_batch
            continue
        segment_starts.append(segment_starts[-1] + end_id - first_id)
        segment_batches.append(segment_batches[-1] + end_batch - first_batch)
        segment_window.append(group)
        segment_rank.append(rank)
    as_array = np.array
    return Observations(
        ids=ids,
        segment_starts=as_array(segment_starts, dtype=np.int64),
        segment_window=as_array(segment_window, dtype=np.int64),
        segment_rank=as_array(segment_rank, dtype=np.int64),
        segment_batches=as_array(segment_batches, dtype=np.int64),
        batch_starts=starts,
        batch_workers=workers,
        epochs=list(dict.fromkeys(label for label, _ in windows)),
        ranks=sorted({int(rank) for _, mapping in windows for rank in mapping}),
        piece_starts=piece_starts,
        piece_clocks=piece_clocks,
    )


def _length_hint(iterator: Any) -> int:
    """How many batches the iterator says it will yield (0 when it does not say): only a hint for the buffer, so
    an error in the user's `__len__` or `__length_hint__` is none of the audit's business."""
    try:
        return operator.length_hint(iterator)
    except Exception:  # noqa: BLE001
        return 0


def _worker(worker: object, phase: str, index: int) -> int:
    if worker is None:
        return -1
    if isinstance(worker, bool) or not isinstance(worker, (int, np.integer)) or worker < 0:
        raise TypeError(f"check_coverage: {phase}, batch {index} is a WorkerBatch whose worker is {worker!r}; "
                        "it must be an int >= 0 or None")
    return int(worker)
