"""The coverage audit: every policy judged over numpy arrays, without a Python loop per sample.

Observations arrive as one array of IDs in (epoch, rank, position) segment order. IDs are
encoded once as int64 codes: a code below U is the ID's position in the declared universe
(U IDs), codes from U up number the other observed IDs (sorted). Per window, a byte per
possible code marks the codes seen, which tells the missed IDs and, when there are as many
distinct codes as observations, that nothing repeated; only otherwise does one `bincount`
tell which IDs were repeated. When the codes span far more values than the window has
observations (a universe of 10**12 IDs, a few observed), `np.unique` counts them instead, so
that nothing of the universe's size is allocated. Only
the observations of repeated IDs are sorted, to classify each repeat as a same-rank or
cross-rank duplicate. The missing IDs are not listed: they are the gaps between the sorted
distinct codes observed, and only as many as are asked for are produced.
The findings form a columnar table, sorted at the end into observation order:
(epoch, position, rank) for what was observed, then per window the missing IDs in universe
order, the padding count, and the ranks whose order repeated an earlier epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from trainparity._batches._sample_ids import IdArray
from trainparity._coverage._universe import Universe

#: violation kinds in the order the audit reports ties (same observation, or end of a window)
KINDS = (
    "unexpected_id",
    "same_rank_duplicate",
    "cross_rank_duplicate",
    "missing_id",
    "padding_count",
    "repeated_epoch_order",
)
UNEXPECTED, SAME_RANK, CROSS_RANK, MISSING, PADDING, REPEATED = range(len(KINDS))
#: IDs without a universe whose values span at most this many slots per observation are coded by offset
DENSE_SPAN_FACTOR = 2
_SPAN_SLACK = 1024
#: a window's codes are counted with arrays of one slot per possible code (a byte each, then a bincount if a code
#: repeats) when there are at most this many possible codes per observation (plus a slack), else with np.unique
#: (the sparse path)
DENSE_COUNT_FACTOR = 8


@dataclasses.dataclass
class Observations:
    """Every observed sample ID with where it was observed.

    Segment s is one rank's stream in one window: `ids[segment_starts[s]:segment_starts[s + 1]]`.
    Segments are ordered by window, then rank. Batches are numbered globally; `batch_workers`
    holds each batch's DataLoader worker (-1: unknown).
    """

    ids: IdArray
    segment_starts: IdArray
    segment_window: IdArray
    segment_rank: IdArray
    segment_batches: IdArray
    batch_starts: IdArray
    batch_workers: IdArray
    #: the label of each window (its epoch number)
    epochs: list[int]
    #: every rank that appears in any window, sorted
    ranks: list[int]
    #: when an epoch was observed in several windows (its rank streams joined): where each piece (one rank in
    #: one window) starts in `ids`, and the clock of its first observation; None when no epoch was
    piece_starts: IdArray | None = None
    piece_clocks: IdArray | None = None

    @property
    def kind(self) -> str:
        return "str" if self.ids.dtype.kind == "U" else "int"

    def window_bounds(self, window: int) -> tuple[int, int, int, int]:
        """(first segment, end segment, first ID, end ID) of a window."""
        first, end = np.searchsorted(self.segment_window, [window, window + 1])
        return int(first), int(end), int(self.segment_starts[first]), int(self.segment_starts[end])

    def locate(self, index: IdArray) -> tuple[IdArray, IdArray, IdArray, IdArray]:
        """(segment, position in the rank's stream, batch number in that stream, worker) of observations."""
        segment = np.searchsorted(self.segment_starts, index, side="right") - 1
        position = index - self.segment_starts[segment]
        batch = np.searchsorted(self.batch_starts, index, side="right") - 1
        return segment, position, batch - self.segment_batches[segment], self.batch_workers[batch]

    def clock(self, index: IdArray, position: IdArray) -> IdArray:
        """When observations were made within their epoch, as the audit orders them with the rank: the position
        in the rank's stream, but in an epoch of several windows, the position within the window plus the
        longest rank stream of each earlier window of the epoch (a window's observations come after the
        earlier windows', whatever the ranks)."""
        if self.piece_starts is None or self.piece_clocks is None:
            return position
        piece = np.searchsorted(self.piece_starts, index, side="right") - 1
        clock: IdArray = index - self.piece_starts[piece] + self.piece_clocks[piece]
        return clock


@dataclasses.dataclass
class Plan:
    """What to judge: derived from the policies that could be judged."""

    universe: Universe | None
    unexpected: bool = False
    #: same-rank and cross-rank duplicates among universe IDs (ExactlyOnce)
    universe_duplicates: bool = False
    #: cross-rank duplicates among all IDs (NoCrossRankOverlap)
    cross_rank: bool = False
    missing: bool = False
    #: declared paddings (ExpectedPadding), one padding_count check each
    paddings: tuple[int, ...] = ()
    epoch_order: bool = False

    @property
    def judges_anything(self) -> bool:
        return self.unexpected or self.universe_duplicates or self.cross_rank or self.missing or \
            bool(self.paddings) or self.epoch_order


#: the columns a finding may carry besides its kind, window and sort order (-1 where it does not apply)
COLUMNS = (
    "observation",  # observation index (-1 for missing_id, padding_count, repeated_epoch_order)
    "code",  # sample code (-1 where no sample applies)
    "reference",  # duplicates: the observation seen first; repeated_epoch_order: the earlier window
    "detail",  # repeated_epoch_order: the rank; padding_count: the declared padding
    "count",  # padding_count: the extra observations; repeated_epoch_order: the length of the stream
)
#: composite sort keys must stay below this, else the findings are sorted with lexsort
_KEY_LIMIT = 2**62


@dataclasses.dataclass
class _Chunk:
    """Findings of one kind in one window; `order` sorts them within the window's phase."""

    kind: int
    window: int
    #: 0: observed, 1: missing IDs, 2: padding count, 3: repeated orders (the end of the window)
    phase: int
    order: IdArray
    columns: dict[str, IdArray]

    def __len__(self) -> int:
        return len(self.order)

    def head(self, limit: int) -> _Chunk:
        """The chunk, or enough of it to hold its first `limit` findings in observation order."""
        return self


@dataclasses.dataclass
class _MissingChunk:
    """The missing IDs of one window, kept as the sorted distinct universe positions that were observed.

    The missing positions are the gaps: the k-th missing one (from 0) is k + i, i being how many
    observed positions p_j satisfy p_j - j <= k. None is produced until `head(n)` asks for the first n.
    """

    window: int
    seen: IdArray
    universe_size: int
    kind: int = MISSING
    phase: int = 1

    def __len__(self) -> int:
        return self.universe_size - len(self.seen)

    def head(self, limit: int) -> _Chunk:
        wanted = np.arange(min(limit, len(self)), dtype=np.int64)
        below = self.seen - np.arange(len(self.seen), dtype=np.int64)  # how many are missing below each seen one
        missing = wanted + np.searchsorted(below, wanted, side="right")
        return _Chunk(self.kind, self.window, self.phase, missing, {"code": missing})


@dataclasses.dataclass
class Rows:
    """Some findings, in observation order, as columns (see COLUMNS)."""

    kind: IdArray
    window: IdArray
    columns: dict[str, IdArray]


class Findings:
    """The audit's findings. They are kept as the chunks the audit produced; `first(n)` sorts them
    into observation order and gathers columns only for the rows it returns, so that an audit
    with millions of findings and a cap on what is listed does not pay for all of them."""

    def __init__(self, chunks: list[_Chunk | _MissingChunk], notes: list[str]) -> None:
        self._chunks = chunks
        #: diagnoses that concern a whole window (e.g. every rank saw the same stream)
        self.notes = notes

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self._chunks)

    def counts(self) -> dict[str, int]:
        found = dict.fromkeys(KINDS, 0)
        for chunk in self._chunks:
            found[KINDS[chunk.kind]] += len(chunk)
        return {kind: count for kind, count in found.items() if count}

    def first(self, limit: int) -> Rows:
        """The first `limit` findings in observation order."""
        chunks = [chunk.head(limit) for chunk in self._chunks]
        chunks = [chunk for chunk in chunks if len(chunk)]
        if not chunks:
            empty = np.empty(0, dtype=np.int64)
            return Rows(empty, empty, {name: empty for name in COLUMNS})
        sizes = np.array([len(c.order) for c in chunks], dtype=np.int64)
        chunk_of = np.repeat(np.arange(len(chunks)), sizes)
        order = np.concatenate([c.order for c in chunks])
        kind = np.array([c.kind for c in chunks], dtype=np.int64)[chunk_of]
        window = np.array([c.window for c in chunks], dtype=np.int64)[chunk_of]
        phase = np.array([c.phase for c in chunks], dtype=np.int64)[chunk_of]
        span = int(order.max()) + 1
        if (int(window.max()) + 1) * 4 * span * len(KINDS) < _KEY_LIMIT:
            key = ((window * 4 + phase) * span + order) * len(KINDS) + kind
            if limit < len(key):
                rows = np.argpartition(key, limit - 1)[:limit]
                rows = rows[np.argsort(key[rows])]
            else:
                rows = np.argsort(key)
        else:
            rows = np.lexsort((kind, order, phase, window))[:limit]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        columns = {}
        for name in COLUMNS:
            column = np.full(len(rows), -1, dtype=np.int64)
            for c, chunk in enumerate(chunks):
                if name in chunk.columns:
                    mine = chunk_of[rows] == c
                    column[mine] = chunk.columns[name][rows[mine] - starts[c]]
            columns[name] = column
        return Rows(kind[rows], window[rows], columns)


