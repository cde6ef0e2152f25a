"""`check_training`: one observed run of the recipe, recorded per call of `step()`, and the verdicts asked for.

The run goes through the one observer of optimizer steps (without its copies of the gradients, `record_grads=False`):
its step events give each optimizer step's learning rates and whether an enabled GradScaler still scaled its
gradients, its `scaler.step()` records the steps the GradScaler skipped, its clip records the gradient norm before
clipping. An `UpdateProbe`, called by the observer around each optimizer step (`before_step`/`after_step`), measures
what the step changed (||update|| / ||parameters|| per parameter group, on a sample of a large parameter) and the
norms of the gradients it took. Per call the trace keeps numbers only (`_results/_telemetry.py: TrainingStep`). With
`overfit=True` every call gets the recipe's first batch again. The verdicts (`_training_judge.py`) are judged in the
parent."""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
from collections.abc import Mapping, Sequence

import torch

from trainparity._compat import GradScaler
from trainparity._observe._hooks import tensor_norms
from trainparity._observe._observer import Observer
from trainparity._observe._records import CallRecord, Clip, StepEvent
from trainparity._preflight._run import Call, Preflight, PreflightPayload, nonfinite, observed_calls, observed_recipe
from trainparity._preflight._training_judge import TrainingTrace, judge_training, unknown_schedule_entries
from trainparity._preflight._training_verdicts import Band, Schedule, Verdicts
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
    #: the optimizer entries `lr_schedule` names (a mapping's keys): each must be one of the State's
    scheduled: tuple[str, ...] = ()


# -- the run (in the child) -------------------------------------------------------------------------


@dataclasses.dataclass
class Measured:
    """What the probe measured of one optimizer step."""

    #: per parameter group, as `Update` has them
    update_ratio: list[float | None]
    parameters: list[int]
    without_grad: list[int]
    frozen: list[int]
    #: the optimizer's gradients after the step (unscaled): their norm together (None: none), those holding an inf or
    #: a NaN, the one of the largest norm
    grad_norm: float | None
    nonfinite_grads: list[str]
    largest_grad: str | None
    #: the names of the optimizer's parameters
    names: list[str]


