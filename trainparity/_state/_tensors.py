"""Every kind of tensor a State may hold, made readable for snapshots, digests, the wire and reports.

The comparison, the digests and the wire work on dense, strided tensors. A State can hold others: a
quantized weight, a sparse gradient, a nested batch, a tensor with dimension names, a DTensor shard,
a lazy module's uninitialized parameter, a tensor on the meta device. Each is turned into what its
values are (dequantized, densified, its components, its names dropped, gathered), or, where there are
no values to read, into a note that says so, which compares equal only to the same note.

Dtypes: every dtype whose tensors can be copied is readable. Those without arithmetic on the CPU
(float8 variants, complex32, unsigned 16/32/64-bit, bool) are compared through `arithmetic_view`, and
those that are only bits (`bits8`, `float4_e2m1fn_x2`, ...) bitwise, whatever the comparison.
"""

from __future__ import annotations

import logging
import threading

import torch
from torch import nn

from trainparity._compat import unnamed

#: a State's tensor as a snapshot holds it: its values, its components (a nested tensor), or a note
Readable = torch.Tensor | list[torch.Tensor] | str


class _Gathering(logging.Filter):
    """Drops the log records DTensor's redistribution writes while this thread gathers a tensor for the harness
    (torch warns that a gather of a 2-D-sharded tensor takes several collectives): the user's own gathers keep
    them."""

    local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.local, "active", False)


#: the logger DTensor's redistribution warns through, filtered once
_REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"
_GATHERING = _Gathering()


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value of a tensor: a sharded or replicated `DTensor` is gathered (a collective every
    rank makes in the same order, as they walk the same State); other tensors are returned as they are.
    The result may be the live tensor itself: snapshots copy it."""
    full_tensor = getattr(tensor, "full_tensor", None)  # DTensor's, without importing torch.distributed
    if not callable(full_tensor):
        return tensor
    logger = logging.getLogger(_REDISTRIBUTE_LOGGER)
    if _GATHERING not in logger.filters:
        logger.addFilter(_GATHERING)
    _GATHERING.local.active = True
    try:
        whole: torch.Tensor = full_tensor()
    finally:
        _GATHERING.local.active = False
    return whole


def uninitialized(tensor: torch.Tensor) -> bool:
    """A lazy module's parameter or buffer before its first forward: no shape, no values."""
    return isinstance(tensor, (nn.parameter.UninitializedParameter, nn.parameter.UninitializedBuffer))


def note(tensor: torch.Tensor, why: str) -> str:
    """The leaf of a tensor without values to read: its dtype and shape, and why."""
    try:
        shape = list(tensor.shape)
    except RuntimeError:  # an uninitialized parameter has no shape yet
        shape = None
    described = f"Tensor[{str(tensor.dtype).removeprefix('torch.')}]"
    return f"<{described}{'' if shape is None else f' of shape {shape}'} {why}>"


def readable(tensor: torch.Tensor) -> Readable:
    """The values of any tensor as dense, strided tensors (not copied where the tensor already is one), or a note."""
    if uninitialized(tensor):
        return note(tensor, "uninitialized (a lazy module's, before its first forward): no values")
    if tensor.device.type == "meta":
        return note(tensor, "on the meta device: no values")
    tensor = gathered(tensor)
    if tensor.is_nested:
        return list(tensor.unbind())
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    elif tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    return unnamed(tensor)


def copied_to_cpu(tensor: torch.Tensor) -> torch.Tensor | str:
    """A detached CPU copy of a dense tensor, or a note for a dtype whose tensors cannot even be copied."""
    try:
        return tensor.detach().to("cpu", copy=True)
    except (RuntimeError, NotImplementedError, TypeError) as error:  # placeholder dtypes (torch.int4, ...)
        return note(tensor, f"that cannot be copied ({str(error).splitlines()[0]}): no values")


def leaf(tensor: torch.Tensor) -> torch.Tensor | str:
    """A tensor as one snapshot leaf: a CPU copy of its values, or a note (a nested tensor's components are
    leaves of their own only where a snapshot flattens it)."""
    values = readable(tensor)
    if isinstance(values, list):
        return note(tensor, f"nested, of {len(values)} components: compared by its components only in a State")
    return values if isinstance(values, str) else copied_to_cpu(values)


#: dtypes that are bits only: no arithmetic, no equality in torch; compared bitwise whatever the comparison
_OPAQUE = frozenset({f"{sign}int{bits}" for sign in ("", "u") for bits in range(1, 8)})


def opaque(dtype: torch.dtype) -> bool:
    """Whether values of `dtype` are only bits to torch (`bits8`, `float4_e2m1fn_x2`, `int4`, ...)."""
    name = str(dtype).removeprefix("torch.")
    return name.startswith(("bits", "float4")) or name in _OPAQUE


def arithmetic_view(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in a dtype with the CPU arithmetic the comparison needs, holding the same values exactly:
    float8 variants as float32, half-width complex as complex64, unsigned integers and bools as int64 (uint64 as
    float64, its values being up to 2**64). Other tensors are returned as they are."""
    dtype = tensor.dtype
    if dtype.is_complex and dtype.itemsize < 8:  # complex32, and bcomplex32 from torch 2.15 on
        return tensor.to(torch.complex64)
    if dtype.is_floating_point and dtype.itemsize == 1:
        return tensor.to(torch.float32)
    if dtype == torch.uint64:
        return tensor.to(torch.float64)
    if dtype in (torch.bool, torch.uint16, torch.uint32):
        return tensor.to(torch.int64)
    return tensor


_INTEGER_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flat_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as one row of integers (two per 16-byte element), for `torch.equal` to compare bits.

    A view where the tensor is contiguous; empty and 0-dim tensors included.
    """
    return tensor.detach().contiguous().reshape(-1).view(_INTEGER_VIEWS[min(tensor.element_size(), 8)])


def element_bits(tensor: torch.Tensor) -> torch.Tensor:
    """Each element's bytes as a row of integers (one, or two for 16-byte elements), so `==` compares bits."""
    width = tensor.element_size()
    return flat_bits(tensor).reshape(tensor.numel(), width // _INTEGER_VIEWS[min(width, 8)].itemsize)
