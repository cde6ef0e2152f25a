"""The random streams a DataLoader worker may consume, and a digest of each one's state.

The streams are torch's global generator (`rng.torch`), numpy's global RNG (`rng.numpy`), Python's `random`
(`rng.python`), and every `np.random.Generator`, `np.random.RandomState`, `torch.Generator` and `random.Random`
reachable from a root object's attributes (the dataset's: `dataset.transform.rng`), found by a bounded walk of
its attributes, containers and submodules. A digest is 16 bytes of BLAKE2b over the state's exact bytes: equal
digests mean equal states, in any process (no `hash()`, which is salted per interpreter).
"""

from __future__ import annotations

import collections
import hashlib
import random
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

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

Digest = bytes


def _feed(hasher: Any, value: Any) -> None:
    """The exact state in a canonical byte form (dict keys sorted, arrays by dtype, shape and bytes)."""
    if isinstance(value, dict):
        hasher.update(b"{")
        for key in sorted(value, key=str):
            _feed(hasher, str(key))
            _feed(hasher, value[key])
        hasher.update(b"}")
    elif isinstance(value, (list, tuple)):
        hasher.update(b"[%d" % len(value))
        for item in value:
            _feed(hasher, item)
    elif isinstance(value, np.ndarray):
        hasher.update(f"a{value.dtype.str}{value.shape}".encode())
        hasher.update(np.ascontiguousarray(value).tobytes())
    else:
        hasher.update(f"{type(value).__name__}:{value!r};".encode())


def digest(kind: str, stream: Any) -> Digest:
    """The digest of a stream's state (`kind` as `stream_kind` names it)."""
    hasher = hashlib.blake2b(digest_size=16)
    if kind == "torch.Generator":
        hasher.update(stream.get_state().numpy().tobytes())
    elif kind == "numpy.random.Generator":
        _feed(hasher, stream.bit_generator.state)
    elif kind == "numpy.random.RandomState":
        _feed(hasher, stream.get_state(legacy=False))
    else:  # random.Random: (version, 625 words, gauss_next); the words as one array, not 625 reprs
        version, words, gauss = stream.getstate()
        hasher.update(np.fromiter(words, dtype=np.uint64, count=len(words)).tobytes())
        _feed(hasher, (version, gauss))
    return hasher.digest()


def stream_kind(value: Any) -> str | None:
    """What kind of random stream `value` is, or None."""
    if isinstance(value, torch.Generator):
        return "torch.Generator"
    if isinstance(value, np.random.Generator):
        return "numpy.random.Generator"
    if isinstance(value, np.random.RandomState):
        return "numpy.random.RandomState"
    if isinstance(value, random.Random) and not isinstance(value, random.SystemRandom):
        return "random.Random"
    return None


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


def reachable_streams(root: Any, name: str) -> Iterator[tuple[str, str, Any]]:
    """(path, kind, stream) of the random streams reachable from `root`, each once, by its shortest path."""
    seen = {id(root)}
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


#: the global streams' objects and kinds: each module's functions are its global stream's methods
_GLOBALS = {"rng.torch": ("torch.Generator", torch.default_generator),
            "rng.numpy": ("numpy.random.RandomState", np.random), "rng.python": ("random.Random", random)}


def global_states() -> dict[str, Digest]:
    """This process's global streams."""
    return {path: digest(kind, stream) for path, (kind, stream) in _GLOBALS.items()}


def snapshot(roots: list[tuple[str, Any]], *, globals_too: bool = True) -> tuple[dict[str, Digest], dict[str, str]]:
    """The digests of the global streams (`globals_too`) and of those reachable from `roots`, by path, with the
    kind of each object stream."""
    states = global_states() if globals_too else {}
    kinds: dict[str, str] = {}
    for name, root in roots:
        for path, kind, stream in reachable_streams(root, name):
            if path not in states:
                states[path], kinds[path] = digest(kind, stream), kind
    return states, kinds