def _total(norms: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """The norm of tensors taken together, from theirs; `weights` scale each one's square (a sample's)."""
    if weights is None:
        return math.sqrt(sum(norm * norm for norm in norms))
    return math.sqrt(sum(weight * norm * norm for norm, weight in zip(norms, weights, strict=True)))


def _stride(parameter: torch.Tensor) -> int:
    """Which blocks of a parameter its sample takes: every `stride`-th (1: all of the parameter)."""
    if parameter.numel() <= UPDATE_SAMPLE or not parameter.is_contiguous():
        return 1
    return max(1, parameter.numel() // SAMPLE_BLOCK // (UPDATE_SAMPLE // SAMPLE_BLOCK))


def _sampled(parameter: torch.Tensor, stride: int) -> torch.Tensor:
    """Every `stride`-th block of `SAMPLE_BLOCK` contiguous elements of a parameter, as a view (contiguous runs: a
    sample costs its size in memory traffic, where every k-th element would read every cache line)."""
    if stride == 1:
        return parameter
    flat = parameter.view(-1)
    return flat[:flat.numel() // SAMPLE_BLOCK * SAMPLE_BLOCK].view(-1, SAMPLE_BLOCK)[::stride]


def _nonfinite(named: Sequence[tuple[str, torch.Tensor]], norms: Sequence[float]) -> list[str]:
    """The names whose tensor holds an inf or a NaN (a norm says so, but past 1e154 the elements decide)."""
    if all(map(math.isfinite, norms)):
        return []
    return [name for (name, tensor), norm in zip(named, norms, strict=True) if not math.isfinite(norm)
            and nonfinite(tensor)]


#: a parameter's update is measured on a sample of about this many of its elements, in blocks of SAMPLE_BLOCK spread
#: over it (all of a smaller one): the ratio ||update|| / ||parameters|| of a large tensor is its sample's, at a
#: fraction of the copies' cost
UPDATE_SAMPLE, SAMPLE_BLOCK = 1 << 14, 1 << 10


@dataclasses.dataclass
class _Held:
    """An optimizer's parameters as the probe holds them from step to step."""

    #: (id, storage, shape, dtype) of each parameter, in param_groups order: while it holds, the samples' views and
    #: copies are reused
    key: list[tuple[int, int, torch.Size, torch.dtype]]
    params: list[torch.Tensor]
    names: list[str]
    #: where each parameter group ends in `params`
    ends: list[int]
    #: per parameter, its sample (a view; the parameter itself when small), and how many elements each sampled one
    #: stands for
    samples: list[torch.Tensor]
    weights: list[float]
    #: copies of the parameters' samples before the running step; None for sparse parameters (not measured)
    copies: list[torch.Tensor] | None
    #: the copies' norms
    sizes: list[float] = dataclasses.field(default_factory=list)


class UpdateProbe:
    """What each optimizer step changed: copies of its parameters (or of a sample of each, `UPDATE_SAMPLE`) before the
    step (`before_step`), compared after it (`after_step`) with the norms of the gradients it took, during the
    observer's calls only. A norm that is not finite names the parameters holding an inf or a NaN: before a step
    (made so outside an optimizer step) or after it."""

    def __init__(self) -> None:
        self.observer: Observer | None = None
        self._held: dict[str, _Held] = {}
        #: optimizers whose running step began in a call
        self._running: set[str] = set()
        self.measured: dict[str, list[Measured]] = {}
        #: the parameters seen holding an inf or a NaN in the running call, by name
        self.nonfinite: dict[str, None] = {}

    def start(self, observer: Observer) -> None:
        self.observer = observer

    def _flag(self, held: _Held, params: Sequence[torch.Tensor], norms: Sequence[float]) -> None:
        if all(map(math.isfinite, norms)):
            return
        for name, parameter, norm in zip(held.names, params, norms, strict=True):
            if not math.isfinite(norm) and nonfinite(parameter):
                self.nonfinite[name] = None

    @torch.no_grad()
    def before_step(self, entry: str, optimizer: torch.optim.Optimizer) -> None:
        if self.observer is None or self.observer.call is None:
            return
        groups: list[list[torch.Tensor]] = [group["params"] for group in optimizer.param_groups]
        params = [p for params in groups for p in params]
        strided = all(p.layout == torch.strided for p in params)
        key = [(id(p), p.data_ptr() if strided else 0, p.shape, p.dtype) for p in params]
        held = self._held.get(entry)
        if held is None or held.key != key:
            names = [self.observer.names.get(id(p)) or f"{entry}.param{i}" for i, p in enumerate(params)]
            ends = list(itertools.accumulate(len(params) for params in groups))
            samples = [_sampled(p.detach(), _stride(p)) for p in params] if strided else []
            weights = [p.numel() / max(1, sample.numel()) for p, sample in zip(params, samples, strict=False)]
            held = self._held[entry] = _Held(key, params, names, ends, samples, weights,
                                             [sample.clone() for sample in samples] if strided else None)
        elif held.copies is not None:  # into the copies of the last step: no allocation
            torch._foreach_copy_(held.copies, held.samples)
        held.sizes = tensor_norms(held.copies or [])  # while the copies are in the cache
        self._running.add(entry)

    @torch.no_grad()
    def after_step(self, entry: str, optimizer: torch.optim.Optimizer) -> None:
        if entry not in self._running or self.observer is None:
            return
        self._running.discard(entry)
        held = self._held[entry]
        params, copies = held.params, held.copies or []
        # the gradients the step took (an optimizer does not change them), unscaled as the observer saw them
        graded = [(name, p.grad) for name, p in zip(held.names, params, strict=True) if p.grad is not None]
        sizes = held.sizes
        if copies:  # the update, negated (the copies are taken again at the next step)
            torch._foreach_sub_(copies, held.samples)
        norms = tensor_norms([*copies, *(grad for _, grad in graded)])
        changes, grads = norms[:len(copies)], norms[len(copies):]
        if copies:
            self._flag(held, copies, sizes)  # a copy that is not finite: so was the parameter before the step
            self._flag(held, params, changes)
        event = self.observer.step_events[entry][-1]
        if event.scaled and event.scale:
            grads = [norm / event.scale for norm in grads]
        largest = max(range(len(grads)), key=lambda i: (not math.isfinite(grads[i]), grads[i] if math.isfinite(
            grads[i]) else 0.0)) if graded else None
        without = [p.grad is None for p in params]
        frozen = [not p.requires_grad for p in params]
        measured = Measured([], [], [], [], _total(grads) if graded else None, _nonfinite(graded, grads),
                            None if largest is None else graded[largest][0], held.names)
        for start, end in zip([0, *held.ends], held.ends, strict=False):
            weights = held.weights[start:end]
            size = _total(sizes[start:end], weights)
            measured.update_ratio.append(_total(changes[start:end], weights) / size if copies and size > 0 else None)
            measured.parameters.append(end - start)
            measured.without_grad.append(sum(without[start:end]))
            measured.frozen.append(sum(frozen[start:end]))
        self.measured.setdefault(entry, []).append(measured)

    def nonfinite_parameters(self) -> list[str]:
        """The State's parameters holding an inf or a NaN now (all of them: its modules walked again)."""
        assert self.observer is not None
        named = [(name, parameter.detach()) for name, parameter in self.observer.parameters()]
        return _nonfinite(named, tensor_norms([tensor for _, tensor in named]))

    def take_nonfinite(self, last: bool) -> list[str]:
        """The parameters seen holding an inf or a NaN in the call that just ended; after the `last` call, every
        parameter of the State is looked at."""
        found = list(self.nonfinite) + (self.nonfinite_parameters() if last else [])
        self.nonfinite = {}
        return list(dict.fromkeys(found))


def _clip_norm(clips: list[Clip], names: list[str]) -> float | None:
    """The norm before clipping of the first unused clip in the call that clipped these parameters (removed)."""
    for index, clip in enumerate(clips):
        if not set(names).isdisjoint(clip.parameters):
            return clips.pop(index).norm
    return None


def _update(entry: str, event: StepEvent, measured: Measured, scale: float | None, clips: list[Clip]) -> Update:
    # an optimizer that unscales in its own step (fused) takes non-finite gradients and skips the update
    return Update(entry, scale is not None and bool(measured.nonfinite_grads), scale, measured.grad_norm,
                  _clip_norm(clips, measured.names), measured.nonfinite_grads, event.lr, measured.update_ratio,
                  measured.parameters, measured.without_grad, measured.frozen, measured.largest_grad)


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
        updates.append(_update(entry, event, measure, scaler_step.scale if scaler_step else None, clips))
    for skipped in (s for s in record.scaler_steps if s.order is None):
        updates.append(Update(skipped.optimizer, True, skipped.scale, None, None, [], [], [], [], [], [], None))
    return TrainingStep(call.number, record.loss, updates, nonfinite_params)


def training_run(payload: TrainingPayload, workdir: pathlib.Path) -> TrainingTrace:
    """Task: `steps` observed calls of `step()`, each recorded as numbers."""
    probe = UpdateProbe()
    with observed_recipe(payload, before_step=probe.before_step,
                         after_step=probe.after_step, record_grads=False) as (recipe, observer):
        probe.start(observer)
        scaler = next((entry for entry, value in state_objects(observer.state, GradScaler)
                       if observer.scaler is not None and value is observer.scaler), None)
        trace = TrainingTrace({entry: len(optimizer.param_groups) for entry, optimizer in observer.optimizers.items()},
                              scaler, probe.nonfinite_parameters(), [])
        trace.misuse = unknown_schedule_entries(payload.scheduled, list(observer.optimizers))
        if trace.misuse is not None:
            return trace
        for call in observed_calls(recipe, observer, payload.steps, repeat_first=payload.overfit):
            measured, probe.measured = probe.measured, {}
            trace.steps.append(_training_step(call, observer.take_step_events(), measured,
                                              probe.take_nonfinite(last=call.number == payload.steps)))
    return trace


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
    max_loss_growth: float | None = None,
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
    `max_skipped_steps` steps skipped by the GradScaler), `loss_diverged` (`max_loss_growth`: a loss above that many
    times its start, the first loss returned, counted as at least 0.01 in size so that a loss starting at about 0 or
    below 0 has a scale). `tp.assert_training_healthy` judges `update_ratio=(None, 1.0)` and `max_loss_growth=100.0`
    unless told otherwise; here every verdict is off unless asked. `isolation` is "inprocess" (default), "process" or
    "spawn"; `timeout` bounds the whole check. Never raises for a FAIL; misuse raises TypeError/ValueError.
    """
    preflight = Preflight.prepare(recipe, steps=steps, minimum_steps=1, seed=seed, isolation=isolation,
                                  timeout=timeout)
    verdicts = Verdicts.validate(steps=steps, min_decrease=min_decrease, window=window, overfit=overfit,
                                 overfit_fraction=overfit_fraction, max_grad_norm=max_grad_norm,
                                 update_ratio=update_ratio, lr_schedule=lr_schedule,
                                 max_skipped_steps=max_skipped_steps, max_loss_growth=max_loss_growth)
    scheduled = tuple(verdicts.lr_schedule) if isinstance(verdicts.lr_schedule, dict) else ()
    payload = TrainingPayload(**vars(preflight.payload), overfit=verdicts.overfit, scheduled=scheduled)
    preflight = dataclasses.replace(preflight, payload=payload, config={**preflight.config, **verdicts.config()})
    return preflight.judged(TASK, TrainingTrace, TrainingResult,
                            lambda trace: judge_training(trace, preflight.config, verdicts))

