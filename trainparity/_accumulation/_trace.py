"""The accumulation check's trace: what one run (reference or candidate) observed, window by window.

Typed records with explicit conversion to and from the `_wire` format, in which a child hands
them to the parent (an in-process run converts too, so both isolations read the same thing).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainparity._observe._records import CallRecord, Clip, Dropout, ScalerStep, StepEvent
from trainparity._state._compare import Snapshot
from trainparity._state._snapshot import snapshot_from_wire, snapshot_to_wire


def _call_to_wire(call: CallRecord) -> dict[str, Any]:
    return {
        "steps": call.steps,
        "scheduler_steps": call.scheduler_steps,
        "clips": [clip.to_wire() for clip in call.clips],
        "contribution": call.contribution,
        "rng_start": call.rng_start,
        "rng_end": call.rng_end,
        "loss": call.loss,
        "accounting": call.accounting,
        "numerator": call.numerator,
        "denominator": call.denominator,
        "scaler_steps": [step.to_wire() for step in call.scaler_steps],
    }


def _call_from_wire(data: dict[str, Any]) -> CallRecord:
    return CallRecord(
        steps=dict(data["steps"]),
        scheduler_steps=dict(data["scheduler_steps"]),
        clips=[Clip.from_wire(clip) for clip in data["clips"]],
        contribution=dict(data["contribution"]),
        rng_start=data["rng_start"],
        rng_end=data["rng_end"],
        loss=data["loss"],
        accounting=data["accounting"],
        numerator=data["numerator"],
        denominator=data["denominator"],
        scaler_steps=[ScalerStep.from_wire(step) for step in data["scaler_steps"]],
    )


def _event_to_wire(event: StepEvent) -> dict[str, Any]:
    return {"call": event.call, "grads": event.grads, "pre_clip": event.pre_clip, "lr": event.lr,
            "scaled": event.scaled, "scale": event.scale, "rng": event.rng, "order": event.order}


def _event_from_wire(data: dict[str, Any]) -> StepEvent:
    return StepEvent(data["call"], dict(data["grads"]), dict(data["pre_clip"]), list(data["lr"]), data["scaled"],
                     data["scale"], data["rng"], data["order"])


@dataclasses.dataclass
class Window:
    """One full batch: the reference's one call, or the candidate's k calls on its micro-batches."""

    #: the full batch's leaves, by accessor path (`batch[0]`, `batch['input_ids']`)
    batch: Snapshot
    #: the micro-batch sizes (None when the batch has no dim-0 size to read)
    sizes: list[int] | None
    calls: list[CallRecord]
    #: per optimizer entry, its steps in this window
    steps: dict[str, list[StepEvent]]
    #: after the window: `parameters.<name>`, the optimizers' and the schedulers' state by State path
    parameters: Snapshot
    optimizers: Snapshot
    schedulers: Snapshot

    def to_wire(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "sizes": self.sizes,
            "calls": [_call_to_wire(call) for call in self.calls],
            "steps": {entry: [_event_to_wire(e) for e in events] for entry, events in self.steps.items()},
            "parameters": self.parameters,
            "optimizers": self.optimizers,
            "schedulers": self.schedulers,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Window:
        return cls(
            batch=dict(data["batch"]),
            sizes=data["sizes"],
            calls=[_call_from_wire(call) for call in data["calls"]],
            steps={entry: [_event_from_wire(e) for e in events] for entry, events in data["steps"].items()},
            parameters=dict(data["parameters"]),
            optimizers=dict(data["optimizers"]),
            schedulers=dict(data["schedulers"]),
        )

    def step_events(self) -> list[tuple[str, StepEvent]]:
        """Every optimizer's steps of this window in the order they were taken."""
        return sorted(((e, event) for e, events in self.steps.items() for event in events), key=lambda i: i[1].order)


@dataclasses.dataclass
class AccumulationTrace:
    """One run of the accumulation check."""

    #: the State right after setup() (dropout already disabled)
    initial: Snapshot
    #: the RNG streams right after setup(), apart from the State so that no entry name can collide
    initial_rng: Snapshot
    #: the batch could not be cut as declared (the check's input is wrong, not the recipe)
    input_error: str | None
    windows: list[Window]
    #: the optimizer entries of the State, by path
    optimizers: list[str]
    dropout: Dropout
    #: batch-dependent modules that ran in training mode (or, with batch_dependent="eval", in eval mode)
    batch_dependent: list[str]
    #: the stride of the observer's diagnosis samples (contributions, gradients before a clip)
    stride: int
    #: each call's gradient contribution was sampled (`CallRecord.contribution`): not in the first run of a candidate
    #: in this process, and never in the reference
    contributions_sampled: bool

    def to_wire(self) -> dict[str, Any]:
        return {
            "initial": snapshot_to_wire(self.initial),
            "initial_rng": self.initial_rng,
            "input_error": self.input_error,
            "windows": [window.to_wire() for window in self.windows],
            "optimizers": self.optimizers,
            "dropout": dataclasses.asdict(self.dropout),
            "batch_dependent": self.batch_dependent,
            "stride": self.stride,
            "contributions_sampled": self.contributions_sampled,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> AccumulationTrace:
        return cls(
            initial=snapshot_from_wire(data["initial"]),
            initial_rng=dict(data["initial_rng"]),
            input_error=data["input_error"],
            windows=[Window.from_wire(window) for window in data["windows"]],
            optimizers=list(data["optimizers"]),
            dropout=Dropout(**data["dropout"]),
            batch_dependent=list(data["batch_dependent"]),
            stride=int(data["stride"]),
            contributions_sampled=bool(data["contributions_sampled"]),
        )