class _Table:
    """Collects the findings of an audit, chunk by chunk."""

    def __init__(self) -> None:
        self.chunks: list[_Chunk | _MissingChunk] = []

    def add(self, kind: int, window: int, phase: int, order: IdArray, **columns: IdArray) -> None:
        if len(order):
            self.chunks.append(_Chunk(kind, window, phase, np.asarray(order, dtype=np.int64),
                                      {name: np.asarray(value, dtype=np.int64) for name, value in columns.items()}))

    def add_chunk(self, chunk: _Chunk | _MissingChunk) -> None:
        if len(chunk):
            self.chunks.append(chunk)


@dataclasses.dataclass
class Codes:
    """Observed IDs as int64 codes: below `universe_size` a universe position, from it up an outside ID."""

    codes: IdArray
    universe_size: int
    #: the sorted distinct IDs outside the universe (all IDs without one); None when coded by offset
    outside: IdArray | None
    #: without a universe and with dense int IDs: code = ID - offset, for IDs spanning `span` values
    offset: int = 0
    span: int = 0

    @property
    def has_outside(self) -> bool:
        """Whether some code may be of an ID outside the universe (none when every observed ID is in it)."""
        return self.outside is None or len(self.outside) > 0

    @property
    def size(self) -> int:
        """How many codes there can be (the length of a per-code count)."""
        return self.span if self.outside is None else self.universe_size + len(self.outside)

    def decode(self, codes: IdArray, universe: Universe | None) -> list[Any]:
        """The IDs of these codes, as Python ints or strings."""
        out = np.empty(len(codes), dtype=object)
        inside = codes < self.universe_size
        if universe is not None and inside.any():
            out[inside] = universe.decode(codes[inside]).tolist()
        rest = ~inside
        if rest.any():
            if self.outside is None:
                out[rest] = (codes[rest] + self.offset).tolist()
            else:
                out[rest] = self.outside[codes[rest] - self.universe_size].tolist()
        decoded: list[Any] = out.tolist()
        return decoded


