"""The records of an observed run: what each `step()` call did, as the hooks saw it."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass
class Clip:
    """One call of a clipping function."""

    function: str
    parameters: list[str]
    #: the gradients it saw were still scaled by an enabled GradScaler (by `scale`)
    scaled: bool
    scale: float | None
    #: the L2 norm of the gradients it was given, taken together and unscaled (a DTensor's whole): the norm before
    #: clipping
    norm: float = 0.0
    #: the norm the clip scaled by: what `clip_grad_norm_` computed and returned, or the `total_norm`
    #: `clip_grads_with_norm_` was given (None for the others)
    applied: float | None = None


@dataclasses.dataclass
class StepEvent:
    """One optimizer step, seen by its pre-hook."""

    call: int
    grads: dict[str, torch.Tensor | None]
    #: samples (see `Observer.sample`) of the gradients as they were before the first clip in the same call
    pre_clip: dict[str, torch.Tensor]
    lr: list[float]
    #: the step took gradients an enabled GradScaler still scaled (optimizer.step() instead of scaler.step())
    scaled: bool
    scale: float | None
    #: the global RNG streams' fingerprint at the step
    rng: str
    #: the order of this step among all optimizers' steps in the run
    order: int
    #: with `Observer(check_finite=True)`: the parameters whose gradient held an inf or a NaN when the step took it
    nonfinite: list[str] = dataclasses.field(default_factory=list)
    #: with `Observer(check_finite=True)`: the step ran inside `scaler.step()`, which told the optimizer (a fused one,
    #: `optimizer.found_inf`) that its gradients held an inf or a NaN: the optimizer skips the update itself
    told_to_skip: bool = False


@dataclasses.dataclass
class ScalerStep:
    """One `scaler.step(optimizer)` call of the observed (enabled) GradScaler, for an optimizer of the State."""

    optimizer: str
    #: the loss scale when it was called
    scale: float
    #: the `StepEvent.order` of the optimizer step taken inside it; None when it skipped the step
    order: int | None = None
    #: the loss scale after the first `scaler.update()` that followed it in the same call; None without one
    scale_after: float | None = None


@dataclasses.dataclass
class CallRecord:
    """What one `step()` call did, as the hooks saw it, and what it returned."""

    steps: dict[str, int]
    scheduler_steps: dict[str, int]
    clips: list[Clip]
    #: a sample (see `Observer.sample`) of the gradient the call back-propagated, per parameter
    contribution: dict[str, torch.Tensor]
    #: the global RNG streams' fingerprints when the call began and ended
    rng_start: str
    rng_end: str = ""
    loss: float | None = None
    #: whether step() returned tp.LossAccounting; then numerator and denominator are what it declared
    accounting: bool = False
    numerator: float | None = None
    denominator: float | None = None
    scaler_steps: list[ScalerStep] = dataclasses.field(default_factory=list)
    #: the forward passes of the State's modules and the mode switches (with the watch `ForwardRecorder`)
    forwards: ForwardRecord | None = None


@dataclasses.dataclass
class Dropout:
    """What disabling dropout did in one run."""

    #: module paths whose probability was set to 0
    modules: list[str] = dataclasses.field(default_factory=list)
    #: module paths of dropout modules whose probability already was 0
    inactive: list[str] = dataclasses.field(default_factory=list)
    #: functional dropouts called with a probability above 0, by name
    functions: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ForwardPass:
    """One outermost forward call of a module of the State, and what it did."""

    #: the module called (named as `module_names` names it)
    module: str
    #: torch's grad mode and inference mode at the call
    grad: bool
    inference: bool
    #: whether the module has a parameter that requires grad
    trainable: bool
    #: whether a backward pass went through one of its outputs; None: no output required grad
    reached: bool | None = None
    #: [module, training] for each module whose forward read its `training`, in the order of first reads
    modes: list[list[Any]] = dataclasses.field(default_factory=list)
    #: [module, function, training] for each functional dropout that dropped, with the calling module and its mode
    dropouts: list[list[Any]] = dataclasses.field(default_factory=list)
    #: the buffers that a forward of their module in train mode changed
    buffers: list[str] = dataclasses.field(default_factory=list)
    #: whether it drew from torch's RNG streams
    rng: bool = False
    #: when it began, among the passes and mode switches of the run
    order: int = 0

    @property
    def in_train_mode(self) -> list[str]:
        """The modules that read `training` as True, in order."""
        return [name for name, training in self.modes if training]


@dataclasses.dataclass
class ModeSwitch:
    """A module of the State set to train or eval mode."""

    module: str
    training: bool
    #: the step() call it happened in, or (`inside` False) whose batch was being drawn
    step: int
    inside: bool
    #: the call that switched it and where: `model.eval() in Trainer.evaluate (train.py:88)`
    site: str
    #: when it happened, among the passes and mode switches of the run
    order: int = 0


@dataclasses.dataclass
class ForwardRecord:
    """The forward passes of one step() call, and the mode switches since the last one."""

    passes: list[ForwardPass] = dataclasses.field(default_factory=list)
    switches: list[ModeSwitch] = dataclasses.field(default_factory=list)
