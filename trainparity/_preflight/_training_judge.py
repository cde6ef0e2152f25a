"""The training check's verdicts: what a run must show, validated before it runs and judged on its trace.

In observation order per call of `step()`: a non-finite loss; per optimizer step, non-finite gradients it stepped on,
its gradient norm above `max_grad_norm`, learning rates off `lr_schedule`, a GradScaler skip past
`max_skipped_steps`, ||update|| / ||parameters|| outside `update_ratio`; then non-finite parameters. After the last
call, the loss: whether it rose above `max_loss_growth` times its start (named in step order among the others: after
an update too large at the same or an earlier step, which explains it), its median over the last `window` calls
against the first's (`min_decrease`), or, on one batch repeated, whether it fell below `overfit_fraction` of its value
at step 1.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from trainparity._preflight._run import finite_number, once_per_path, steps_text
from trainparity._preflight._training_verdicts import (
    LOSS_FLOOR,
    LR_ATOL,
    LR_RTOL,
    Schedule,
    Verdicts,
    rates_of,
    scheduled,
)
from trainparity._results._result import TrainingResult
from trainparity._results._telemetry import TrainingStep, Update, number
from trainparity._results._violation import JsonValue, Outcome, Violation, format_scale, json_safe
from trainparity._validation import check_argument, check_misuse

NO_OPTIMIZER = ("the State holds no optimizer: its steps cannot be observed; put the optimizer in the State "
                "(tp.State(model=model, optimizer=optimizer, ...))")


@dataclasses.dataclass
class TrainingTrace:
    """One run of the training check."""

    #: optimizer entry -> how many parameter groups it has right after setup()
    optimizers: dict[str, int]
    #: the State's one enabled GradScaler, observed
    scaler: str | None
    #: the parameters holding an inf or a NaN right after setup()
    initial_nonfinite: list[str]
    steps: list[TrainingStep]
    #: the misuse found once setup() built the State (an `lr_schedule` key that names no optimizer of it): the run
    #: stopped there, without a step
    misuse: str | None = None


def unknown_schedule_entries(scheduled: Sequence[str], optimizers: Sequence[str]) -> str | None:
    """The misuse message for `lr_schedule` keys that name no optimizer entry of the State; None when all do."""
    unknown = sorted(set(scheduled) - set(optimizers))
    if not unknown:
        return None
    return (f"lr_schedule= names {', '.join(map(repr, unknown))}, not an optimizer of the State (they are "
            f"{', '.join(map(repr, optimizers)) or 'none'})")


# -- the judgement ----------------------------------------------------------------------------------------------


def _group(update: Update, group: int) -> str:
    return f"optimizer '{update.optimizer}' group {group}"


def _why_still(update: Update, group: int) -> str:
    """Why a parameter group's update is (about) zero."""
    n, frozen, without = update.parameters[group], update.frozen[group], update.without_grad[group]
    if update.lr[group] == 0:
        return "its learning rate is 0"
    if frozen == n:
        return f"all {n} of its parameters have requires_grad=False: they are frozen"
    if without == n:
        return (f"none of its {n} parameters had a gradient (.grad is None): the loss does not reach them, as when it "
                "is detached from the model (.detach(), .item(), torch.no_grad(), requires_grad_() on the loss)")
    parts = [f"{frozen} of its {n} parameters are frozen" if frozen else "",
             f"{without} of its {n} parameters had no gradient" if without else ""]
    return "; ".join(filter(None, parts)) or "its learning rate is too low for parameters of this scale"