def encode(observations: Observations, universe: Universe | None) -> Codes:
    """Code the observed IDs; `observations.ids` is consumed (int IDs are overwritten in place)."""
    ids = observations.ids
    if universe is not None and universe.size and len(ids):
        if universe.kind != observations.kind:
            raise TypeError(f"the universe holds {universe.kind} IDs but the observed IDs are "
                            f"{observations.kind}s; declare the universe with the same kind of ID")
        codes, outside, outside_values = universe.encode(ids)
        if len(outside):
            distinct, inverse = np.unique(outside_values, return_inverse=True)
            codes[outside] = universe.size + inverse
            return Codes(codes, universe.size, distinct)
        return Codes(codes, universe.size, ids[:0])
    size = universe.size if universe is not None else 0
    if observations.kind == "int" and len(ids):
        low, high = int(ids.min()), int(ids.max())
        if high - low + 1 <= DENSE_SPAN_FACTOR * len(ids) + _SPAN_SLACK:
            if low:
                ids -= low
            return Codes(ids, 0, None, offset=low, span=high - low + 1)
    distinct, inverse = np.unique(ids, return_inverse=True)
    return Codes(inverse.astype(np.int64, copy=False), size, distinct)


def audit(observations: Observations, plan: Plan) -> tuple[Findings, Codes]:
    """Judge the plan over every window; see the module docstring for the order of the findings."""
    coded = encode(observations, plan.universe)
    table = _Table()
    notes: list[str] = []
    for window in range(len(observations.epochs)):
        _audit_window(observations, coded, plan, window, table, notes)
    if plan.epoch_order:
        _audit_epoch_order(observations, coded.codes, table)
    return Findings(table.chunks, notes), coded


