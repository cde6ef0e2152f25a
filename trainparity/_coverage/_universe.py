"""A declared universe of sample IDs as arrays: observed IDs are encoded as their position in it.

`Universe.build` turns a policy's universe (range, list, set, array, tensor) into the fastest
encoding that fits it: an arithmetic progression, a dense lookup table, or sorted values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from trainparity._batches._sample_ids import IdArray, sample_id_array
from trainparity._validation import InvalidArgument, check_argument

UniverseLike = range | Iterable[int | str] | np.ndarray[Any, Any] | torch.Tensor | None
#: a universe array whose values span at most this many slots per ID is encoded with a lookup table
DENSE_SPAN_FACTOR = 4
#: the most IDs a universe may hold: positions and the codes of outside IDs above them stay in int64
MAX_SIZE = 2**62
_INT64 = np.iinfo(np.int64)


def describe_universe(universe: UniverseLike) -> str:
    if universe is None or isinstance(universe, range):
        return repr(universe)
    size = universe.numel() if isinstance(universe, torch.Tensor) else len(universe)  # type: ignore[arg-type]
    return f"<{size} IDs>"


@dataclasses.dataclass
class Universe:
    """A declared universe as arrays: encodes observed IDs as their position in the universe.

    The position is the ID's index in the declared order (sets are taken in sorted order),
    so that missing IDs are reported in universe order.
    """

    kind: str  # "int" or "str"
    size: int
    description: str
    #: the universe as an arithmetic progression (the fast path), else None
    progression: range | None = None
    #: the declared IDs in universe order, when not a progression
    values: IdArray | None = None
    #: a dense lookup table from `id - lookup_base` to position (-1: not in the universe)
    lookup: IdArray | None = None
    lookup_base: int = 0
    #: the sorted IDs and their positions, for sparse int and for string universes
    sorted_values: IdArray | None = None
    sorted_positions: IdArray | None = None

    @classmethod
    def build(cls, universe: UniverseLike) -> Universe:
        description = describe_universe(universe)
        if isinstance(universe, range):
            size = _range_size(universe)
            ends = (universe[0], universe[-1]) if size else (0, 0)
            check_argument(_INT64.min <= min(ends) <= max(ends) <= _INT64.max,
                           f"the universe {universe} holds IDs beyond int64; sample IDs are int64")
            check_argument(size <= MAX_SIZE,
                           f"the universe {universe} holds {size} IDs; a universe holds at most 2**62 IDs")
            return cls("int", size, description, progression=universe)
        if isinstance(universe, (set, frozenset)):
            universe = sorted(universe)
        values = sample_id_array(universe, "the universe")
        size = len(values)
        if values.dtype.kind == "U":
            return cls._sorted("str", values, description)
        if size == 0:
            return cls("int", 0, description, progression=range(0))
        start = int(values[0])
        step = int(values[1]) - start if size > 1 else 1  # Python ints: IDs may lie 2**63 or more apart
        if step != 0 and (size == 1 or _is_progression(values, step)):
            return cls("int", size, description, progression=range(start, start + step * size, step))
        low, high = int(values.min()), int(values.max())
        if high - low + 1 <= DENSE_SPAN_FACTOR * size:
            lookup = np.full(high - low + 1, -1, dtype=np.int64)
            lookup[values - low] = np.arange(size)
            if int(np.count_nonzero(lookup >= 0)) != size:
                _raise_duplicate(values)
            return cls("int", size, description, values=values, lookup=lookup, lookup_base=low)
        return cls._sorted("int", values, description)

    @classmethod
    def _sorted(cls, kind: str, values: IdArray, description: str) -> Universe:
        positions = np.argsort(values, kind="stable")
        ordered = values[positions]
        if len(ordered) > 1 and bool(np.any(ordered[1:] == ordered[:-1])):
            _raise_duplicate(values)
        return cls(kind, len(values), description, values=values, sorted_values=ordered, sorted_positions=positions)

    def encode(self, ids: IdArray) -> tuple[IdArray, IdArray, IdArray]:
        """Each ID's position in the universe (int64, -1 outside it), where the outside IDs are, and their values.

        Int `ids` of a progression or a dense universe are overwritten with the positions: the
        audit owns that array, and the positions of ten million IDs need no second buffer.
        """
        if self.progression is not None or self.lookup is not None:
            all_inside = self._all_inside(ids)
            outside = np.empty(0, dtype=np.int64) if all_inside else np.flatnonzero(~self._inside(ids))
            outside_values = ids[outside]
            if self.progression is not None:
                # In place, as uint64: an inside ID's offset from the first ID is exact even when the universe
                # spans 2**63 or more; the offsets of outside IDs wrap around and are overwritten below.
                offsets = ids.view(np.uint64)
                if self.progression.step < 0 or self.progression[0]:
                    _progression_offsets(ids, self.progression, out=offsets)
                if abs(self.progression.step) != 1:
                    np.floor_divide(offsets, np.uint64(abs(self.progression.step)), out=offsets)
            else:
                assert self.lookup is not None
                ids -= self.lookup_base
                np.take(self.lookup, ids, out=ids, mode="clip")
            if not all_inside:
                ids[outside] = -1
            return ids, outside, outside_values
        assert self.sorted_values is not None and self.sorted_positions is not None
        if self.size == 0:
            return np.full(len(ids), -1, dtype=np.int64), np.arange(len(ids)), ids
        slot = np.minimum(np.searchsorted(self.sorted_values, ids), self.size - 1)
        found = self.sorted_values[slot] == ids
        outside = np.flatnonzero(~found)
        return np.where(found, self.sorted_positions[slot], -1), outside, ids[outside]

    def _all_inside(self, ids: IdArray) -> bool:
        """Whether every ID is in the universe; for a progression of step 1 or -1, two reductions decide."""
        if self.progression is not None and self.size and abs(self.progression.step) == 1:
            first, last = self.progression[0], self.progression[-1]
            return not len(ids) or (min(first, last) <= int(ids.min()) and int(ids.max()) <= max(first, last))
        return bool(self._inside(ids).all())

    def _inside(self, ids: IdArray) -> IdArray:
        if self.progression is not None:
            if self.size == 0:
                return np.zeros(len(ids), dtype=bool)
            first, last = self.progression[0], self.progression[-1]
            inside: IdArray = (ids >= min(first, last)) & (ids <= max(first, last))
            if self.progression.step not in (1, -1):
                offsets = _progression_offsets(ids, self.progression, out=np.empty(len(ids), dtype=np.uint64))
                inside &= offsets % np.uint64(abs(self.progression.step)) == 0
            return inside
        assert self.lookup is not None
        inside = (ids >= self.lookup_base) & (ids <= self.lookup_base + len(self.lookup) - 1)
        inside[inside] = self.lookup[ids[inside] - self.lookup_base] >= 0
        return inside

    def decode(self, positions: IdArray) -> IdArray:
        """The IDs at these universe positions."""
        if self.progression is not None:
            # start + position * step modulo 2**64: exact, since the ID it gives lies in int64
            ids = positions.astype(np.uint64) * np.uint64(self.progression.step % 2**64)
            ids += np.uint64(self.progression.start % 2**64)
            return ids.view(np.int64)
        assert self.values is not None
        return self.values[positions]

    def same_as(self, other: Universe) -> bool:
        if self.kind != other.kind or self.size != other.size:
            return False
        if self.progression is not None and other.progression is not None:
            return self.progression == other.progression
        return bool(np.array_equal(self.decode(np.arange(self.size)), other.decode(np.arange(other.size))))


def _range_size(universe: range) -> int:
    """len(universe), also for a range of more than sys.maxsize IDs (len() raises OverflowError there)."""
    if universe.step > 0:
        return max(0, (universe.stop - universe.start + universe.step - 1) // universe.step)
    return max(0, (universe.start - universe.stop - universe.step - 1) // -universe.step)


def _is_progression(values: IdArray, step: int) -> bool:
    """Whether int64 `values` step by `step` (a Python int, possibly 2**63 or more in size) from one to the next.

    Differences are taken as uint64, which wraps modulo 2**64: with the order checked, a wrapped
    difference equal to |step| is exactly |step|.
    """
    before, after = values[:-1].view(np.uint64), values[1:].view(np.uint64)
    if step > 0:
        return bool(np.all(values[1:] > values[:-1])) and bool(np.all(after - before == np.uint64(step)))
    return bool(np.all(values[1:] < values[:-1])) and bool(np.all(before - after == np.uint64(-step)))


def _progression_offsets(ids: IdArray, progression: range, *, out: IdArray) -> IdArray:
    """|id - first ID| of a progression as uint64 into `out` (which may be `ids` viewed as uint64)."""
    first = np.uint64(progression[0] % 2**64)
    if progression.step > 0:
        return np.subtract(ids.view(np.uint64), first, out=out)
    return np.subtract(first, ids.view(np.uint64), out=out)


def _raise_duplicate(values: IdArray) -> None:
    unique, counts = np.unique(values, return_counts=True)
    raise InvalidArgument(f"the universe lists ID {unique[counts > 1][0].item()!r} more than once; "
                          "a universe is a set of distinct IDs")
