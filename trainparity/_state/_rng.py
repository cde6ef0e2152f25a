"""The global RNG streams a run draws from: seeding them, capturing them as tensors, restoring them; and the one
digest of a random stream's state (a global stream, or a generator object a dataset holds).

Streams are captured as int64/uint8 tensors (safe for `torch.load(weights_only=True)` and the wire):
torch's CPU generator, numpy's legacy global RNG (with its cached Gaussian), Python's `random`, and
CUDA's generators once CUDA is initialized.
"""

from __future__ import annotations

import array
import hashlib
import random
import struct
from typing import Any

import numpy as np
import torch

#: seeds torch, numpy (modulo 2**32) and Python's random all accept
SEED_LIMIT = 2**63


def seed_everything(seed: int) -> None:
    """Seed every global stream the harness tracks (torch, numpy, python, an accelerator's)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # A build without an accelerator has only the CPU generator to seed: torch.manual_seed would queue the seeding of
    # each absent accelerator as well (0.1 ms, each formatting a stack). The build is asked, not the device:
    # `is_available()` would initialize CUDA's driver, after which a fork is unsafe.
    if torch.accelerator.current_accelerator() is None:
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


#: a random stream's state digested: 16 bytes of BLAKE2b over its exact bytes, equal in any process for equal
#: states (no `hash()`, which is salted per interpreter)
StreamDigest = bytes


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


def stream_digest(kind: str, stream: Any) -> StreamDigest:
    """The digest of a stream's state (`kind` as `stream_kind` names it)."""
    hasher = hashlib.blake2b(digest_size=16)
    state = stream_state(kind, stream)
    if kind == "torch.Generator":
        hasher.update(state.numpy().tobytes())
    elif kind == "random.Random":  # (version, 625 words, gauss_next); the words as one array, not 625 reprs
        version, words, gauss = state
        hasher.update(np.fromiter(words, dtype=np.uint64, count=len(words)).tobytes())
        _feed(hasher, (version, gauss))
    else:
        _feed(hasher, state)
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


def stream_state(kind: str, stream: Any) -> Any:
    """A stream's exact state, in the form its kind sets back (`set_stream_state`): a tensor, a dict, a tuple."""
    if kind == "torch.Generator":
        return stream.get_state()
    if kind == "numpy.random.Generator":
        return stream.bit_generator.state
    if kind == "numpy.random.RandomState":
        return stream.get_state(legacy=False)
    return stream.getstate()


def set_stream_state(kind: str, stream: Any, state: Any) -> None:
    """Set a stream to a state `stream_state` took, in place (references held elsewhere stay valid)."""
    if kind == "torch.Generator":
        stream.set_state(state)
    elif kind == "numpy.random.Generator":
        stream.bit_generator.state = state
    elif kind == "numpy.random.RandomState":
        stream.set_state(state)
    else:
        stream.setstate(state)


#: the global streams' objects and kinds: each module's functions are its global stream's methods
_GLOBALS = {"rng.torch": ("torch.Generator", torch.default_generator),
            "rng.numpy": ("numpy.random.RandomState", np.random), "rng.python": ("random.Random", random)}


def global_states() -> dict[str, StreamDigest]:
    """This process's global streams."""
    return {path: stream_digest(kind, stream) for path, (kind, stream) in _GLOBALS.items()}


def rng_fingerprint() -> str:
    """A digest of the global RNG streams as they are now (torch's, numpy's and Python's, and CUDA's once
    initialized): equal digests, equal streams. Cheaper than `capture_rng` and `global_states` (each state's bytes
    hashed as they come, no canonical form), for telling whether something drew between two moments."""
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(torch.default_generator.get_state().numpy().tobytes())
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple), "numpy's global stream is an MT19937, whose legacy state is a tuple"
    _, key, position, has_gauss, gauss = legacy
    hasher.update(key.tobytes())
    hasher.update(struct.pack("<qqd", position, has_gauss, gauss))
    version, words, gauss_next = random.getstate()
    hasher.update(array.array("Q", words).tobytes())
    hasher.update(repr((version, gauss_next)).encode())
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for cuda_state in torch.cuda.get_rng_state_all():
            hasher.update(cuda_state.numpy().tobytes())
    return hasher.hexdigest()


def torch_rng_states() -> list[torch.Tensor]:
    """torch's own streams as they are now (the CPU generator's, and CUDA's once initialized): what dropout and
    the other random operators of a forward pass draw from."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states += torch.cuda.get_rng_state_all()
    return states


def _float_bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _bits_float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", bits))[0])


def capture_rng() -> dict[str, torch.Tensor]:
    """The global RNG streams as int64/uint8 tensors (safe for `torch.load(weights_only=True)`)."""
    streams: dict[str, torch.Tensor] = {"torch": torch.get_rng_state()}
    numpy_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    _, keys, pos, has_gauss, cached = numpy_state
    streams["numpy"] = torch.tensor([*keys.tolist(), pos, has_gauss, _float_bits(cached)], dtype=torch.int64)
    version, internal, gauss_next = random.getstate()
    extra = [0, 0] if gauss_next is None else [1, _float_bits(gauss_next)]
    streams["python"] = torch.tensor([version, *internal, *extra], dtype=torch.int64)
    # is_initialized() first: is_available() would initialize the driver, and a process that has
    # (the fork server) cannot fork children that use CUDA.
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        streams["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return streams


def restore_rng(streams: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(streams["torch"])
    values = streams["numpy"].tolist()
    keys = np.array(values[:624], dtype=np.uint32)
    np.random.set_state(("MT19937", keys, values[624], values[625], _bits_float(values[626])))
    values = streams["python"].tolist()
    gauss = None if values[-2] == 0 else _bits_float(values[-1])
    random.setstate((values[0], tuple(values[1:-2]), gauss))
    if "cuda" in streams:
        torch.cuda.set_rng_state_all(list(streams["cuda"]))