class _Judge:
    def __init__(self, trace: TrainingTrace, verdicts: Verdicts) -> None:
        self.trace, self.verdicts = trace, verdicts
        self.unjudged: list[str] = []
        self.notes: list[str] = []
        self.skips = [(step.step, update) for step in trace.steps for update in step.updates if update.skipped]
        #: optimizer entry -> [(its optimizer step's index, learning rates)] of the updates taken in the run
        self.rates: dict[str, list[tuple[int, list[float]]]] = {}
        for optimizer in trace.optimizers:
            updates = [u for step in trace.steps for u in step.updates if u.optimizer == optimizer]
            self.rates[optimizer] = [(index, u.lr) for index, u in enumerate(updates) if not u.skipped]
        #: optimizer entry -> [(index, step)] of the updates a list schedule did not reach
        self.beyond: dict[str, list[int]] = {}
        self.counts: dict[str, int] = dict.fromkeys(trace.optimizers, 0)
        self.largest_ratio: tuple[float, int] | None = None
        self.skipped_so_far = 0
        self.shifts: dict[str, int | None] = {}
        #: optimizer entry -> the steps whose learning rate is 0 as lr_schedule declares (their update is not judged)
        self.resting: dict[str, list[int]] = {}
        #: (optimizer entry, group) whose parameters were all zero before its last update (its ratio unmeasurable)
        self.from_zero: set[tuple[str, int]] = set()

    # -- the learning rate ----------------------------------------------------------------------------------

    def schedule(self, optimizer: str) -> Schedule | None:
        schedule = self.verdicts.lr_schedule
        return schedule.get(optimizer) if isinstance(schedule, dict) else schedule

    def expected(self, optimizer: str, index: int, groups: int) -> list[float] | None:
        """The schedule's learning rates for an optimizer step, one per group; None past the end of a list."""
        schedule = self.schedule(optimizer)
        if schedule is None or index < 0 or (not callable(schedule) and index >= len(schedule)):
            return None
        where = f"lr_schedule({index})" if callable(schedule) else f"lr_schedule[{index}]"
        rates = rates_of(scheduled(schedule, index, where) if callable(schedule) else schedule[index], where)
        if isinstance(rates, float):
            return [rates] * groups
        check_argument(len(rates) == groups, f"{where} holds {len(rates)} learning rates, but optimizer "
                       f"'{optimizer}' has {groups} parameter groups: give one per group, or one float for all")
        return rates

    def shift(self, optimizer: str) -> int | None:
        """+1 when every learning rate is the schedule's for the next optimizer step, -1 for the one before."""
        if optimizer not in self.shifts:
            self.shifts[optimizer] = self._shift(optimizer)
        return self.shifts[optimizer]

    def _probed(self, optimizer: str, index: int, groups: int) -> list[float] | None:
        """`expected` for an optimizer step the run may not have taken (the one after its last): a schedule that
        has no learning rate there (raises, or gives no number) has none."""
        try:
            return self.expected(optimizer, index, groups)
        except (TypeError, ValueError):
            return None

    def _shift(self, optimizer: str) -> int | None:
        for shift in (1, -1):
            compared = [(rates, self._probed(optimizer, index + shift, len(rates)))
                        for index, rates in self.rates.get(optimizer, [])]
            pairs = [(rates, wanted) for rates, wanted in compared if wanted is not None]
            if pairs and all(_close(a, w) for rates, wanted in pairs for a, w in zip(rates, wanted, strict=True)):
                return shift
        return None

    def lr_mismatch(self, step: int, update: Update, index: int) -> list[Violation]:
        wanted = self.expected(update.optimizer, index, len(update.lr))
        if wanted is None:
            if self.schedule(update.optimizer) is not None:
                self.beyond.setdefault(update.optimizer, []).append(index)
            return []
        found = []
        for group, (actual, expected) in enumerate(zip(update.lr, wanted, strict=True)):
            if _close(actual, expected):
                continue
            shift = self.shift(update.optimizer)
            how = {1: (" At every optimizer step the learning rate is the schedule's for the next one: the scheduler "
                       "runs one step ahead, as when scheduler.step() is called before optimizer.step() (or once "
                       "more before training starts); call it after optimizer.step(). (Or lr_schedule counts "
                       "optimizer steps from 1: its index 0 is the first.)"),
                   -1: (" At every optimizer step the learning rate is the schedule's for the one before: the "
                        "scheduler runs one step behind, as when it was stepped once less than the optimizer "
                        "before training (its first step() skipped)."),
                   None: ""}[shift]
            rows = self.rates[update.optimizer][:6]
            shown = ", ".join(number(rates[group]) for _, rates in rows)
            wanted_rows = (self.expected(update.optimizer, i, len(r)) for i, r in rows)
            scheduled = ", ".join(number(w[group]) for w in wanted_rows if w is not None)
            found.append(Violation(
                "lr_mismatch", f"{update.optimizer}.param_groups.{group}.lr",
                f"The learning rate of {_group(update, group)} at step {step} (its optimizer step {index + 1}, "
                f"lr_schedule index {index}) is {number(actual)}, where lr_schedule says {number(expected)} (within "
                f"a relative {LR_RTOL:g}).{how}\nLearning rates at its first optimizer steps: {shown}; "
                f"lr_schedule: {scheduled}.", step=step, expected=expected, actual=actual, cause="lr_mismatch"))
        return found

    # -- one call of step() ---------------------------------------------------------------------------------

    def update_ratio(self, step: int, update: Update, index: int) -> list[Violation]:
        assert self.verdicts.update_ratio is not None
        low, high = self.verdicts.update_ratio
        declared = self.expected(update.optimizer, index, len(update.lr))
        found = []
        for group, ratio in enumerate(update.update_ratio):
            grown = (update.optimizer, group) in self.from_zero
            self.from_zero.discard((update.optimizer, group))
            if ratio is None and update.parameters[group] and update.lr[group]:
                self.from_zero.add((update.optimizer, group))  # parameters all zero: the next update is as large
            if ratio is None or not math.isfinite(ratio):
                continue
            if grown and high is not None and ratio > high:
                self.notes.append(f"The update of {_group(update, group)} at step {step} ({number(ratio)} times its "
                                  "parameters' norm) was not held to update_ratio's upper bound: its parameters were "
                                  "all zero before its optimizer step before, so that they are about one update large.")
                continue
            if declared is not None and declared[group] == 0 and update.lr[group] == 0:
                self.resting.setdefault(update.optimizer, []).append(step)  # a warmup from 0: as declared
                continue
            path = f"{update.optimizer}.param_groups.{group}.update_ratio"
            what = (f"The update of {_group(update, group)} at step {step} is {number(ratio)} times its parameters' "
                    "norm (||update|| / ||parameters||, the classic heuristic wants about 1e-3)")
            if low is not None and ratio < low:
                found.append(Violation("update_too_small", path, f"{what}, below update_ratio's lower bound "
                                       f"{number(low)}: {_why_still(update, group)}.", step=step, expected=low,
                                       actual=ratio, cause="update_too_small"))
            elif high is not None and ratio > high:
                found.append(Violation("update_too_large", path, f"{what}, above update_ratio's upper bound "
                                       f"{number(high)}: a learning rate too high (lr={number(update.lr[group])}) for "
                                       "parameters of this scale.", step=step, expected=high, actual=ratio,
                                       cause="update_too_large"))
        return found

    def skipped(self, step: int) -> Violation:
        allowed = self.verdicts.max_skipped_steps
        assert allowed is not None
        taken = sum(1 for s in self.trace.steps for u in s.updates if not u.skipped and u.scale is not None)
        steps = [at for at, _ in self.skips]
        scales = ", ".join(f"{format_scale(u.scale, missing='-')} (step {at})" for at, u in self.skips[:6]) + (
            ", ..." if len(self.skips) > 6 else "")
        return Violation(
            "skipped_updates", f"{self.trace.scaler}.scale",
            f"GradScaler '{self.trace.scaler}' skipped {len(steps)} of {len(steps) + taken} optimizer steps "
            f"({steps_text(steps[:10])}{', ...' if len(steps) > 10 else ''}) because their gradients held an inf or "
            f"a NaN, at most {allowed} allowed (max_skipped_steps={allowed}): a skipped step updates nothing. Loss "
            f"scale at the skipped steps: {scales}. A scale that never backs off (a static loss scale passed to "
            "scaler.update(new_scale)) or a model that overflows at every scale skips every step.",
            step=step, expected=allowed, actual=len(steps), cause="skipped_updates")

    def call(self, step: TrainingStep) -> list[Violation]:
        verdicts, n, found = self.verdicts, step.step, []
        if not finite_number(step.loss):
            large = (f" It followed updates of up to {number(self.largest_ratio[0])} times the parameters' norm "
                     f"(step {self.largest_ratio[1]}): a learning rate too high makes the loss diverge."
                     if self.largest_ratio is not None and self.largest_ratio[0] > 1 else "")
            found.append(Violation("nonfinite", "loss", f"step() returned a non-finite loss ({step.loss}) at step {n}: "
                                   f"the forward pass produced an inf or a NaN.{large}", step=n, expected="finite",
                                   actual=json_safe(step.loss), cause="nonfinite"))
        for update in step.updates:
            index = self.counts.get(update.optimizer, 0)
            self.counts[update.optimizer] = index + 1
            if update.skipped:
                if self.skipped_so_far == verdicts.max_skipped_steps:
                    found.append(self.skipped(n))
                self.skipped_so_far += 1
                continue
            ratios = [r for r in update.update_ratio if r is not None and math.isfinite(r)]
            if ratios and (self.largest_ratio is None or max(ratios) > self.largest_ratio[0]):
                self.largest_ratio = (max(ratios), n)
            if update.nonfinite_grads:
                found.append(Violation(
                    "nonfinite", f"gradients.{update.nonfinite_grads[0]}",
                    f"Optimizer '{update.optimizer}' stepped at step {n} on gradients holding an inf or a NaN (of "
                    f"{', '.join(update.nonfinite_grads)}): the parameters it updates become non-finite. Find where "
                    "they come from (torch.autograd.set_detect_anomaly), or skip such steps (an enabled GradScaler's "
                    "scaler.step() does).", step=n, expected="finite", cause="nonfinite"))
            norm = update.judged_norm
            if verdicts.max_grad_norm is not None and norm is not None and math.isfinite(norm) and (
                    norm > verdicts.max_grad_norm):
                clipped = (f" The loop clipped it to {number(update.grad_norm)} before the step." if update.clip_norm
                           is not None and update.grad_norm is not None and update.grad_norm < norm else "")
                found.append(Violation(
                    "grad_norm_exceeded", f"{update.optimizer}.grad_norm",
                    f"The gradient norm of optimizer '{update.optimizer}' at step {n} (the L2 norm of its parameters' "
                    f"gradients together, unscaled, before clipping) is {number(norm)}, above max_grad_norm="
                    f"{number(verdicts.max_grad_norm)}; the largest is {update.largest_grad}'s.{clipped} Gradients "
                    "that grow this large explode: a learning rate too high, a loss summed instead of averaged, or an "
                    "unnormalized input.", step=n, expected=verdicts.max_grad_norm, actual=norm,
                    cause="grad_norm_exceeded"))
            if verdicts.lr_schedule is not None:
                found += self.lr_mismatch(n, update, index)
            if verdicts.update_ratio is not None:
                found += self.update_ratio(n, update, index)
        if step.nonfinite_params:
            names = step.nonfinite_params
            found.append(Violation("nonfinite", f"parameters.{names[0]}", f"After step {n}, {len(names)} "
                                   f"parameter{'s' if len(names) != 1 else ''} hold an inf or a NaN: "
                                   f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}.", step=n,
                                   expected="finite", cause="nonfinite"))
        return found

    # -- the loss, after the run ----------------------------------------------------------------------------

    def still(self) -> str:
        """Why the run may not have learned, from what its updates show; empty when they show nothing wrong."""
        updates = [u for step in self.trace.steps for u in step.updates]
        taken = [u for u in updates if not u.skipped]
        if not updates:
            return (" No optimizer of the State stepped: call optimizer.step() (on an optimizer the State holds)."
                    if self.trace.optimizers else "")
        if not taken:
            return f" The GradScaler skipped every optimizer step ({len(updates)}): nothing was updated."
        groups = {(u.optimizer, group): u for u in taken for group in range(len(u.update_ratio))}
        still = [(u, group) for (optimizer, group), u in groups.items()
                 if all(not t.update_ratio[group] for t in taken if t.optimizer == optimizer)]
        if still and len(still) == len(groups):
            return f" No optimizer step changed a parameter ({_group(*still[0])}: {_why_still(*still[0])})."
        if still:
            return "".join(f" No optimizer step changed the parameters of {_group(u, group)}: "
                           f"{_why_still(u, group)}." for u, group in still)
        if self.largest_ratio is not None and self.largest_ratio[0] > 1:
            return (f" Updates reached {number(self.largest_ratio[0])} times the parameters' norm (step "
                    f"{self.largest_ratio[1]}): a learning rate too high.")
        return ""

    def diverged(self) -> Violation | None:
        """`loss_diverged`: the first step whose loss is above `max_loss_growth` times its start (the first loss
        returned, counted as at least LOSS_FLOOR in size)."""
        growth, steps = self.verdicts.max_loss_growth, self.trace.steps
        if growth is None or not steps:
            return None
        losses = [(step.step, step.loss) for step in steps if step.loss is not None]
        if not losses:
            self.notes.append(f"step() returned no loss: whether it diverged (max_loss_growth={number(growth)}) was "
                              "not judged.")
            return None
        (begin, start), later = losses[0], [(at, loss) for at, loss in losses[1:] if math.isfinite(loss)]
        if not math.isfinite(start):
            return None  # the nonfinite violation says why
        threshold = growth * max(abs(start), LOSS_FLOOR)
        above = [(at, loss) for at, loss in later if loss > threshold]
        if not above:
            if later:
                at, peak = max(later, key=lambda item: item[1])
                self.notes.append(f"Loss: at most {number(peak)} (step {at}), below max_loss_growth="
                                  f"{number(growth)} times its start {number(start)} (step {begin}).")
            return None
        at, loss = above[0]
        before = [(ratio, s.step) for s in steps if s.step < at for u in s.updates if not u.skipped
                  for ratio in u.update_ratio if ratio is not None and math.isfinite(ratio)]
        largest = max(before, default=None)
        why = (f"It followed updates of up to {number(largest[0])} times the parameters' norm (step {largest[1]}): a "
               "learning rate too high." if largest is not None and largest[0] > 1 else
               "A learning rate too high, gradients that explode unclipped, or batches on another scale than the "
               "first make a loss diverge.")
        shown = [(s, v) for s, v in losses if s <= at][-6:]
        also = f"\nAlso above it at {steps_text([s for s, _ in above[1:11]])}{', ...' if len(above) > 11 else ''}." \
            if len(above) > 1 else ""
        floor = f", counted as {number(LOSS_FLOOR)} in size" if abs(start) < LOSS_FLOOR else ""
        return Violation(
            "loss_diverged", "loss",
            f"The loss diverged: it is {number(loss)} at step {at}, above {number(threshold)} (max_loss_growth="
            f"{number(growth)} times its start, {number(start)} at step {begin}{floor}). {why}\nLosses at "
            f"{steps_text([s for s, _ in shown])}: {', '.join(number(v) for _, v in shown)}.{also}", step=at,
            expected=threshold, actual=loss, cause="loss_diverged")

    def loss(self) -> list[Violation]:
        verdicts, steps = self.verdicts, self.trace.steps
        if verdicts.min_decrease is None and not verdicts.overfit:
            return []
        losses = [step.loss for step in steps]
        missing = next((step.step for step in steps if step.loss is None), None)
        if missing is not None:
            self.unjudged.append(f"step() returned no loss at step {missing}: return it, so that the loss can be "
                                 "judged")
            return []
        values = [float(loss) for loss in losses if loss is not None]
        if not all(map(math.isfinite, values)):
            return []  # the nonfinite violation says why
        n, found = len(values), []
        if verdicts.min_decrease is not None and verdicts.window is not None:
            w = verdicts.window
            first, last = statistics.median(values[:w]), statistics.median(values[-w:])
            threshold = first - verdicts.min_decrease * abs(first)
            spans = (f"steps 1-{w}" if w > 1 else "step 1", f"steps {n - w + 1}-{n}" if w > 1 else f"step {n}")
            self.notes.append(f"Loss: median {number(first)} over {spans[0]}, {number(last)} over {spans[1]}.")
            if not last < threshold:
                found.append(Violation(
                    "loss_not_decreasing", "loss",
                    f"The loss did not decrease over {n} steps: its median over {spans[1]} is {number(last)}, not "
                    f"below {number(threshold)} (its median over {spans[0]}, {number(first)}, less min_decrease="
                    f"{number(verdicts.min_decrease)} of it).{self.still()}\nLosses at {spans[0]}: "
                    f"{', '.join(map(number, values[:w]))}; at {spans[1]}: {', '.join(map(number, values[-w:]))}.",
                    step=n, expected=threshold, actual=last, cause="loss_not_decreasing"))
        if verdicts.overfit:
            found += self.overfit(values)
        return found

    def overfit(self, values: list[float]) -> list[Violation]:
        start, n, fraction = values[0], len(values), self.verdicts.overfit_fraction
        if start <= 0:
            self.unjudged.append(f"the loss at step 1 is {number(start)}: overfitting is judged as a fall below "
                                 f"overfit_fraction of a positive starting loss")
            return []
        target = fraction * start
        reached = next((at for at, loss in enumerate(values, start=1) if loss <= target), None)
        if reached is not None:
            self.notes.append(f"On one batch repeated, the loss fell from {number(start)} to "
                              f"{number(values[reached - 1])} (below {number(fraction)} of its start) at step "
                              f"{reached}.")
            return []
        lowest = min(range(n), key=values.__getitem__)
        return [Violation(
            "not_overfitting", "loss",
            f"On one batch repeated (the recipe's first) for {n} steps, the loss never fell below {number(fraction)} "
            f"of its value at step 1 ({number(start)}, target {number(target)}): it is {number(values[-1])} at step "
            f"{n}, lowest {number(values[lowest])} at step {lowest + 1}. A model that trains memorizes one batch."
            f"{self.still()} Or take more steps.", step=n, expected=target, actual=values[lowest],
            cause="not_overfitting")]

    def summary(self) -> None:
        """Notes on what the verdicts could not see."""
        verdicts = self.verdicts
        for optimizer, taken in self.counts.items():
            if taken == 0:
                self.notes.append(f"Optimizer '{optimizer}' never stepped in {len(self.trace.steps)} calls of step().")
        if self.skips and verdicts.max_skipped_steps is None:
            shown = steps_text([at for at, _ in self.skips][:10]) + (", ..." if len(self.skips) > 10 else "")
            self.notes.append(f"GradScaler '{self.trace.scaler}' skipped {len(self.skips)} optimizer steps ({shown}): "
                              "not judged (max_skipped_steps=None).")
        for optimizer, steps in self.resting.items():
            shown = steps_text(list(dict.fromkeys(steps)))
            self.notes.append(f"The update ratio of optimizer '{optimizer}' was not judged at {shown}: lr_schedule "
                              "declares a learning rate of 0 there.")
        for optimizer, indices in self.beyond.items():
            self.notes.append(f"lr_schedule holds fewer learning rates than optimizer '{optimizer}' took steps: its "
                              f"optimizer steps {indices[0] + 1}-{indices[-1] + 1} were not judged.")


