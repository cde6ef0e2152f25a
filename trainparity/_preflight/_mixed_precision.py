"""`check_mixed_precision`: the GradScaler's contract, non-finite values and autocast coverage, over a few
observed steps.

The run observes `steps` calls of `step()` through the observer's optimizer step hooks and its
wrappers on the State's enabled `torch.amp.GradScaler` (`unscale_`, `step`, `update`) and on the
clipping functions. Per call it records the loss, every optimizer step (whether it ran inside
`scaler.step()`, with gradients still scaled, which of the gradients it took were not finite, read
in its pre-hook with one fused reduction and no copy, and whether `scaler.step()` told it to skip), every
`scaler.step()` (the loss scale, whether it skipped the step, the scale `update()` left), every
clip, the parameters that are not finite afterwards, and what the autocast watch saw
(`_observe/_autocast.py`, judged in `_autocast.py`). The judgement runs in the parent.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

from trainparity._compat import GradScaler
from trainparity._observe._autocast import AutocastUse, AutocastWatch, RegionRequests
from trainparity._observe._observer import OBSERVATION_LOCK, Observer
from trainparity._observe._records import CallRecord, Clip, ScalerStep, StepEvent
from trainparity._preflight._autocast import AutocastRules, autocast_findings, declared_dtype
from trainparity._preflight._run import (
    Preflight,
    PreflightPayload,
    finite_number,
    nonfinite,
    observed_calls,
    observed_recipe,
    once_per_path,
    steps_text,
)
from trainparity._process import _session
from trainparity._process._options import Isolation
from trainparity._recipe._reference import RecipeSpec
from trainparity._results._result import MixedPrecisionResult
from trainparity._results._violation import Outcome, Violation, format_scale, json_safe
from trainparity._state._entries import state_objects
from trainparity._validation import check_optional_int

__all__ = ["check_mixed_precision"]

TASK = "trainparity._preflight._mixed_precision:mixed_precision_run"


@dataclasses.dataclass
class OptimizerStep:
    """One step of an optimizer of the State."""

    optimizer: str
    #: `StepEvent.order`: matched against `ScalerStep.order` to tell a step inside `scaler.step()`
    order: int
    #: the factor that still multiplied its gradients (None: unscaled, or no GradScaler observed)
    scale: float | None
    #: the parameters whose gradient held an inf or a NaN when the step took it
    nonfinite: list[str]
    #: inside `scaler.step()`, the GradScaler told the optimizer (a fused one) of an inf: it skipped the update itself
    told_to_skip: bool = False

    @classmethod
    def observe(cls, entry: str, event: StepEvent) -> OptimizerStep:
        return cls(entry, event.order, event.scale if event.scaled else None, list(event.nonfinite),
                   event.told_to_skip)

    @property
    def stepped_nonfinite(self) -> bool:
        """Whether the optimizer updated its parameters with gradients holding an inf or a NaN."""
        return bool(self.nonfinite) and not self.told_to_skip


@dataclasses.dataclass
class PrecisionStep:
    """What one call of `step()` did."""

    step: int
    loss: float | None
    optimizer_steps: list[OptimizerStep]
    scaler_steps: list[ScalerStep]
    clips: list[Clip]
    #: the parameters holding an inf or a NaN after the call
    nonfinite_params: list[str]
    #: what the call raised, accepted as a consequence of a step outside scaler.step() (the run ended)
    error: str | None = None
    #: the autocast regions and the matmul, convolution and attention ops the call ran
    autocast: AutocastUse = dataclasses.field(default_factory=AutocastUse)

    def taken(self, scaler_step: ScalerStep) -> bool:
        """Whether the optimizer updated its parameters inside `scaler_step`: it was called (an optimizer that
        unscales itself, fused, is called either way) and not told to skip the update (on finite gradients, or on
        gradients that became non-finite after the GradScaler's inf check: `nonfinite_grads_stepped`)."""
        inside = next((s for s in self.optimizer_steps if s.order == scaler_step.order), None)
        return inside is not None and not inside.told_to_skip


@dataclasses.dataclass
class PrecisionTrace:
    """One run of the mixed-precision check."""

    #: the State's enabled GradScalers, and its disabled ones, by entry
    enabled: list[str]
    disabled: list[str]
    optimizers: list[str]
    #: the parameters holding an inf or a NaN right after setup()
    initial_nonfinite: list[str]
    steps: list[PrecisionStep]

    @property
    def scaler(self) -> str | None:
        """The GradScaler observed: the only enabled one."""
        return self.enabled[0] if len(self.enabled) == 1 else None


# -- the run (in the child) -------------------------------------------------------------------------


def _nonfinite_parameters(observer: Observer) -> list[str]:
    return [name for name, parameter in observer.parameters() if nonfinite(parameter.detach())]


def _raised_in_update(error: BaseException) -> bool:
    """Whether `error` was raised inside `torch.amp.GradScaler.update`."""
    update = GradScaler.update.__code__
    frame = error.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code is update:
            return True
        frame = frame.tb_next
    return False


def mixed_precision_run(payload: PreflightPayload, workdir: pathlib.Path) -> PrecisionTrace:
    """Task: `steps` observed calls of `step()`; ends early after a call whose `scaler.step()` no
    `scaler.update()` followed (the next `scaler.step()` would raise)."""
    # The requests are recorded from before setup(), which may make the autocast context that step() enters; the
    # lock (observed_recipe's, reentrant) covers the patch of autocast they make.
    with OBSERVATION_LOCK, RegionRequests() as requests, \
            observed_recipe(payload, record_grads=False,
                            check_finite=True) as (recipe, observer), \
            AutocastWatch(observer.state, declared_dtype(type(recipe)), requests) as watch:
        scalers = list(state_objects(observer.state, GradScaler))

        def outside_scaler_step(record: CallRecord, error: Exception) -> bool:
            """Whether `error` is the GradScaler's update() refusing to run after an optimizer step outside
            scaler.step() in this call ('No inf checks were recorded prior to update')."""
            inside = {s.order for s in record.scaler_steps}
            events = (event for events in observer.step_events.values() for event in events)
            return _raised_in_update(error) and any(event.order not in inside for event in events)

        trace = PrecisionTrace([e for e, s in scalers if s.is_enabled()], [e for e, s in scalers if not s.is_enabled()],
                               list(observer.optimizers), _nonfinite_parameters(observer), [])
        for call in observed_calls(recipe, observer, payload.steps, tolerate=outside_scaler_step):
            events = sorted(((e, event) for e, events in observer.take_step_events().items() for event in events),
                            key=lambda item: item[1].order)
            record = call.record
            trace.steps.append(PrecisionStep(call.number, record.loss, [OptimizerStep.observe(*e) for e in events],
                                             record.scaler_steps, record.clips, _nonfinite_parameters(observer),
                                             call.error, watch.take()))
            if any(step.scale_after is None for step in record.scaler_steps):
                break
    return trace


# -- the judgement (in the parent) ------------------------------------------------------------------


def _nonfinite_fix(taken: OptimizerStep, direct: bool, scaler: str | None) -> str:
    """What would have kept the optimizer step on non-finite gradients from updating the parameters."""
    if not direct:  # scaler.step() calls an optimizer only when the inf check found nothing, or tells it to skip
        return (f"GradScaler '{scaler}' found no inf or NaN when it checked them in scaler.unscale_(), and "
                "scaler.step() trusts that check: they became non-finite after it, between scaler.unscale_() and "
                "scaler.step() (a division by the norm of an all-zero gradient, say). Keep them finite there (an eps "
                "in the division).")
    if scaler is not None and taken.scale is not None:
        return "scaler.step(optimizer) would have skipped it."
    if scaler is not None:
        return ("scaler.step(optimizer) skips a step whose gradients its check in scaler.unscale_() found non-finite.")
    return "skip such steps (an enabled GradScaler's scaler.step() does), or find where they come from."


def _step_violations(step: PrecisionStep, scaler: str | None) -> list[Violation]:
    """One call's findings in the order they happen: forward, clipping, optimizer steps, parameters, update."""
    n, found = step.step, []
    if not finite_number(step.loss):
        found.append(Violation(
            "nonfinite_loss", "loss",
            f"step() returned a non-finite loss ({step.loss}) at step {n}: the forward pass produced an inf or a NaN, "
            "so its gradients are not finite either. Find where (torch.autograd.set_detect_anomaly, a log of 0, "
            "a division by a zero count, an overflow in float16).", step=n, expected="finite",
            actual=json_safe(step.loss),
            cause="nonfinite_loss"))
    for clip in step.clips:
        if clip.scaled:
            first = clip.parameters[0] if clip.parameters else "<none>"
            scale = format_scale(clip.scale, missing="?")
            found.append(Violation(
                "clip_before_unscale", f"gradients.{first}",
                f"In step {n}, {clip.function}() clipped gradients that GradScaler '{scaler}' still scaled by "
                f"{scale}: the threshold applied to gradients {scale} times too large. "
                "Call scaler.unscale_(optimizer) before clipping.", step=n, cause="clip_before_unscale"))
    inside = {s.order for s in step.scaler_steps}
    for taken in step.optimizer_steps:
        direct = taken.order not in inside
        if direct and scaler is not None:
            how = (f"on gradients GradScaler '{scaler}' still scaled by {format_scale(taken.scale, missing='?')} (an "
                   "update that many times too large)" if taken.scale is not None else "after scaler.unscale_()")
            found.append(Violation(
                "scaler_step_bypassed", taken.optimizer,
                f"Optimizer '{taken.optimizer}' stepped in step {n} outside scaler.step(), {how}: steps whose "
                "gradients hold an inf or a NaN are not skipped, and the loss scale never adapts. Call "
                "scaler.step(optimizer) instead of optimizer.step(), then scaler.update().",
                step=n, cause="scaler_step_bypassed"))
        if taken.stepped_nonfinite:
            found.append(Violation(
                "nonfinite_grads_stepped", f"gradients.{taken.nonfinite[0]}",
                f"Optimizer '{taken.optimizer}' stepped in step {n}{'' if direct else ' inside scaler.step()'} on "
                f"gradients holding an inf or a NaN (of {', '.join(taken.nonfinite)}): the parameters it updates "
                f"become non-finite; {_nonfinite_fix(taken, direct, scaler)}", step=n, cause="nonfinite_grads_stepped"))
    # Named by the earliest cause this step shows: the step that consumed non-finite gradients, else the loss.
    cause = ("nonfinite_grads_stepped" if any(taken.stepped_nonfinite for taken in step.optimizer_steps) else
             "nonfinite_loss" if not finite_number(step.loss) else "nonfinite_params")
    found += [Violation("nonfinite_params", f"parameters.{name}", f"Parameter '{name}' holds an inf or a NaN after "
                        f"step {n}.", step=n, cause=cause) for name in step.nonfinite_params]
    for scaler_step in step.scaler_steps:
        if scaler_step.scale_after is None and scaler is not None:
            found.append(Violation(
                "scaler_update_missing", scaler,
                f"scaler.step(optimizer '{scaler_step.optimizer}') ran in step {n}, but no scaler.update() followed "
                "before step() returned: the loss scale never adapts (a skipped step does not lower it), and the "
                "next scaler.step() raises 'step() has already been called since the last update()'. Call "
                "scaler.update() once per iteration, after scaler.step().", step=n, cause="scaler_update_missing"))
            break
    return found


def _skipped_violation(trace: PrecisionTrace, scaler: str, max_skipped_steps: int | None) -> Violation | None:
    calls = [(step, s, step.taken(s)) for step in trace.steps for s in step.scaler_steps]
    skipped = [step.step for step, _, taken in calls if not taken]
    allowed = len(calls) // 2 if max_skipped_steps is None else max_skipped_steps
    if len(skipped) <= allowed:
        return None
    rule = (f"max_skipped_steps={max_skipped_steps}" if max_skipped_steps is not None else
            "by default at most half of the scaler steps")
    nonfinite_losses = [step.step for step in trace.steps if not finite_number(step.loss)]
    why = (f"the loss itself was not finite in {steps_text(nonfinite_losses)}" if nonfinite_losses else
           "they stay so at every scale tried: look for an overflow or a NaN in the model")
    return Violation(
        "skipped_steps", f"{scaler}.scale",
        f"GradScaler '{scaler}' skipped {len(skipped)} of {len(calls)} optimizer steps ({steps_text(skipped)}) because "
        f"their gradients held an inf or a NaN; {why}. At most {allowed} allowed ({rule}).\n{_scale_trace(trace)}",
        step=skipped[allowed], expected=allowed, actual=len(skipped), cause="skipped_steps")


def _scale_trace(trace: PrecisionTrace) -> str:
    """`Loss scale at each scaler.step(): 65536 (step 1, skipped), 32768 (step 2); after the last update(): 32768.`"""
    shown = [f"{format_scale(s.scale, missing='?')} (step {step.step}{'' if step.taken(s) else ', skipped'})"
             for step in trace.steps for s in step.scaler_steps]
    last = next((s.scale_after for step in reversed(trace.steps) for s in reversed(step.scaler_steps)
                 if s.scale_after is not None), None)
    after = f"; after the last update(): {format_scale(last, missing='?')}" if last is not None else ""
    return f"Loss scale at each scaler.step(): {', '.join(shown)}{after}."


def judge_mixed_precision(trace: PrecisionTrace, config: dict[str, Any], max_skipped_steps: int | None,
                          rules: AutocastRules) -> MixedPrecisionResult:
    if not trace.optimizers:
        return MixedPrecisionResult(Outcome.ABSTAIN, config=config, reason="the State holds no optimizer: its steps "
                                    "cannot be observed; put the optimizer (and the GradScaler) in the State")
    scaler, notes = trace.scaler, []
    if len(trace.enabled) > 1:
        notes.append(f"The State holds {len(trace.enabled)} enabled GradScalers ({', '.join(trace.enabled)}): which "
                     "one scaled a gradient cannot be told apart, so only non-finite values were judged.")
    elif scaler is None:
        disabled = f" (disabled: {', '.join(trace.disabled)})" if trace.disabled else ""
        notes.append(f"The State holds no enabled torch.amp.GradScaler{disabled}: the scaler's contract "
                     "(scaler_step_bypassed, scaler_update_missing, clip_before_unscale, skipped_steps) was not "
                     "judged, only non-finite values.")
    found = [Violation("nonfinite_params", f"parameters.{name}", f"Parameter '{name}' holds an inf or a NaN right "
                       "after setup().", step=0, cause="nonfinite_params") for name in trace.initial_nonfinite]
    autocast, autocast_notes = autocast_findings([(step.step, step.autocast) for step in trace.steps], rules)
    for step in trace.steps:
        found += autocast[step.step]  # the forward comes first
        found += _step_violations(step, scaler)
        if step.error is not None:
            notes.append(f"Step {step.step} then raised {step.error} (scaler.update() after no scaler.step()); "
                         "the run ended there.")
    last = trace.steps[-1].step if trace.steps else 0
    if last < config["steps"] and trace.steps and trace.steps[-1].error is None:
        notes.append(f"The run ended after step {last} of {config['steps']}: the next scaler.step() would raise "
                     "without scaler.update().")
    violations = once_per_path(found)
    if scaler is not None and any(step.scaler_steps for step in trace.steps):
        skipped = _skipped_violation(trace, scaler, max_skipped_steps)
        if skipped is not None:
            violations.append(skipped)
        if violations[:1] != [skipped]:  # the report shows the loss-scale trace once: in the first violation, or here
            notes.append(f"GradScaler '{scaler}': {_scale_trace(trace)}")
    notes += autocast_notes
    return MixedPrecisionResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes, config)


