"""The random streams a DataLoader worker may consume, found, and digested as `_state/_rng` digests a stream.

The streams are torch's global generator (`rng.torch`), numpy's global RNG (`rng.numpy`), Python's `random`
(`rng.python`), and every `np.random.Generator`, `np.random.RandomState`, `torch.Generator` and `random.Random`
reachable from a root object's attributes (the dataset's: `dataset.transform.rng`), found by a bounded walk of
its attributes, containers and submodules.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from trainparity._state._rng import StreamDigest, global_states, stream_digest, stream_kind

#: the global streams, by path, with the words reports use for them
GLOBAL_STREAMS = {"rng.torch": "torch's global generator", "rng.numpy": "numpy's global RNG",
                  "rng.python": "Python's random module"}
#: how far the walk goes: attribute depth, items of one container, objects in all
MAX_DEPTH, MAX_ITEMS, MAX_OBJECTS = 6, 256, 5000
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.Tensor, np.ndarray, np.generic,
           torch.dtype, torch.device, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
           types.MethodType)
#: what every nn.Module holds itself (hooks, parameters...): not the user's attributes
_MODULE_INTERNALS = frozenset(vars(nn.Module())) - {"training"}

def _children(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        if len(value) <= MAX_ITEMS:
            yield from ((str(k), v) for k, v in value.items() if isinstance(k, (str, int)))
    elif isinstance(value, (list, tuple)):
        if len(value) <= MAX_ITEMS:
            yield from ((str(i), v) for i, v in enumerate(value))
    elif isinstance(value, nn.Module):
        yield from ((k, v) for k, v in vars(value).items() if k not in _MODULE_INTERNALS)
        yield from value._modules.items()
    elif not isinstance(value, _LEAVES):
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict) and len(attributes) <= MAX_ITEMS:
            yield from ((k, v) for k, v in attributes.items() if not k.startswith("__"))


def reachable_streams(root: Any, name: str, seen: set[int]) -> Iterator[tuple[str, str, Any]]:
    """(path, kind, stream) of the random streams reachable from `root`, each once, by its shortest path; objects
    in `seen` (walked from an earlier root) are not walked again, and those walked here are added to it."""
    if id(root) in seen:
        return
    seen.add(id(root))
    queue = collections.deque([(name, root, 0)])
    visited = 0
    while queue and visited < MAX_OBJECTS:
        path, value, depth = queue.popleft()
        visited += 1
        kind = stream_kind(value)
        if kind is not None:
            yield path, kind, value
            continue
        if depth == MAX_DEPTH:
            continue
        for key, child in _children(value):
            if id(child) not in seen and not isinstance(child, _LEAVES):
                seen.add(id(child))
                queue.append((f"{path}.{key}", child, depth + 1))


def snapshot(roots: list[tuple[str, Any]], *,
             globals_too: bool = True) -> tuple[dict[str, StreamDigest], dict[str, str]]:
    """The digests of the global streams (`globals_too`) and of those reachable from `roots`, by path, with the
    kind of each object stream. The roots share one walk: what an earlier root reached is neither walked nor
    recorded again (`dataset.transform.rng`, not also `collate_fn.__self__.rng`)."""
    states = global_states() if globals_too else {}
    kinds: dict[str, str] = {}
    seen: set[int] = set()
    for name, root in roots:
        for path, kind, stream in reachable_streams(root, name, seen):
            if path not in states:
                states[path], kinds[path] = stream_digest(kind, stream), kind
    return states, kinds
