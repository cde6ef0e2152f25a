"""Judging in float64: the precision modes of the accumulation and data-parallel checks.

Two runs that compute the same thing in another order (one full batch against k micro-batches,
one process against a world of ranks) differ by rounding. In float32 that rounding depends on the
CPU's instruction set and, through Adam's division by sqrt(v) + eps, can grow into a whole step,
so no float32 tolerance separates rounding from bugs on every machine. In float64 the same
rounding is about 1e-16 of a value, so one fixed tolerance does:

- `precision="float64"` (the default): the run uses float64 as torch's default dtype, every
  module in the State is converted in place (parameters keep their identity, so the optimizer
  keeps them), and every floating tensor and array of each batch is cast. A recipe that forces
  float32 anyway is an ERROR naming `precision="native"`.
- `precision="native"`: the recipe runs in its own dtypes; declare a tolerance.

Autocast leaves float64 tensors alone (it only lowers float32), so autocast regions run in
float64 too; a GradScaler scales and unscales float64 gradients like float32 ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from trainparity._batches._split import map_leaves
from trainparity._state._compare import EXACT, Comparison, ToleranceComparison
from trainparity._state._entries import State, state_objects

PRECISIONS = ("float64", "native")
#: The comparison of float64 mode when none is declared. float64 rounding of a training step is about
#: 1e-16 relative; rtol leaves nine orders of magnitude above it and stays far below what an
#: accumulation or data-parallel bug does (a factor such as k or 1/k, or percents). atol covers
#: elements that are zero in exact arithmetic and rounding noise in practice.
FLOAT64_TOLERANCE = ToleranceComparison(rtol=1e-7, atol=1e-9)
#: what a float64 run raises when the recipe computes in another floating dtype anyway
FORCED_PRECISION_HINT = (
    "precision='float64' runs the recipe in float64; it computed in {dtype} anyway (an explicit dtype, .float(), "
    "or a module or tensor made outside the State), so the check cannot judge it in float64. Pass "
    "precision='native' (and declare a tolerance) to judge it in its own dtypes."
)


class PrecisionError(RuntimeError):
    """A float64 run met a tensor of another floating dtype that the recipe forced."""


def effective_comparison(declared: Comparison | None, precision: str) -> Comparison:
    """The declared comparison, else float64 mode's fixed tolerance, else exact."""
    if declared is not None:
        return declared
    return FLOAT64_TOLERANCE if precision == "float64" else EXACT


def describe_comparison(declared: Comparison | None, precision: str) -> str:
    comparison = effective_comparison(declared, precision)
    if declared is None and precision == "float64":
        return f"{comparison.describe()}, the float64 default"
    return comparison.describe()


@contextlib.contextmanager
def running_in(precision: str) -> Iterator[None]:
    """torch's default dtype for the run: float64 in float64 mode, restored afterwards."""
    if precision != "float64":
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def convert_state(state: State, precision: str) -> None:
    """In float64 mode, convert every module of the State in place (a no-op where already float64)."""
    if precision != "float64":
        return
    for _, module in state_objects(state, nn.Module):
        if any(t.is_floating_point() and t.dtype != torch.float64
               for t in (*module.parameters(), *module.buffers())):
            module.to(torch.float64)


def cast_batch(batch: Any, precision: str) -> Any:
    """In float64 mode, the batch with every floating tensor and array cast to float64."""
    if precision != "float64":
        return batch

    def cast(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.dtype != torch.float64:
            return leaf.to(torch.float64)
        if isinstance(leaf, np.ndarray) and leaf.dtype.kind == "f" and leaf.dtype != np.float64:
            return leaf.astype(np.float64)
        return leaf

    return map_leaves(batch, cast)


def require_float64(tensors: Iterator[torch.Tensor], what: str) -> None:
    """Raise PrecisionError when a floating tensor among `tensors` is not float64."""
    for tensor in tensors:
        if tensor.is_floating_point() and tensor.dtype != torch.float64:
            raise PrecisionError(f"{what} is {str(tensor.dtype).removeprefix('torch.')}: "
                                 + FORCED_PRECISION_HINT.format(dtype=str(tensor.dtype).removeprefix("torch.")))


def require_float64_steps(entry: str, optimizer: torch.optim.Optimizer) -> None:
    """An `Observer`'s `before_step` in float64 mode: every parameter the optimizer steps is float64 (a recipe that
    converts part of its model back to float32 is refused with the hint to run it natively)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    require_float64(iter(parameters), f"a parameter that optimizer '{entry}' steps")


def require_float64_loss(value: object, where: str) -> None:
    """In float64 mode, the loss a recipe's step() returned is float64 where it is a tensor."""
    if isinstance(value, torch.Tensor):
        require_float64(iter([value]), f"the loss that {where} returned")


def dtype_error_hints(message: str, precision: str) -> list[str]:
    """The notes for an ERROR result: in float64 mode, the hint to pass precision='native' when the error's message
    reads as a dtype clash; none otherwise."""
    clash = precision == "float64" and ("Double" in message or "float64" in message) and any(
        word in message for word in ("Float", "float32", "Half", "BFloat16", "dtype"))
    return [FORCED_PRECISION_HINT.format(dtype="another dtype")] if clash else []