@_session.recorded
def check_mixed_precision(
    recipe: RecipeSpec,
    *,
    steps: int = 4,
    max_skipped_steps: int | None = None,
    allow_float32: str | Sequence[str] | None = None,
    max_float32_share: float = 0.0,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
) -> MixedPrecisionResult:
    """Check the recipe's mixed-precision loop: the GradScaler's contract, non-finite values and autocast coverage.

    Observes `steps` calls of `step()` and reports optimizer steps outside `scaler.step()`
    (`scaler_step_bypassed`), a `scaler.step()` that no `scaler.update()` follows
    (`scaler_update_missing`), clipping of still-scaled gradients (`clip_before_unscale`), steps
    on gradients holding an inf or a NaN, whatever made them (`nonfinite_grads_stepped`: also inside
    `scaler.step()`, on gradients made non-finite after `scaler.unscale_()`), more skipped steps than
    `max_skipped_steps` (default: half of the scaler steps; `skipped_steps`, with the loss-scale
    trace), non-finite losses (`nonfinite_loss`) and parameters (`nonfinite_params`). The
    GradScaler is the State's one enabled `torch.amp.GradScaler` (CPU or CUDA). Autocast: an
    enabled region (or a recipe declaring `autocast_dtype`) whose matmul, convolution and attention
    ops all ran in full precision (`autocast_ineffective`), and such ops run in float32 inside an
    enabled region, per module, beyond `max_float32_share` of their FLOPs outside the modules the
    globs of `allow_float32` name (`autocast_bypassed`). `isolation` is "inprocess" (default),
    "process" or "spawn"; `timeout` bounds the whole check (in-process too: the run is interrupted at the
    deadline). Never raises for a FAIL; misuse raises tp.InvalidArgument (a TypeError and a ValueError).
    """
    max_skipped_steps = check_optional_int("max_skipped_steps", max_skipped_steps, 0, "half of the scaler steps")
    preflight = Preflight.prepare(recipe, steps=steps, minimum_steps=1, seed=seed, isolation=isolation,
                                  timeout=timeout)
    rules = AutocastRules.validate(declared_dtype(preflight.payload.recipe.recipe_class()), allow_float32,
                                   max_float32_share)
    preflight = dataclasses.replace(preflight, config={**preflight.config, "max_skipped_steps": max_skipped_steps,
                                                       **rules.config()})
    return preflight.judged(TASK, PrecisionTrace, MixedPrecisionResult,
                            lambda trace: judge_mixed_precision(trace, preflight.config, max_skipped_steps, rules))
