"""Every kind of tensor a State may hold, built from a seed, and the same tensor with one element changed.

Shared by the comparison property test (`test_tensor_kinds.py`) and `KindsRecipe`, which holds them all in
a State that check_resume and check_accumulation run. A change is one element made clearly different (no
tolerance any check allows covers it); `changed` returns the tensor and the path suffix where the snapshot
shows the change (a nested tensor's component).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import trainparity as tp
from trainparity._compat import dimension_names, named, unnamed
from trainparity._state._tensors import arithmetic_view, opaque

SIZE = 6


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random values of any dtype: normal floats, small integers, random bits for the opaque ones."""
    generator = _generator(seed)
    if opaque(dtype):
        count = int(torch.Size(shape).numel()) * dtype.itemsize
        return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=generator).view(dtype).reshape(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=torch.complex64, generator=generator).to(dtype)
    if dtype.is_floating_point:
        values = torch.randn(shape, generator=generator) * 4
        return (values.abs() if dtype == torch.float8_e8m0fnu else values).to(dtype)
    return torch.randint(0, 100, shape, generator=generator).to(dtype)


def different(value: torch.Tensor) -> torch.Tensor:
    """A value clearly different from `value` (0-dim, in its arithmetic dtype)."""
    if value.dtype.is_floating_point or value.dtype.is_complex:
        return value + 1 + value.abs() if bool(torch.isfinite(value).all()) else torch.full_like(value, 0.5)
    return torch.zeros_like(value) if bool(value != 0) else torch.ones_like(value)