def _order_key(observations: Observations, index: IdArray) -> IdArray:
    """(clock, rank) within a window as one sortable int."""
    segment, position, _, _ = observations.locate(index)
    rank_index = np.searchsorted(observations.ranks, observations.segment_rank[segment])
    key: IdArray = observations.clock(index, position) * len(observations.ranks) + rank_index
    return key


def _audit_window(observations: Observations, coded: Codes, plan: Plan, window: int, table: _Table,
                  notes: list[str]) -> None:
    found_before = len(table.chunks)
    _, _, start, end = observations.window_bounds(window)
    codes = coded.codes[start:end]
    universe_size = coded.universe_size
    if plan.unexpected and len(codes) and coded.has_outside:
        outside = np.flatnonzero(codes >= universe_size) + start
        table.add(UNEXPECTED, window, 0, _order_key(observations, outside), observation=outside,
                  code=coded.codes[outside])
    missing, distinct, repeated = _count(codes, coded.size, universe_size, plan, window)
    if len(repeated):
        index = np.flatnonzero(repeated) + start
        padded = _duplicates(observations, coded, plan, window, index, table)
        if padded and plan.universe_duplicates:
            notes.append(
                f"epoch {observations.epochs[window]}: each repeated sample is the last of its rank's stream, as "
                "when DistributedSampler(drop_last=False) pads the epoch to a multiple of the world size; if that "
                f"is intended, declare it: tp.ExpectedPadding(universe, padding={padded})"
            )
    if plan.missing:
        table.add_chunk(missing)
    if plan.paddings:
        extra = int(np.count_nonzero(codes < universe_size)) - distinct
        for declared in plan.paddings:
            if extra != declared:
                table.add(PADDING, window, 2, np.array([declared]), detail=np.array([declared]),
                          count=np.array([extra]))
    identical = _identical_streams(observations, coded.codes, window) if len(table.chunks) > found_before else []
    if identical:
        notes.append(
            f"epoch {observations.epochs[window]}: ranks {', '.join(map(str, identical))} saw the same samples in "
            "the same order: were their samplers built with the same rank (for example DistributedSampler(rank=0), "
            "or num_replicas/rank left to a process group that was not set up)?"
        )


def _dense_counts(possible: int, observations: int) -> bool:
    """Whether to count a window's codes with a slot per possible code (else np.unique: the sparse path)."""
    return possible <= DENSE_COUNT_FACTOR * observations + _SPAN_SLACK


def _unseen(seen: IdArray) -> IdArray:
    """The positions where `seen` (booleans) is False. Counting first spares the scan for them when there are none
    (a window that covers the universe): `flatnonzero` of a 5 M-position universe took 20 ms, most of a first
    check_coverage's audit."""
    if int(np.count_nonzero(seen)) == len(seen):
        return np.zeros(0, dtype=np.intp)
    return np.flatnonzero(~seen)


def _count(codes: IdArray, possible: int, universe_size: int, plan: Plan,
           window: int) -> tuple[_Chunk | _MissingChunk, int, IdArray]:
    """Count a window's codes: its missing universe positions (a chunk of findings), how many distinct universe
    positions it observed, and which observations are of an ID observed more than once that a duplicate policy
    judges (a boolean per observation; empty when there are none)."""
    none = np.zeros(0, dtype=bool)
    judged = plan.universe_duplicates or plan.cross_rank
    if _dense_counts(possible, len(codes)):
        # One byte per code first: when no code repeats (every passing window), that is all there is to count,
        # at an eighth of bincount's memory traffic.
        seen = np.zeros(possible, dtype=bool)
        seen[codes] = True
        if not judged or int(np.count_nonzero(seen)) == len(codes):
            missing = _unseen(seen[:universe_size])
            return _Chunk(MISSING, window, 1, missing, {"code": missing}), universe_size - len(missing), none
        del seen
        counts = np.bincount(codes, minlength=possible)
        missing = _unseen(counts[:universe_size] > 0)
        found: _Chunk | _MissingChunk = _Chunk(MISSING, window, 1, missing, {"code": missing})
        distinct = universe_size - len(missing)
        if not judged or not len(codes) or int(counts.max()) < 2:
            return found, distinct, none
        repeated_code = counts > 1
        if not plan.cross_rank:
            repeated_code[universe_size:] = False
        repeated: IdArray = repeated_code[codes]
        return found, distinct, repeated if repeated.any() else none
    unique, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
    seen = unique[:int(np.searchsorted(unique, universe_size))]
    found = _MissingChunk(window, seen, universe_size)
    if not judged or not len(codes) or int(counts.max()) < 2:
        return found, len(seen), none
    repeated = (counts > 1)[inverse]
    return found, len(seen), repeated if repeated.any() else none


