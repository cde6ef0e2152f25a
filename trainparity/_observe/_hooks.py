"""What every observer of training shares: hooks installed and undone as one, gradient copies, and the one rule
for optimizer steps that are not training."""

from __future__ import annotations

import contextlib
from typing import Any, Self

import torch

from trainparity._state._tensors import gathered


def grad_copy(tensor: torch.Tensor | None, scale: float | None) -> torch.Tensor | None:
    """A detached CPU copy of a gradient (dense), divided by the scale that still multiplies it."""
    if tensor is None:
        return None
    copy = gathered(tensor).detach().to("cpu", copy=True)
    if copy.layout != torch.strided:  # sparse gradients (nn.Embedding(sparse=True)) compare as dense values
        copy = copy.to_dense()
    return copy / scale if scale is not None else copy


def creates_state(optimizer: torch.optim.Optimizer) -> bool:
    """A `step()` that is not training: torch.distributed.checkpoint's `get_state_dict` and
    `set_state_dict` step an optimizer that has no state yet with zero gradients and a learning
    rate of 0, to create the state a checkpoint is loaded into. Every observer of optimizer steps
    (recipes' and scripts') passes over it."""
    if optimizer.state:
        return False
    groups = optimizer.param_groups
    return all(float(group.get("lr", 0.0)) == 0.0 for group in groups) and all(
        parameter.grad is None or not bool(parameter.grad.any()) for group in groups for parameter in group["params"])


class HookSet:
    """Hooks and patches that `_install` puts in place on entry, each registering its undoing on `_stack`:
    all removed on exit, and on a failure halfway through installing, exceptions included."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def _install(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._install()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()


def step_closure(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The closure an optimizer step hook's call passes (`optimizer.step(closure)`), or None. The hooks get the
    call's arguments with the optimizer itself first."""
    positional = args[1:] if args and args[0] is optimizer else args
    return positional[0] if positional else kwargs.get("closure")
