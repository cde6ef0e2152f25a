"""The global RNG streams a run draws from: seeding them, capturing them as tensors, restoring them.

Streams are captured as int64/uint8 tensors (safe for `torch.load(weights_only=True)` and the wire):
torch's CPU generator, numpy's legacy global RNG (with its cached Gaussian), Python's `random`, and
CUDA's generators once CUDA is initialized.
"""

from __future__ import annotations

import hashlib
import random
import struct
from typing import Any

import numpy as np
import torch

#: seeds torch, numpy (modulo 2**32) and Python's random all accept
SEED_LIMIT = 2**63


def validate_seed(seed: object) -> int:
    """The `seed=` of a check, refused at the call rather than blamed on the recipe in a child."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed= must be an int, got {type(seed).__name__}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed= must be in [0, 2**63), got {seed}")
    return seed


def seed_everything(seed: int) -> None:
    """Seed every global stream the harness tracks (torch, numpy, python, cuda)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_fingerprint() -> str:
    """A digest of the global RNG streams as they are now: equal digests, equal streams.

    Cheaper than `capture_rng` (no conversion), for telling whether something drew between two moments.
    """
    digest = hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=16)
    numpy_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    _, keys, pos, has_gauss, cached = numpy_state
    digest.update(keys.tobytes())
    digest.update(repr((pos, has_gauss, cached, random.getstate())).encode())
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for state in torch.cuda.get_rng_state_all():
            digest.update(state.numpy().tobytes())
    return digest.hexdigest()


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
