"""Snapshots: a State (and the RNG streams) flattened into `{dotted path: leaf}`.

Leaves are detached CPU tensors and Python scalars/strings, so a snapshot can be written
by a child with `torch.save` and read by the parent with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from trainparity._state._compare import EMPTY_DICT, EMPTY_SEQUENCE, Comparison, Leaf, Snapshot, tensors_agree
from trainparity._state._containers import (
    TYPE_COMPONENT,
    canonical_text,
    container_kind,
    dataclass_fields,
    is_container,
    is_dataclass_instance,
    is_namedtuple,
    set_items,
)
from trainparity._state._digest import DIGEST_ABOVE_BYTES, digest
from trainparity._state._entries import State, entry_components, is_leaf, parameter_names
from trainparity._state._rng import capture_rng, stream_digest, stream_kind
from trainparity._state._tensors import copied_to_cpu, leaf, readable

#: bytes of small tensors a step's snapshot keeps whole where the rest travel as digests (`Digesting.at`): the
#: report shows their values without training the runs again, and the parent holds at most this much per step
STEP_WHOLE_BYTES = 256 * 1024


@dataclasses.dataclass
class Digesting:
    """Which tensors one snapshot keeps as digests: those of more than `above` bytes, but the `full` paths; where
    `budget` is set, also those that would take the bytes kept whole (in the walk's order) past it."""

    above: int = DIGEST_ABOVE_BYTES
    full: frozenset[str] = frozenset()
    budget: int | None = None

    @classmethod
    def at(cls, whole: Iterable[tuple[int, Iterable[str]]], step: int, every_step: bool = False) -> Digesting:
        """Digesting for the snapshot of `step` (0: at the load and the save), with the paths `whole`
        lists for that step shipped whole. `every_step`: a step's snapshot (not the load's or the save's)
        keeps at most `STEP_WHOLE_BYTES` whole, so that what the parent holds per step stays small (the check
        fetches the values of digested tensors its report shows)."""
        full = frozenset(next((paths for at, paths in whole if at == step), ()))
        return cls(full=full, budget=STEP_WHOLE_BYTES if every_step and step > 0 else None)

    def applies(self, path: str, value: torch.Tensor) -> bool:
        if path in self.full:
            return False
        if value.nbytes > self.above or (self.budget is not None and value.nbytes > self.budget):
            return True
        if self.budget is not None:
            self.budget -= value.nbytes
        return False


@dataclasses.dataclass(frozen=True)
class Sharing:
    """A snapshot already taken whose tensors another snapshot may hold instead of copies.

    A run compared with one that ran before it in this process (the accumulation check's candidate with its
    reference) keeps, where its live tensor agrees with the earlier snapshot's under the check's comparison,
    the earlier tensor itself: the judge finds the two identical, and the run copies (and the process pages in)
    only what differs.
    """

    expected: Mapping[str, Leaf]
    comparison: Comparison

    def leaf(self, path: str, tensor: torch.Tensor) -> torch.Tensor | None:
        known = self.expected.get(path)
        if isinstance(known, torch.Tensor) and tensor.device.type == "cpu" and (
                tensors_agree(known, tensor, self.comparison)):
            return known
        return None


def state_entry(path: str) -> str:
    """The State entry a snapshot path is under (its first component)."""
    return path.split(".", 1)[0]


def key_text(key: object) -> str:
    """A container key as a path component: strings as they are, other keys by their repr (`1`, `(0, 'q')`)
    unless it holds an address, which would differ between runs (then the key's type)."""
    if isinstance(key, str):
        return key
    text = repr(key)
    return text if " at 0x" not in text else f"<{type(key).__qualname__}>"


def _keyed_items(value: dict[Any, Any]) -> list[tuple[str, Any]]:
    """A dict's items by path component; keys that read alike (`1` and `'1'`) are told apart by their repr."""
    texts = [key_text(key) for key in value]
    clashing = {text for text in texts if texts.count(text) > 1}
    return [(repr(key) if text in clashing else text, item) for text, (key, item) in zip(texts, value.items(),
                                                                                          strict=True)]


def flatten(path: str, value: Any, out: Snapshot, digesting: Digesting | None = None,
            sharing: Sharing | None = None) -> None:
    """Add `value` under `path`: containers become dotted sub-paths, leaves are copied (or digested, or shared)."""
    _flatten(path, value, out, digesting, {}, sharing)


def _flatten(path: str, value: Any, out: Snapshot, digesting: Digesting | None, enclosing: dict[int, str],
             sharing: Sharing | None) -> None:
    if isinstance(value, (torch.Tensor, np.ndarray)):  # first: most leaves are tensors
        values = readable(value) if isinstance(value, torch.Tensor) else _array_values(value)
        shared = sharing.leaf(path, values) if sharing is not None and isinstance(values, torch.Tensor) else None
        if isinstance(values, list):  # a nested tensor's components, an array of strings or objects
            _flatten(path, values, out, digesting, enclosing, sharing)
        elif isinstance(values, str):
            out[path] = values
        elif shared is not None:
            out[path] = shared
        elif digesting is not None and digesting.applies(path, values):
            out[path] = digest(values)
        else:
            out[path] = copied_to_cpu(values)
    elif is_container(value):
        if id(value) in enclosing:  # a container holding itself: the back-reference is the leaf
            out[path] = f"<the container at {enclosing[id(value)]}>"
            return
        kind = container_kind(value)
        if kind is not None:
            out[f"{path}.{TYPE_COMPONENT}"] = kind
        numbers = _number_tensor(value)
        if numbers is not None:
            _flatten(path, numbers, out, digesting, enclosing, sharing)
            return
        items = _container_items(value)
        if not items:  # an empty container is a value too: None, {} and a missing entry differ
            out[path] = EMPTY_DICT if isinstance(value, dict) or is_dataclass_instance(value) else EMPTY_SEQUENCE
            return
        enclosing[id(value)] = path
        for key, item in items:
            _flatten(f"{path}.{key}", item, out, digesting, enclosing, sharing)
        del enclosing[id(value)]
    else:
        out[path] = to_leaf(value)


def _container_items(value: Any) -> list[tuple[str, Any]]:
    """A container's items by path component: keys, indices, field names; a set's items by their text."""
    if isinstance(value, dict):
        return _keyed_items(value)
    if is_namedtuple(value):
        return list(zip(type(value)._fields, value, strict=True))
    if is_dataclass_instance(value):
        return dataclass_fields(value)
    if isinstance(value, (set, frozenset)):
        return [(canonical_text(item), item if is_leaf(item) or is_dataclass_instance(item) else canonical_text(item))
                for item in set_items(value)]
    return [(str(i), v) for i, v in enumerate(value)]


def _number_tensor(value: Any) -> torch.Tensor | None:
    """A non-empty list, tuple, deque or set of numbers as one tensor leaf (float64 if any is a float, else
    int64; a set's in order); None for other containers, and for integers beyond int64, which stay Python ints
    element by element."""
    if not isinstance(value, (list, tuple, collections.deque, set, frozenset)) or is_namedtuple(value):
        return None
    if not value or not all(isinstance(v, (bool, int, float)) for v in value):
        return None
    if isinstance(value, (set, frozenset)):
        value = set_items(value)
    try:
        dtype = torch.float64 if any(isinstance(v, float) for v in value) else torch.int64
        return torch.tensor(list(value), dtype=dtype)
    except (RuntimeError, OverflowError, ValueError):  # 'Overflow when unpacking long long'
        return None


def _array_values(array: np.ndarray[Any, Any]) -> torch.Tensor | list[Any]:
    """An array's values as a tensor (a copy: the array may change); one of a dtype torch lacks (strings,
    objects, float128) as a list of its items."""
    try:
        return torch.from_numpy(np.array(array, dtype=array.dtype.newbyteorder("="), copy=True))
    except TypeError:
        items: list[Any] = array.tolist()
        return items


def to_leaf(value: Any) -> Leaf:
    """One value that is no container as a snapshot leaf: a tensor's values copied to the CPU (or a note, see
    `_tensors.leaf`), a generator's state, a scalar; an unknown object by its type alone."""
    if isinstance(value, torch.Tensor):
        return leaf(value)
    if isinstance(value, torch.Generator):
        return value.get_state()
    kind = stream_kind(value)
    if kind is not None:  # numpy's and Python's: their exact state as one digest
        return f"<{kind} state {stream_digest(kind, value).hex()}>"
    if isinstance(value, np.generic) and not isinstance(value, (np.void, np.object_)):
        item: Leaf = value.item()
        return item
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    # Unknown objects inside a state_dict: keep their type only (a repr could hold an address).
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def snapshot_rng(digesting: Digesting | None = None) -> Snapshot:
    """The global RNG streams' states by path (`rng.torch`), digested where `digesting` says so."""
    out: Snapshot = {}
    for stream, state in capture_rng().items():
        path = f"rng.{stream}"
        out[path] = digest(state) if digesting is not None and digesting.applies(path, state) else state
    return out


def snapshot_state(state: State, digesting: Digesting | None = None) -> Snapshot:
    """Every State entry flattened by path; large tensors as digests where `digesting` says so."""
    names = parameter_names(state)
    out: Snapshot = {}
    for name in state:
        for path, value in entry_components(name, state[name], names):
            flatten(path, value, out, digesting)
    return out
