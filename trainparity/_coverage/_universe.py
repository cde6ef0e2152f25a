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

from trainparity._sample_ids import IdArray, sample_id_array

UniverseLike = range | Iterable[int | str] | np.ndarray[Any, Any] | torch.Tensor | None
#: a universe array whose values span at most this many slots per ID is encoded with a lookup table
DENSE_SPAN_FACTOR = 4
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
            ends = (universe[0], universe[-1]) if universe else (0, 0)
            if not _INT64.min <= min(ends) <= max(ends) <= _INT64.max:
                raise ValueError(f"the universe {universe} holds IDs beyond int64; sample IDs are int64")
            return cls("int", len(universe), description, progression=universe)
        if isinstance(universe, (set, frozenset)):
            universe = sorted(universe)
        values = sample_id_array(universe, "the universe")
        size = len(values)
        if values.dtype.kind == "U":
            return cls._sorted("str", values, description)
        if size == 0:
            return cls("int", 0, description, progression=range(0))
        step = int(values[1] - values[0]) if size > 1 else 1
        if step != 0 and (size == 1 or bool(np.all(np.diff(values) == step))):
            start = int(values[0])
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
            inside = self._inside(ids)
            all_inside = bool(inside.all())
            outside = np.flatnonzero(~inside) if not all_inside else np.empty(0, dtype=np.int64)
            outside_values = ids[outside]
            if self.progression is not None:
                if self.progression.start:
                    ids -= self.progression.start
                if self.progression.step != 1:
                    ids //= self.progression.step
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

    def _inside(self, ids: IdArray) -> IdArray:
        if self.progression is not None:
            if self.size == 0:
                return np.zeros(len(ids), dtype=bool)
            first, last = self.progression[0], self.progression[-1]
            inside: IdArray = (ids >= min(first, last)) & (ids <= max(first, last))
            if self.progression.step not in (1, -1):
                inside &= (ids - first) % self.progression.step == 0
            return inside
        assert self.lookup is not None
        inside = (ids >= self.lookup_base) & (ids < self.lookup_base + len(self.lookup))
        inside[inside] = self.lookup[ids[inside] - self.lookup_base] >= 0
        return inside

    def decode(self, positions: IdArray) -> IdArray:
        """The IDs at these universe positions."""
        if self.progression is not None:
            return self.progression.start + positions.astype(np.int64) * self.progression.step
        assert self.values is not None
        return self.values[positions]

    def same_as(self, other: Universe) -> bool:
        if self.kind != other.kind or self.size != other.size:
            return False
        if self.progression is not None and other.progression is not None:
            return self.progression == other.progression
        return bool(np.array_equal(self.decode(np.arange(self.size)), other.decode(np.arange(other.size))))


def _raise_duplicate(values: IdArray) -> None:
    unique, counts = np.unique(values, return_counts=True)
    raise ValueError(f"the universe lists ID {unique[counts > 1][0].item()!r} more than once; "
                     "a universe is a set of distinct IDs")
