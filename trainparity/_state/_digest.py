"""Digests: what a child ships instead of a large tensor's values.

A resume check compares every step of four runs. Shipping each step's State in full costs the
model's size per step in the child (a copy), on the wire and in the parent; a digest costs one
pass over the bytes in the child and 16 bytes everywhere else. The values of differing leaves
are fetched afterwards for the few the report shows (see `_resume`).

The digest is a BLAKE2b hash of the tensor's bytes, its dtype and its shape: two tensors have
equal digests exactly when they are bitwise equal, up to the collision chance of a 128-bit
cryptographic hash (no change of the bytes, however structured, is more likely to escape it
than any other). The round-3 digest hashed sums of 64-bit words instead: a linear map, so a
negated float64 tensor or four changes at a rectangle's corners kept their digest.

Large tensors are hashed in fixed chunks of `_CHUNK_BYTES` on several threads (hashlib releases
the GIL while it hashes), and the chunks' hashes are hashed in order: the chunking is fixed, so
the digest does not depend on the thread count, the machine or the instruction set.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

#: tensors of more bytes than this are digested where digests are asked for; smaller ones travel whole
DIGEST_ABOVE_BYTES = 64 * 1024
_CHUNK_BYTES = 1 << 20
#: below this many chunks, one thread hashes them all (starting threads costs more than it saves)
_THREADED_FROM_CHUNKS = 8
_MAX_THREADS = 8


@dataclasses.dataclass(frozen=True)
class Digest:
    """A tensor known by its dtype, shape and a hash of its bytes."""

    dtype: str
    shape: tuple[int, ...]
    hash: str


def _hash_chunk(chunk: np.ndarray[Any, np.dtype[np.uint8]]) -> bytes:
    return hashlib.blake2b(chunk.data, digest_size=16).digest()


def _threads() -> int:
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        available = os.cpu_count() or 1
    return max(1, min(available, _MAX_THREADS))


def digest(tensor: torch.Tensor) -> Digest:
    """The digest of a dense tensor's values (`_tensors.readable`), read in place: no copy of a contiguous CPU
    tensor. Any dtype: its bytes are hashed."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    raw = flat.view(torch.uint8).numpy()
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    chunks = [raw[start:start + _CHUNK_BYTES] for start in range(0, raw.size, _CHUNK_BYTES)]
    threads = min(_threads(), len(chunks))
    if len(chunks) < _THREADED_FROM_CHUNKS or threads == 1:
        hashes = [_hash_chunk(chunk) for chunk in chunks]
    else:
        # a pool per call: one kept across calls would not survive the fork of a child that inherits it
        with ThreadPoolExecutor(threads, thread_name_prefix="trainparity-digest") as pool:
            hashes = list(pool.map(_hash_chunk, chunks))
    for chunk_hash in hashes:
        hasher.update(chunk_hash)
    return Digest(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), hasher.hexdigest())
