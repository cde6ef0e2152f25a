"""`check_training`: one observed run of the recipe, recorded per call of `step()`, and the verdicts asked for.

The run goes through the one observer of optimizer steps: its step events give each optimizer step's gradients
(unscaled while an enabled GradScaler still scales them) and learning rates, its `scaler.step()` records the steps
the GradScaler skipped, its clip records the gradient norm before clipping. An `UpdateProbe`, called by the observer
around each optimizer step (`before_step`/`after_step`), measures what the step changed: ||update|| / ||parameters||
per parameter group. Per call the trace keeps numbers only (`_results/_telemetry.py: TrainingStep`); the gradients
the observer copied are dropped after each call. With `overfit=True` every call gets the recipe's first batch again.
The verdicts (`_training_judge.py`) are judged in the parent.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trainparity._compat import GradScaler
from trainparity._observe._hooks import l2_norm
from trainparity._observe._observer import Observer
from trainparity._observe._records import CallRecord, Clip, StepEvent
from trainparity._preflight._run import Call, Preflight, PreflightPayload, nonfinite, observed_calls, observed_recipe
from trainparity._preflight._training_judge import Band, Schedule, TrainingTrace, Verdicts, judge_training
from trainparity._process import _session
from trainparity._process._options import Isolation
from trainparity._recipe._reference import RecipeSpec
from trainparity._results._result import TrainingResult
from trainparity._results._telemetry import TrainingStep, Update
from trainparity._state._entries import state_objects

__all__ = ["check_training"]

TASK = "trainparity._preflight._training:training_run"


@dataclasses.dataclass(frozen=True)
class TrainingPayload(PreflightPayload):
    #: every call gets the recipe's first batch again
    overfit: bool = False


# -- the run (in the child) -------------------------------------------------------------------------


@dataclasses.dataclass
class Measured:
    """What the probe measured of one optimizer step, per parameter group."""

    update_ratio: list[float | None]
    parameters: list[int]
    without_grad: list[int]
    frozen: list[int]


class UpdateProbe:
    """The parameters each optimizer step changed, and by how much: copies of the parameters before the step
    (`before_step`), compared after it (`after_step`), during the observer's calls only."""

    def __init__(self) -> None:
        self.observer: Observer | None = None
        self._before: dict[str, list[list[torch.Tensor]]] = {}
        self.measured: dict[str, list[Measured]] = {}

    def start(self, observer: Observer) -> None:
        self.observer = observer

    def before_step(self, entry: str, optimizer: torch.optim.Optimizer) -> None:
        if self.observer is None or self.observer.call is None:
            return
        self._before[entry] = [[p.detach().clone() for p in group["params"]] for group in optimizer.param_groups]

    def after_step(self, entry: str, optimizer: torch.optim.Optimizer) -> None:
        before = self._before.pop(entry, None)
        if before is None:
            return
        measured = Measured([], [], [], [])
        for group, old in zip(optimizer.param_groups, before, strict=False):
            params: list[torch.Tensor] = group["params"]
            size = l2_norm(old)
            change = l2_norm(torch._foreach_sub([p.detach() for p in params], old)) if len(params) == len(old) else None
            measured.update_ratio.append(change / size if change is not None and size > 0 else None)
            measured.parameters.append(len(params))
            measured.without_grad.append(sum(p.grad is None for p in params))
            measured.frozen.append(sum(not p.requires_grad for p in params))
        self.measured.setdefault(entry, []).append(measured)


def _norms(named: Sequence[tuple[str, torch.Tensor]]) -> tuple[float, list[str], str | None]:
    """The L2 norm of the tensors taken together, those holding an inf or a NaN, and the one of the largest norm."""
    if not named:
        return 0.0, [], None
    dense = [t if t.layout == torch.strided else t.to_dense() for _, t in named]
    norms = [float(norm) for norm in torch._foreach_norm(dense)]
    # a norm overflows only past 1e154: the elements say whether a tensor holds an inf or a NaN
    bad = [name for (name, _), tensor, norm in zip(named, dense, norms, strict=True)
           if not math.isfinite(norm) and nonfinite(tensor)]
    largest = max(range(len(norms)), key=lambda i: (not math.isfinite(norms[i]), norms[i] if math.isfinite(
        norms[i]) else 0.0))
    return math.sqrt(sum(norm * norm for norm in norms)), bad, named[largest][0]


def _nonfinite_parameters(observer: Observer) -> list[str]:
    return _norms([(name, parameter.detach()) for name, parameter in observer.parameters()])[1]


def _clip_norm(clips: list[Clip], names: set[str]) -> float | None:
    """The norm before clipping of the first unused clip in the call that clipped these parameters (removed)."""
    for index, clip in enumerate(clips):
        if names.intersection(clip.parameters):
            return clips.pop(index).norm
    return None


def _update(entry: str, event: StepEvent, measured: Measured, scale: float | None, skipped: bool,
            clips: list[Clip]) -> Update:
    grads = [(name, grad) for name, grad in event.grads.items() if grad is not None]
    norm, bad, largest = _norms(grads)
    return Update(entry, skipped, scale, norm if grads else None, _clip_norm(clips, set(event.grads)), bad,
                  event.lr, measured.update_ratio, measured.parameters, measured.without_grad, measured.frozen,
                  largest if grads else None)