def change_dense(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of a dense tensor with its first element clearly different (an empty one gains an element)."""
    if tensor.numel() == 0:
        return torch.zeros(1, dtype=tensor.dtype)
    if opaque(tensor.dtype):
        bits = tensor.contiguous().view(torch.uint8).clone()
        bits.view(-1)[0] ^= 0x5A
        return bits.view(tensor.dtype)
    values = arithmetic_view(tensor).clone(memory_format=torch.contiguous_format)
    flat = values.view(-1)
    flat[0] = different(flat[0])
    return values.to(tensor.dtype)


def _dense(dtype: torch.dtype, shape: tuple[int, ...] = (SIZE,)) -> Callable[[int], torch.Tensor]:
    return lambda seed: _random(dtype, shape, seed)


def _noncontiguous(seed: int) -> torch.Tensor:
    return _random(torch.float32, (4, 3), seed).t()


def _offset_view(seed: int) -> torch.Tensor:
    return _random(torch.float32, (9,), seed)[1:6]  # a storage offset that is no whole 8-byte word


def _expanded(seed: int) -> torch.Tensor:
    return _random(torch.float32, (1, SIZE), seed).expand(3, SIZE)  # stride 0: its rows share memory


def _sliding_windows(seed: int) -> torch.Tensor:
    return _random(torch.float32, (SIZE + 2,), seed).as_strided((3, SIZE), (1, 1))  # overlapping windows


def _sparse_coo(seed: int) -> torch.Tensor:
    return (_random(torch.float32, (4, 4), seed) * (torch.arange(16).reshape(4, 4) % 3 == 0)).to_sparse()


def _sparse_csr(seed: int) -> torch.Tensor:
    return (_random(torch.float32, (4, 4), seed) * (torch.arange(16).reshape(4, 4) % 2 == 0)).to_sparse_csr()


def _nested(seed: int) -> torch.Tensor:
    return torch.nested.nested_tensor([_random(torch.float32, (2, 3), seed), _random(torch.float32, (4, 3), seed + 1)])


def _jagged(seed: int) -> torch.Tensor:
    return torch.nested.nested_tensor([_random(torch.float32, (2, 3), seed), _random(torch.float32, (4, 3), seed + 1)],
                                      layout=torch.jagged)


def _quantized(seed: int) -> torch.Tensor:
    return torch.quantize_per_tensor(_random(torch.float32, (SIZE,), seed), 0.1, 0, torch.qint8)


def _quantized_per_channel(seed: int) -> torch.Tensor:
    return torch.quantize_per_channel(_random(torch.float32, (2, 3), seed), torch.tensor([0.1, 0.2]),
                                      torch.tensor([0, 1]), 0, torch.quint8)


def _meta(seed: int) -> torch.Tensor:
    return torch.empty(SIZE, device="meta")


def _uninitialized(seed: int) -> torch.Tensor:
    return nn.parameter.UninitializedParameter()


def _digested(seed: int) -> torch.Tensor:
    return _random(torch.float32, (20_000,), seed)  # 80 KB: shipped as a digest by a resume child


def _changed_structured(tensor: torch.Tensor) -> tuple[torch.Tensor, str]:
    """One element of a tensor of another layout changed, and where the snapshot shows it."""
    if tensor.is_nested:
        parts = list(tensor.unbind())
        parts[1] = change_dense(parts[1])
        return torch.nested.nested_tensor(parts, layout=tensor.layout), ".1"
    if tensor.is_quantized:
        values = change_dense(tensor.dequantize())
        if tensor.qscheme() == torch.per_tensor_affine:
            return torch.quantize_per_tensor(values, tensor.q_scale(), tensor.q_zero_point(), tensor.dtype), ""
        return torch.quantize_per_channel(values, tensor.q_per_channel_scales(), tensor.q_per_channel_zero_points(),
                                          tensor.q_per_channel_axis(), tensor.dtype), ""
    if tensor.layout == torch.sparse_coo:
        return change_dense(tensor.to_dense()).to_sparse(), ""
    if tensor.layout == torch.sparse_csr:
        return change_dense(tensor.to_dense()).to_sparse_csr(), ""
    names = dimension_names(tensor)
    if names is not None:
        return named(change_dense(unnamed(tensor)), names), ""
    if isinstance(tensor, (nn.parameter.UninitializedParameter, nn.parameter.UninitializedBuffer)):
        return nn.Parameter(torch.zeros(SIZE)), ""  # initialized where the other is not
    if tensor.device.type == "meta":
        return torch.empty(SIZE + 1, device="meta"), ""  # no values: only the shape can differ
    return change_dense(tensor), ""


def changed(tensor: torch.Tensor) -> tuple[torch.Tensor, str]:
    """`tensor` with one element changed, and the path suffix at which a snapshot shows it."""
    return _changed_structured(tensor)


def dtypes() -> dict[str, torch.dtype]:
    """Every dtype whose tensors this torch can copy, by name (placeholder dtypes such as int4 have none)."""
    found = {}
    for name in dir(torch):
        dtype = getattr(torch, name, None)
        if isinstance(dtype, torch.dtype) and str(dtype) == f"torch.{name}" and not str(dtype).startswith("torch.q"):
            try:
                _random(dtype, (2,), 0).clone()
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            found[name] = dtype
    return found


#: kind name -> builder from a seed
KINDS: dict[str, Callable[[int], torch.Tensor]] = {
    **{f"dtype_{name}": _dense(dtype) for name, dtype in sorted(dtypes().items())},
    "empty": _dense(torch.float32, (0,)),
    "empty_2d": _dense(torch.float32, (0, 3)),
    "zero_dim": _dense(torch.float32, ()),
    "zero_dim_int": _dense(torch.int64, ()),
    "noncontiguous": _noncontiguous,
    "offset_view": _offset_view,
    "expanded": _expanded,
    "sliding_windows": _sliding_windows,
    "sparse_coo": _sparse_coo,
    "sparse_csr": _sparse_csr,
    "nested": _nested,
    "nested_jagged": _jagged,
    "quantized": _quantized,
    "quantized_per_channel": _quantized_per_channel,
    "meta": _meta,
    "uninitialized": _uninitialized,
    "digested": _digested,
}
if hasattr(torch.Tensor, "refine_names"):  # named tensors: gone from newer torch
    KINDS["named"] = lambda seed: _random(torch.float32, (2, 3), seed).refine_names("N", "C")


class KindsRecipe(tp.Recipe):
    """A small model trained with AdamW beside a State entry holding every tensor kind, a lazy module never
    called, and containers with non-string keys and a cycle. `fault=<kind>` loads every kind but that one
    restored, changed in one element."""

    def __init__(self, accumulation_steps: int = 1, fault: str | None = None) -> None:
        if fault is not None and fault not in KINDS:
            raise ValueError(f"unknown fault {fault!r}")
        self.accumulation_steps, self.fault = accumulation_steps, fault

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
        model.register_buffer("nothing", torch.empty(0))  # an empty buffer of the model itself
        model.register_buffer("mask", torch.tensor([True, False, True]))
        model.register_buffer("broadcast", torch.ones(1, 3).expand(2, 3))  # a mask registered expanded
        kinds = {name: build(index) for index, (name, build) in enumerate(KINDS.items())}
        keyed = {0: torch.ones(2), (1, "q"): [torch.zeros(3), 2**70], None: "none"}
        cycle: list[object] = [torch.arange(3)]
        cycle.append(cycle)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01), kinds=kinds,
                        lazy=nn.LazyLinear(2), keyed=keyed, cycle=cycle, step=0, micro=0)

    def batches(self, state: tp.State):  # type: ignore[no-untyped-def]
        data = torch.randn(64, 4, generator=_generator(1))
        while True:
            rows = torch.arange(state.step * 8, state.step * 8 + 8) % 64
            state.step += 1  # the stream's position, counted as a batch is drawn
            yield data[rows]

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        loss = state.model(batch).pow(2).mean() / self.accumulation_steps
        loss.backward()
        state.micro += 1
        if state.micro % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
        return loss

    def load(self, path):  # type: ignore[no-untyped-def]
        state = super().load(path)
        if self.fault is not None:
            state.kinds[self.fault] = changed(state.kinds[self.fault])[0]
        return state