def _close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=LR_RTOL, abs_tol=LR_ATOL)


def judge_training(trace: TrainingTrace, config: dict[str, JsonValue], verdicts: Verdicts) -> TrainingResult:
    check_misuse(trace.misuse)
    judge = _Judge(trace, verdicts)
    if verdicts.optimizer_verdicts and not trace.optimizers:
        judge.unjudged.append(NO_OPTIMIZER)
    found = [Violation("nonfinite", f"parameters.{trace.initial_nonfinite[0]}", f"Right after setup(), "
                       f"{len(trace.initial_nonfinite)} parameters hold an inf or a NaN: "
                       f"{', '.join(trace.initial_nonfinite[:6])}.", step=0, expected="finite", cause="nonfinite")
             ] if trace.initial_nonfinite else []
    for step in trace.steps:
        found += judge.call(step)
    violations = once_per_path(found)
    diverged = judge.diverged()
    if diverged is not None:  # after what happened at its step or before it (an update too large explains it)
        assert diverged.step is not None
        at = next((i for i, v in enumerate(violations) if v.step is not None and v.step > diverged.step),
                  len(violations))
        violations.insert(at, diverged)
    violations += judge.loss()
    judge.summary()
    if verdicts.update_ratio is not None and verdicts.update_ratio[0] is not None:
        for optimizer, taken in judge.counts.items():
            if taken == 0 and trace.steps:
                violations.append(Violation(
                    "update_too_small", f"{optimizer}.param_groups.0.update_ratio",
                    f"Optimizer '{optimizer}' never stepped in {len(trace.steps)} calls of step(): its parameters were "
                    "not updated at all. Call optimizer.step() (on the optimizer the State holds).",
                    step=trace.steps[-1].step, expected=verdicts.update_ratio[0], actual=0.0, cause="update_too_small"))
    outcome = Outcome.FAIL if violations else Outcome.ABSTAIN if judge.unjudged else Outcome.PASS
    reason = "; ".join(judge.unjudged) if outcome is Outcome.ABSTAIN else None
    return TrainingResult(outcome, violations, judge.notes, config, reason=reason, telemetry=trace.steps)
