"""Digests: what a child ships instead of a large tensor's values.

A resume check compares every step of four runs. Shipping each step's State in full costs the
model's size per step in the child (a copy), on the wire and in the parent; a digest costs two
reductions at memory speed in the child and 16 bytes everywhere else. Equal digests mean
bitwise-equal tensors (up to a 2**-64 collision chance); the values of differing leaves are
fetched afterwards for the few the report shows (see `_resume`).

The digest of a tensor views its bytes as 64-bit words laid out in rows of 64 and takes the
wrapping sums of every row and of every column (so that moving values between places changes
it, which one sum would not see), then hashes those sums with the dtype, the shape and the
bytes that do not fill a word. Integer addition wraps and is associative, so the sums, and
hence the digest, do not depend on the thread count or the instruction set.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch

#: tensors of more bytes than this are digested where digests are asked for; smaller ones travel whole
DIGEST_ABOVE_BYTES = 64 * 1024
_ROW_WORDS = 64
_ROW_BYTES = _ROW_WORDS * 8


@dataclasses.dataclass(frozen=True)
class Digest:
    """A tensor known by its dtype, shape and a hash of its bytes."""

    dtype: str
    shape: tuple[int, ...]
    hash: str

    def to_wire(self) -> dict[str, Any]:
        return {"digest": self.hash, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Digest:
        return cls(str(data["dtype"]), tuple(int(n) for n in data["shape"]), str(data["digest"]))


def is_wire_digest(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {"digest", "dtype", "shape"}


def digest(tensor: torch.Tensor) -> Digest:
    """The digest of a dense tensor's values (`_tensors.readable`), read in place: no copy of a contiguous CPU
    tensor. Any dtype: its bytes are hashed."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    raw = flat.view(torch.uint8)
    if raw.data_ptr() % 8:  # a view into a buffer at an offset that is no whole word: words need a copy
        raw = raw.clone()
    whole = raw.numel() - raw.numel() % _ROW_BYTES
    rows = raw[:whole].view(torch.int64).view(-1, _ROW_WORDS)
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    hasher.update(rows.sum(1).numpy().tobytes())
    hasher.update(rows.sum(0).numpy().tobytes())
    hasher.update(raw[whole:].numpy().tobytes())
    return Digest(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), hasher.hexdigest())
