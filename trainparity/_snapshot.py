"""Snapshots: a State (and the RNG streams) flattened into `{dotted path: leaf}`.

Leaves are detached CPU tensors and Python scalars/strings, so a snapshot can be written
by a child with `torch.save` and read by the parent with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainparity._compare import Leaf, Snapshot
from trainparity._state import State, capture_rng, entry_components, parameter_names


def flatten(path: str, value: Any, out: Snapshot) -> None:
    """Add `value` under `path`: containers become dotted sub-paths, leaves are copied."""
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{path}.{key}", item, out)
    elif isinstance(value, (list, tuple)):
        if all(isinstance(v, (bool, int, float)) for v in value) and value:
            out[path] = torch.tensor(value, dtype=torch.float64 if any(isinstance(v, float) for v in value)
                                     else torch.int64)
        else:
            for index, item in enumerate(value):
                flatten(f"{path}.{index}", item, out)
    else:
        out[path] = to_leaf(value)


def to_leaf(value: Any) -> Leaf:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
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


def snapshot_state(state: State) -> Snapshot:
    """Every State entry flattened by path."""
    names = parameter_names(state)
    out: Snapshot = {}
    for name in state:
        for path, value in entry_components(name, state[name], names):
            flatten(path, value, out)
    return out
