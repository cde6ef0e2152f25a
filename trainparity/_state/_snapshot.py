"""Snapshots: a State (and the RNG streams) flattened into `{dotted path: leaf}`.

Leaves are detached CPU tensors and Python scalars/strings, so a snapshot can be written
by a child with `torch.save` and read by the parent with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from trainparity._state._compare import Leaf, Snapshot
from trainparity._state._digest import DIGEST_ABOVE_BYTES, digest, digestible, gathered
from trainparity._state._entries import State, entry_components, parameter_names
from trainparity._state._rng import capture_rng


@dataclasses.dataclass(frozen=True)
class Digesting:
    """Which tensors a snapshot keeps as digests: those of more than `above` bytes, but the `full` paths."""

    above: int = DIGEST_ABOVE_BYTES
    full: frozenset[str] = frozenset()

    @classmethod
    def at(cls, whole: Iterable[tuple[int, Iterable[str]]], step: int) -> Digesting:
        """Digesting for the snapshot of `step` (0: at the load and the save), with the paths `whole`
        lists for that step shipped whole."""
        return cls(full=frozenset(next((paths for at, paths in whole if at == step), ())))

    def applies(self, path: str, value: torch.Tensor) -> bool:
        return value.nbytes > self.above and path not in self.full and digestible(value)


def state_entry(path: str) -> str:
    """The State entry a snapshot path is under (its first component)."""
    return path.split(".", 1)[0]


def flatten(path: str, value: Any, out: Snapshot, digesting: Digesting | None = None) -> None:
    """Add `value` under `path`: containers become dotted sub-paths, leaves are copied (or digested)."""
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{path}.{key}", item, out, digesting)
    elif isinstance(value, (list, tuple)):
        if all(isinstance(v, (bool, int, float)) for v in value) and value:
            out[path] = torch.tensor(value, dtype=torch.float64 if any(isinstance(v, float) for v in value)
                                     else torch.int64)
        else:
            for index, item in enumerate(value):
                flatten(f"{path}.{index}", item, out, digesting)
    elif isinstance(value, torch.Tensor) and digesting is not None and digesting.applies(path, value):
        out[path] = digest(value)
    else:
        out[path] = to_leaf(value)


def to_leaf(value: Any) -> Leaf:
    if isinstance(value, torch.Tensor):
        return gathered(value).detach().to("cpu", copy=True)
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, np.generic):
        item: Leaf = value.item()
        return item
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    # Unknown objects inside a state_dict: keep their type only (a repr could hold an address).
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def snapshot_rng() -> Snapshot:
    return {f"rng.{stream}": state for stream, state in capture_rng().items()}


def snapshot_state(state: State, digesting: Digesting | None = None) -> Snapshot:
    """Every State entry flattened by path; large tensors as digests where `digesting` says so."""
    names = parameter_names(state)
    out: Snapshot = {}
    for name in state:
        for path, value in entry_components(name, state[name], names):
            flatten(path, value, out, digesting)
    return out