def _group_first(sorted_keys: list[IdArray]) -> tuple[IdArray, IdArray]:
    """For rows sorted by `sorted_keys`: whether each row starts its group, and the row that does."""
    n = len(sorted_keys[0])
    starts = np.zeros(n, dtype=bool)
    if n:
        starts[0] = True
        for key in sorted_keys:
            starts[1:] |= key[1:] != key[:-1]
    first: IdArray = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    return starts, first


def _duplicates(observations: Observations, coded: Codes, plan: Plan, window: int, index: IdArray,
                table: _Table) -> int | None:
    """Classify the observations of repeated IDs: the first sighting is fine, each later one is a duplicate,
    same-rank when its rank saw the ID before, cross-rank otherwise.

    One sort by (code, rank, clock) groups each ID's observations rank by rank: the first row
    of a (code, rank) group is that rank's first sighting, and the row with the smallest
    (clock, rank) key of a code group is the ID's first sighting.

    Returns how many duplicates there were when each is the last ID of its rank's stream and
    fewer ranks have one than the window has ranks: the shape of DistributedSampler's padding.
    """
    code = coded.codes[index]
    segment, position, _, _ = observations.locate(index)
    position = observations.clock(index, position)  # the order of observations (within a rank, the same)
    ranks = len(observations.ranks)
    rank = np.searchsorted(observations.ranks, observations.segment_rank[segment])
    span = int(position.max()) + 1
    if coded.size * ranks * span < _KEY_LIMIT:
        by = np.argsort((code * ranks + rank) * span + position)
    else:
        by = np.lexsort((position, rank, code))
    code, rank, index = code[by], rank[by], index[by]
    key = position[by] * ranks + rank
    code_starts, _ = _group_first([code])
    group = np.cumsum(code_starts) - 1
    smallest = np.minimum.reduceat(key, np.flatnonzero(code_starts))
    first_sight = key == smallest[group]
    first_seen = np.empty(len(smallest), dtype=np.int64)
    first_seen[group[first_sight]] = index[first_sight]
    new_to_rank, rank_first_row = _group_first([code, rank])
    repeat = ~first_sight
    in_universe = code < coded.universe_size
    if plan.universe_duplicates:
        same = repeat & ~new_to_rank & in_universe
        table.add(SAME_RANK, window, 0, key[same], observation=index[same], code=code[same],
                  reference=index[rank_first_row[same]])
    cross = repeat & new_to_rank
    if not plan.cross_rank:
        cross &= in_universe
    table.add(CROSS_RANK, window, 0, key[cross], observation=index[cross], code=code[cross],
              reference=first_seen[group[cross]])
    duplicates = index[repeat & in_universe]
    segment = np.searchsorted(observations.segment_starts, duplicates, side="right") - 1
    first, end, _, _ = observations.window_bounds(window)
    if len(duplicates) < end - first and bool(np.all(observations.segment_starts[segment + 1] == duplicates + 1)):
        return len(duplicates)
    return None


def _identical_streams(observations: Observations, codes: IdArray, window: int) -> list[int]:
    """The ranks of a window, if there are several and all saw one identical non-empty stream."""
    first, end, _, _ = observations.window_bounds(window)
    starts = observations.segment_starts
    streams = [codes[starts[s]:starts[s + 1]] for s in range(first, end)]
    if len(streams) < 2 or not len(streams[0]) or not all(np.array_equal(streams[0], s) for s in streams[1:]):
        return []
    return [int(r) for r in observations.segment_rank[first:end]]


def _audit_epoch_order(observations: Observations, codes: IdArray, table: _Table) -> None:
    """A rank whose stream (2 IDs or more) equals its stream in an earlier window: one finding per window."""
    starts = observations.segment_starts
    earlier: dict[tuple[int, int, bytes], int] = {}
    for segment in range(len(observations.segment_window)):
        stream = codes[starts[segment]:starts[segment + 1]]
        if len(stream) < 2:
            continue
        rank, window = int(observations.segment_rank[segment]), int(observations.segment_window[segment])
        digest = hashlib.blake2b(stream.tobytes(), digest_size=16).digest()
        seen = earlier.setdefault((rank, len(stream), digest), segment)
        if seen != segment and np.array_equal(codes[starts[seen]:starts[seen + 1]], stream):
            table.add(REPEATED, window, 3, np.array([observations.ranks.index(rank)]),
                      reference=np.array([observations.segment_window[seen]]), detail=np.array([rank]),
                      count=np.array([len(stream)]))