def _training_step(call: Call, events: dict[str, list[StepEvent]], measured: dict[str, list[Measured]],
                   nonfinite_params: list[str]) -> TrainingStep:
    record: CallRecord = call.record
    clips = list(record.clips)
    inside = {s.order: s for s in record.scaler_steps if s.order is not None}
    steps = sorted(((entry, event, measure) for entry in events
                    for event, measure in zip(events[entry], measured.get(entry, []), strict=True)),
                   key=lambda item: item[1].order)
    updates = []
    for entry, event, measure in steps:
        scaler_step = inside.get(event.order)
        update = _update(entry, event, measure, scaler_step.scale if scaler_step else None, False, clips)
        # an optimizer that unscales in its own step (fused) takes non-finite gradients and skips the update
        update.skipped = scaler_step is not None and bool(update.nonfinite_grads)
        updates.append(update)
    for skipped in (s for s in record.scaler_steps if s.order is None):
        updates.append(Update(skipped.optimizer, True, skipped.scale, None, None, [], [], [], [], [], [], None))
    return TrainingStep(call.number, record.loss, updates, nonfinite_params)


def training_run(payload: TrainingPayload, workdir: pathlib.Path) -> dict[str, Any]:
    """Task: `steps` observed calls of `step()`, each recorded as numbers."""
    probe = UpdateProbe()
    with observed_recipe(payload, record_contributions=False, before_step=probe.before_step,
                         after_step=probe.after_step) as (recipe, observer):
        probe.start(observer)
        scaler = next((entry for entry, value in state_objects(observer.state, GradScaler)
                       if value is observer.scaler), None)
        trace = TrainingTrace({entry: len(optimizer.param_groups) for entry, optimizer in observer.optimizers.items()},
                              scaler, _nonfinite_parameters(observer), [])
        for call in observed_calls(recipe, observer, payload.steps, repeat_first=payload.overfit):
            measured, probe.measured = probe.measured, {}
            trace.steps.append(_training_step(call, observer.take_step_events(), measured,
                                              _nonfinite_parameters(observer)))
    return trace.to_wire()


@_session.recorded
def check_training(
    recipe: RecipeSpec,
    *,
    steps: int = 20,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    min_decrease: float | None = None,
    window: int | None = None,
    overfit: bool = False,
    overfit_fraction: float = 0.1,
    max_grad_norm: float | None = None,
    update_ratio: Band | bool | None = None,
    lr_schedule: Schedule | Mapping[str, Schedule] | None = None,
    max_skipped_steps: int | None = None,
) -> TrainingResult:
    """Train the recipe `steps` calls of `step()`, observed, and judge the run; `result.table()` shows it.

    Recorded per optimizer step: the loss, the gradient norm (before and after clipping), ||update|| /
    ||parameters|| and the learning rate per parameter group, the GradScaler's skipped steps, non-finite values.
    Always judged: `nonfinite` (a loss, a gradient an optimizer stepped on, a parameter). Judged when asked:
    `loss_not_decreasing` (`min_decrease`: the median loss of the last `window` steps must be below the first
    `window` steps' median by that fraction of it; `window` defaults to steps // 4), `not_overfitting` (`overfit=True`:
    every call gets the recipe's first batch again, and the loss must fall below `overfit_fraction` of its value at
    step 1), `grad_norm_exceeded` (`max_grad_norm`, on the norm before clipping), `update_too_small` /
    `update_too_large` (`update_ratio=(low, high)`, or True for (1e-5, 1e-1) around the classic 1e-3),
    `lr_mismatch` (`lr_schedule`: a function of the optimizer step's index, from 0, or a list; a float, or one per
    parameter group; a mapping from optimizer entries to such schedules), `skipped_updates` (more than
    `max_skipped_steps` steps skipped by the GradScaler). `isolation` is "inprocess" (default), "process" or
    "spawn"; `timeout` bounds the whole check. Never raises for a FAIL; misuse raises TypeError/ValueError.
    """
    preflight = Preflight.prepare(recipe, steps=steps, minimum_steps=1, seed=seed, isolation=isolation,
                                  timeout=timeout)
    verdicts = Verdicts.validate(steps=steps, min_decrease=min_decrease, window=window, overfit=overfit,
                                 overfit_fraction=overfit_fraction, max_grad_norm=max_grad_norm,
                                 update_ratio=update_ratio, lr_schedule=lr_schedule,
                                 max_skipped_steps=max_skipped_steps)
    payload = TrainingPayload(**vars(preflight.payload), overfit=verdicts.overfit)
    preflight = dataclasses.replace(preflight, payload=payload, config={**preflight.config, **verdicts.config()})
    outcome = preflight.run(TASK, TrainingTrace.from_wire)
    if outcome.error is not None:
        return TrainingResult.errored(outcome.error, preflight.config, outcome.exception)
    trace: TrainingTrace = outcome.output
    return judge_training(trace, preflight.config, verdicts)

