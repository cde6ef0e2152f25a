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

    def to_wire(self) -> dict[str, Any]:
        return {"function": self.function, "parameters": self.parameters, "scaled": self.scaled, "scale": self.scale}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Clip:
        return cls(data["function"], list(data["parameters"]), bool(data["scaled"]), data["scale"])


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

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ScalerStep:
        return cls(str(data["optimizer"]), float(data["scale"]), data["order"], data["scale_after"])


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


@dataclasses.dataclass
class Dropout:
    """What disabling dropout did in one run."""

    #: module paths whose probability was set to 0
    modules: list[str] = dataclasses.field(default_factory=list)
    #: module paths of dropout modules whose probability already was 0
    inactive: list[str] = dataclasses.field(default_factory=list)
    #: functional dropouts called with a probability above 0, by name
    functions: list[str] = dataclasses.field(default_factory=list)
