"""The accumulation check's verdict on two traces, window by window and phase by phase.

Per window, in observation order: `loss_accounting` (only when `step` returns
`tp.LossAccounting`), `optimizer_steps`, the contracts of clipping and stepping with a GradScaler,
`gradients.<param>`, the learning rates at the step, `parameters.<param>`, the optimizers' state
and the schedulers' state (by State path). The first window that diverges ends the judgement
(later windows start from diverged state).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import torch

from trainparity._accumulation._diagnoses import (
    DENOMINATOR_DIAGNOSES,
    GRADIENT_DIAGNOSES,
    LOST_OR_DUPLICATED,
    NO_CAUSE,
    VALUE_DIAGNOSES,
    GradientEvidence,
    LossEvidence,
    diagnose,
    relative,
)
from trainparity._accumulation._trace import AccumulationTrace, Window
from trainparity._observe._records import StepEvent
from trainparity._results._result import AccumulationResult
from trainparity._results._violation import JsonValue, Outcome, Violation, format_number, format_scale
from trainparity._state._compare import (
    EXACT,
    Comparison,
    Mismatch,
    Snapshot,
    compare_leaves,
    compare_snapshots,
    exact_like,
    ignored,
)
from trainparity._validation import check_misuse

#: causes that explain the gradients (or the losses) of a window: at one step only one of them is claimed
NUMERIC_CAUSES = frozenset({"loss_not_scaled", "loss_scaled_twice", "mean_of_means", "grads_not_reset",
                            "clip_per_microbatch", "batch_dependent_layer"})
FOLLOWS = "It follows from the earlier divergence in this window."


def _numbers(values: Sequence[float]) -> str:
    return "[" + ", ".join(format_number(v) for v in values) + "]"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _times(count: int) -> str:
    return "once" if count == 1 else _plural(count, "time")


def _indices(values: Sequence[int]) -> str:
    return ", ".join(str(i) for i, v in enumerate(values) if v)


class ContributionsNeeded:
    """The judge's answer where a gradient differs and its diagnosis reads each micro-batch's contribution, which
    the candidate's trace was recorded without: the check runs the candidate again, sampling them."""


def judge_accumulation(
    reference: AccumulationTrace,
    candidate: AccumulationTrace,
    k: int,
    comparison: Comparison,
    config: dict[str, JsonValue],
    precision: str,
    batch_dependent_mode: str,
) -> AccumulationResult | ContributionsNeeded:
    """The verdict on two traces, or ContributionsNeeded when a diagnosis needs what the candidate's trace was
    recorded without; raises ValueError when the candidate's batches could not be cut."""
    different = _different_start(reference, candidate, k, comparison, config)
    if different is not None:
        return different
    for trace in (reference, candidate):
        check_misuse(trace.input_error)
    notes = [_dropout_note(reference, config)]
    batch_dependent = sorted(set(reference.batch_dependent) | set(candidate.batch_dependent))
    if not reference.optimizers and not any(w.parameters for w in reference.windows):
        return AccumulationResult(Outcome.ABSTAIN, notes=notes, config=config, reason=(
            "the State holds no optimizer and no nn.Module with parameters, so there is nothing to compare; "
            "put the model and its optimizer in the tp.State that setup() returns"))
    if batch_dependent and batch_dependent_mode == "eval":
        notes.append(f"batch-dependent layers ran in eval mode in both runs (batch_dependent='eval'): "
                     f"{', '.join(batch_dependent)}; they normalized with their running statistics, so the "
                     "accumulation loop alone was judged")
    calls = [c for trace in (reference, candidate) for w in trace.windows for c in w.calls]
    judge_loss = all(c.accounting and c.loss is not None for c in calls)
    if not judge_loss:
        notes.append(
            "loss_accounting not judged: step() "
            + ("returned tp.LossAccounting in only some calls" if any(c.accounting for c in calls)
               else "returns a bare loss")
            + "; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, "
            "denominator) to have the normalization judged)")
    blamed = batch_dependent if batch_dependent_mode == "fail" else []
    violations: list[Violation] = []
    # Notes that hold in several windows are said once: template (with "{windows}") -> window numbers.
    window_notes: dict[str, list[int]] = {}
    judged = 0
    for index, (ref_window, cand_window) in enumerate(zip(reference.windows, candidate.windows, strict=True), 1):
        for mismatch in compare_snapshots(ref_window.batch, cand_window.batch, EXACT):
            violation = Violation("batch_mismatch", mismatch.path, mismatch.message, step=index,
                                  expected=mismatch.expected, actual=mismatch.actual)
            return AccumulationResult(Outcome.ABSTAIN, [violation], notes, config, reason=(
                f"batches() yields another full batch in the candidate run at window {index} ({mismatch.path}): "
                "the two runs must train on the same data"))
        previous = candidate.windows[index - 2] if index > 1 else None
        judgement = WindowJudgement(index, ref_window, cand_window, previous, k, comparison, candidate, precision,
                                    blamed)
        found = judgement.judge(judge_loss)
        if judgement.contributions_needed:
            return ContributionsNeeded()
        judged = index
        for template in judgement.notes:
            window_notes.setdefault(template, []).append(index)
        if found:
            violations = found
            break
    for template, indices in window_notes.items():
        numbers = ", ".join(map(str, indices))
        notes.append(template.replace("{windows}", f"window {numbers}" if len(indices) == 1 else f"windows {numbers}"))
    if violations and judged < len(reference.windows):
        notes.append(f"windows after window {judged} not judged: they start from the diverged state")
    if batch_dependent and batch_dependent_mode == "fail" and not violations:
        notes.append(f"batch-dependent layers ran in training mode ({', '.join(batch_dependent)}), yet nothing "
                     "diverged")
    drawn = random_draws(reference.windows[:judged], candidate.windows[:judged])
    return _with_randomness(drawn, AccumulationResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes,
                                                      config))


def _different_start(reference: AccumulationTrace, candidate: AccumulationTrace, k: int, comparison: Comparison,
                     config: dict[str, JsonValue]) -> AccumulationResult | None:
    """ABSTAIN when the two runs do not start from the same State and RNG streams: nothing can be judged."""
    exact = exact_like(comparison)
    initial = itertools.chain(compare_snapshots(reference.initial, candidate.initial, exact),
                              compare_snapshots(reference.initial_rng, candidate.initial_rng, exact))
    for mismatch in initial:
        violation = Violation("initial_state_mismatch", mismatch.path, mismatch.message, expected=mismatch.expected,
                              actual=mismatch.actual)
        return AccumulationResult(Outcome.ABSTAIN, [violation], config=config, reason=(
            f"the State right after setup() differs between accumulation_steps=1 and accumulation_steps={k} "
            f"at {mismatch.path}: the two runs do not start from the same state"))
    return None


def _with_randomness(drawn: str | None, result: AccumulationResult) -> AccumulationResult:
    """What the runs' random draws say of the verdict: a divergence where they differ cannot be judged (ABSTAIN)."""
    if drawn == "differ":
        drew = ("step() draws random numbers differently in the two runs (the global RNG streams advance at other "
                "moments with micro-batches than with the full batch)")
        if result.violations:
            return AccumulationResult(Outcome.ABSTAIN, result.violations, result.notes, result.config, reason=(
                f"{drew}: the divergence may come from the randomness; make step() deterministic (or draw the same "
                "numbers once per window) to judge accumulation"))
        result.notes.append(f"{drew}, yet nothing diverged")
    elif drawn == "same":
        result.notes.append("step() draws random numbers, the same ones at the same moments in both runs (before, "
                            "between and after the optimizer steps of each window): they cannot explain a divergence")
    return result


def _dropout_note(reference: AccumulationTrace, config: dict[str, JsonValue]) -> str:
    if not config["disable_dropout"]:
        return "dropout left active in both runs (disable_dropout=False)"
    dropout = reference.dropout
    disabled = dropout.modules + [f"{name}(p>0) calls" for name in dropout.functions]
    parts = [", ".join(disabled) if disabled else "nothing was active"]
    if dropout.inactive:
        parts.append(f"dropout modules already at p=0: {', '.join(dropout.inactive)}")
    return f"dropout disabled in both runs (disable_dropout=True): {'; '.join(parts)}"


def random_draws(reference: Sequence[Window], candidate: Sequence[Window]) -> str | None:
    """Whether step() drew from the global RNG streams: None (never), "same" or "differ".

    The draws are the same when, in every window, the streams stand at the same states in both
    runs when the window begins, at each optimizer step and when it ends, and every stretch
    between two of these moments in which the candidate drew lies within one of its calls: an
    evaluation run once per window, not noise drawn per micro-batch.
    """
    drew = False
    for ref, cand in zip(reference, candidate, strict=True):
        ref_marks, cand_marks = _moments(ref), _moments(cand)
        if len({fingerprint for _, fingerprint, _ in ref_marks + cand_marks}) == 1:
            continue
        drew = True
        if [f for _, f, sync in ref_marks if sync] != [f for _, f, sync in cand_marks if sync]:
            return "differ"
        drawing_calls: set[int] = set()
        for (call, fingerprint, _), (_, following, sync) in zip(cand_marks, cand_marks[1:], strict=False):
            if fingerprint != following:
                drawing_calls.add(call)
            if sync:
                if len(drawing_calls) > 1:
                    return "differ"
                drawing_calls = set()
    return "same" if drew else None


def _moments(window: Window) -> list[tuple[int, str, bool]]:
    """(call, RNG fingerprint, whether it is a moment both runs share) in time order."""
    events = window.step_events()
    marks: list[tuple[int, str, bool]] = []
    for index, call in enumerate(window.calls):
        marks.append((index, call.rng_start, index == 0))
        marks += [(index, event.rng, True) for _, event in events if event.call == index]
        marks.append((index, call.rng_end, index == len(window.calls) - 1))
    return marks


@dataclasses.dataclass
class Draft:
    """A violation before the window's diagnoses are made consistent: its parts, not yet one message."""

    kind: str
    path: str
    step: int
    #: the first line: what differs
    preface: str
    #: the torch.testing-style detail ("" when the preface says it all)
    detail: str
    cause: str | None
    #: the diagnosis (or why there is none)
    explanation: str
    #: observations shown after the diagnosis
    observed: tuple[str, ...] = ()
    expected: JsonValue = None
    actual: JsonValue = None
    position: int | None = None

    def violation(self) -> Violation:
        tail = [line for line in (self.explanation, *self.observed) if line]
        head = [self.preface, self.detail] if self.detail else [self.preface]
        message = "\n".join([*head, *([""] + tail if tail and self.detail else tail)])
        return Violation(self.kind, self.path, message, step=self.step, expected=self.expected, actual=self.actual,
                         cause=self.cause, position=self.position)


class WindowJudgement:
    """The judgement of one window: the reference's full-batch call vs the candidate's k calls."""

    def __init__(
        self,
        index: int,
        ref: Window,
        cand: Window,
        previous: Window | None,
        k: int,
        comparison: Comparison,
        candidate: AccumulationTrace,
        precision: str,
        batch_dependent: list[str],
    ) -> None:
        self.index, self.ref, self.cand, self.previous = index, ref, cand, previous
        self.k, self.comparison, self.precision = k, comparison, precision
        self.optimizers, self.stride = candidate.optimizers, candidate.stride
        self.contributions_sampled = candidate.contributions_sampled
        #: a gradient differed whose diagnosis reads the micro-batches' contributions, which were not sampled
        self.contributions_needed = False
        self.batch_dependent = batch_dependent
        #: notes about this window, "{windows}" standing for where they hold
        self.notes: list[str] = []

    def judge(self, judge_loss: bool) -> list[Violation]:
        accounting = self._loss_accounting() if judge_loss else []
        steps, diverged = self._optimizer_steps()
        found = steps + self._contracts()
        found += self._gradients(diverged, earlier=bool(found))
        scheduler_cause = self._scheduler_cause()
        found += self._learning_rates(diverged, scheduler_cause, earlier=bool(found))
        for what, ref, cand, kind in (
            ("The parameter", self.ref.parameters, self.cand.parameters, "parameter_mismatch"),
            ("The optimizer state", self.ref.optimizers, self.cand.optimizers, "optimizer_state_mismatch"),
            ("The scheduler state", self.ref.schedulers, self.cand.schedulers, "scheduler_state_mismatch"),
        ):
            own_cause = scheduler_cause if kind == "scheduler_state_mismatch" else None
            found += self._end_state(what, ref, cand, kind, bool(found), own_cause)
        self._clip_note(found)
        if accounting and not found:
            # A declared value that disagrees while training agrees is a reporting convention, not a bug.
            first = accounting[0]
            self.notes.append(
                "loss_accounting differs in {windows}"
                + (f" (it would be diagnosed {first.cause})" if first.cause else "")
                + " but gradients, parameters, optimizer and scheduler state agree with the reference: "
                "LossAccounting.value should be the loss back-propagated by that call; not failed")
            accounting = []
        if steps and min(v.position for v in steps if v.position is not None) < self.k - 1:
            # A step inside the window is observed before the window's losses can be summed, and the
            # later micro-batches' losses were computed on the stepped parameters: it comes first.
            return _consistent(found + accounting)
        return _consistent(accounting + found)

    # -- what was returned ------------------------------------------------------------------------

    def _losses(self) -> str:
        ref = self.ref.calls[0].loss
        cand = [c.loss for c in self.cand.calls]
        total = sum(v for v in cand if v is not None) if all(v is not None for v in cand) else None
        return (f"Losses returned by step(): reference {format_number(ref)}; candidate micro-batches "
                f"{', '.join(format_number(v) for v in cand)} (sum {format_number(total)}).")

    def _loss_accounting(self) -> list[Draft]:
        ref = self.ref.calls[0]
        calls = self.cand.calls
        assert ref.loss is not None and all(c.loss is not None for c in calls)
        evidence = LossEvidence(self.k, ref.loss, ref.numerator, ref.denominator, [float(c.loss or 0.0) for c in calls],
                                [c.numerator for c in calls], [c.denominator for c in calls], self.batch_dependent)
        found = []
        for quantity, expected, parts in (("denominator", ref.denominator, evidence.denominators),
                                          ("numerator", ref.numerator, evidence.numerators)):
            if expected is None or any(part is None for part in parts):
                continue
            total = float(sum(part for part in parts if part is not None))
            mismatch = compare_leaves(float(expected), total, self.comparison)
            if mismatch is not None:
                table = DENOMINATOR_DIAGNOSES if quantity == "denominator" else ()
                cause, explanation = diagnose(table, evidence, default=LOST_OR_DUPLICATED)
                found.append(self._draft(
                    "loss_accounting_mismatch", "loss_accounting", mismatch, cause,
                    f"The micro-batches' LossAccounting {quantity}s add up to {format_number(total)} but the full "
                    f"batch's is {format_number(expected)}.", explanation))
        total = float(sum(evidence.values))
        mismatch = compare_leaves(float(ref.loss), total, self.comparison)
        if mismatch is not None:
            cause, explanation = diagnose(VALUE_DIAGNOSES, evidence)
            found.append(self._draft(
                "loss_accounting_mismatch", "loss_accounting", mismatch, cause,
                f"The micro-batches' LossAccounting values add up to {format_number(total)} but the full batch's "
                f"loss is {format_number(ref.loss)}.", explanation))
        return found

    # -- optimizer steps ---------------------------------------------------------------------------

    def _optimizer_steps(self) -> tuple[list[Draft], set[str]]:
        found, diverged = [], set()
        for entry in self.optimizers:
            expected_total = sum(c.steps[entry] for c in self.ref.calls)
            counts = [c.steps[entry] for c in self.cand.calls]
            expected = [0] * (self.k - 1) + [expected_total]
            if counts == expected:
                continue
            diverged.add(entry)
            total = sum(counts)
            position = next(j for j, (a, b) in enumerate(zip(counts, expected, strict=True)) if a != b)
            cause = "extra_step" if total > expected_total else "missing_step" if total < expected_total \
                else "premature_step"
            once = _times(expected_total)
            what = {
                "extra_step": f"{total} times where the reference steps {once}",
                "missing_step": f"{total} times where the reference steps {once}",
                "premature_step": "before the last micro-batch",
            }[cause]
            preface = (
                f"Optimizer '{entry}' stepped {what} in window {self.index}: steps per micro-batch "
                f"{counts}, expected {expected} (the reference steps {once} per full batch, so the candidate "
                f"must step after the last of its {self.k} micro-batches, micro-batch {self.k - 1}).")
            explanation = f"Diagnosis ({cause}): " + {
                "extra_step": "the optimizer stepped more often than once per window of micro-batches.",
                "missing_step": "the optimizer did not step at the end of the window of micro-batches.",
                "premature_step": f"the optimizer stepped at micro-batch {position}, before the window's "
                                  "gradients were complete.",
            }[cause]
            found.append(Draft("step_count_mismatch", "optimizer_steps", self.index, preface, "", cause, explanation,
                               expected=list(expected), actual=list(counts), position=position))
        return found, diverged

    # -- contracts: FAIL in either run, even when both agree ------------------------------------------

    def _contracts(self) -> list[Draft]:
        for run, window in (("reference", self.ref), ("candidate", self.cand)):
            for position, call in enumerate(window.calls):
                for clip in call.clips:
                    if not clip.scaled:
                        continue
                    first = clip.parameters[0] if clip.parameters else "<none>"
                    return [Draft(
                        "clip_on_scaled_gradients", f"gradients.{first}", self.index,
                        f"In the {run} run, {clip.function}() clipped gradients that the GradScaler still scaled "
                        f"(scale {format_scale(clip.scale)}): the clipping threshold applies to scaled gradients.", "",
                        "unscale_before_clip_missing",
                        "Diagnosis (unscale_before_clip_missing): call scaler.unscale_(optimizer) before clipping.",
                        position=position if run == "candidate" else None)]
            for entry, event in window.step_events():
                if not event.scaled:
                    continue
                first = next(iter(event.grads), "<none>")
                return [Draft(
                    "step_on_scaled_gradients", f"gradients.{first}", self.index,
                    f"In the {run} run, optimizer '{entry}' stepped on gradients that the GradScaler still scaled "
                    f"(scale {format_scale(event.scale)}): the update is that many times too large, and steps with "
                    "non-finite gradients are not skipped.", "", "scaled_gradients_stepped",
                    "Diagnosis (scaled_gradients_stepped): call scaler.step(optimizer) (it unscales, and skips the "
                    "step when the gradients are not finite) instead of optimizer.step(), then scaler.update().",
                    position=event.call if run == "candidate" else None)]
        return []

    def _clips_between_steps(self) -> list[int]:
        """Per candidate call: clips made in calls where no optimizer stepped."""
        return [len(c.clips) if not any(c.steps.values()) else 0 for c in self.cand.calls]

    def _clip_note(self, found: list[Draft]) -> None:
        early = self._clips_between_steps()
        if any(early) and not any(v.cause == "clip_per_microbatch" for v in found):
            functions = sorted({clip.function for c in self.cand.calls for clip in c.clips})
            self.notes.append(
                f"the candidate called {', '.join(functions)}() at micro-batches {_indices(early)} of "
                "{windows}, before its optimizer step: clipping per micro-batch; it did not change the "
                "gradients in this run, but can with larger gradients")

    # -- gradients ---------------------------------------------------------------------------------

    def _gradients(self, diverged: set[str], earlier: bool) -> list[Draft]:
        found: list[Draft] = []
        for entry in self.optimizers:
            if entry in diverged:
                continue
            for ref_event, cand_event in zip(self.ref.steps[entry], self.cand.steps[entry], strict=True):
                mismatches = []
                for name, expected in ref_event.grads.items():
                    if ignored(f"gradients.{name}", self.comparison.ignore):
                        continue
                    mismatch = compare_leaves(expected, cand_event.grads.get(name), self.comparison)
                    if mismatch is not None:
                        mismatches.append((name, mismatch))
                if not mismatches:
                    continue
                if not earlier and not self.contributions_sampled:
                    self.contributions_needed = True
                    return found
                # After a step out of place, the gradients were computed at other parameters: no diagnosis.
                cause, explanation = (None, FOLLOWS) if earlier else diagnose(
                    GRADIENT_DIAGNOSES, self._gradient_evidence(entry, ref_event, cand_event))
                for name, mismatch in mismatches:
                    found.append(self._draft(
                        "gradient_mismatch", f"gradients.{name}", mismatch, cause,
                        f"The gradient at the step of optimizer '{entry}' in window {self.index} differs from the "
                        "full-batch reference.", explanation, self._losses()))
        return found

    def _sample(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().reshape(-1)[:: self.stride].to(torch.float64)

    def _vector(self, names: list[str], grads: dict[str, torch.Tensor | None], sampled: dict[str, torch.Tensor],
                lengths: dict[str, int]) -> torch.Tensor:
        """The sampled gradients of `names`, concatenated; a missing gradient is zeros."""
        parts = []
        for name in names:
            if name in sampled:
                parts.append(sampled[name])
                continue
            grad = grads.get(name)
            parts.append(torch.zeros(lengths[name], dtype=torch.float64) if grad is None else self._sample(grad))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)

    def _gradient_evidence(self, entry: str, ref_event: StepEvent, cand_event: StepEvent) -> GradientEvidence:
        lengths: dict[str, int] = {}
        for event in (ref_event, cand_event):
            for name, grad in event.grads.items():
                if grad is not None:
                    lengths.setdefault(name, math.ceil(grad.numel() / self.stride))
        names = [name for name in ref_event.grads if name in lengths]
        calls = self.cand.calls[: cand_event.call + 1]

        def vector(event: StepEvent, pre_clip: bool) -> torch.Tensor:
            return self._vector(names, event.grads, event.pre_clip if pre_clip else {}, lengths)

        previous = None
        if self.previous is not None and self.previous.steps[entry]:
            previous = vector(self.previous.steps[entry][-1], pre_clip=False)
        early = self._clips_between_steps()
        return GradientEvidence(
            k=self.k,
            reference=vector(ref_event, pre_clip=True),
            candidate=vector(cand_event, pre_clip=True),
            difference=relative(vector(ref_event, pre_clip=False), vector(cand_event, pre_clip=False)),
            contributions=[self._vector(names, {}, c.contribution, lengths) for c in calls],
            previous=previous,
            early_clips=early,
            clip_functions=sorted({clip.function for c in calls for clip in c.clips}),
            sizes=self.cand.sizes,
            batch_dependent=self.batch_dependent,
            precision=self.precision,
        )

    # -- learning rates, parameters, optimizer and scheduler state ---------------------------------

    def _scheduler_cause(self) -> str | None:
        """Set when a scheduler stepped more often than the reference, at micro-batches without a step."""
        early = [sum(c.scheduler_steps.values()) if not any(c.steps.values()) else 0 for c in self.cand.calls]
        ref_total = sum(sum(c.scheduler_steps.values()) for c in self.ref.calls)
        cand_total = sum(sum(c.scheduler_steps.values()) for c in self.cand.calls)
        if any(early) and cand_total > ref_total:
            return (f"Diagnosis (scheduler_per_microbatch): the candidate stepped its scheduler "
                    f"{_plural(cand_total, 'time')} in window {self.index} (at micro-batches "
                    f"{_indices([sum(c.scheduler_steps.values()) for c in self.cand.calls])}) where the "
                    f"reference steps it {_times(ref_total)}: step the scheduler once per optimizer step.")
        return None

    def _learning_rates(self, diverged: set[str], scheduler_cause: str | None, earlier: bool) -> list[Draft]:
        found = []
        for entry in self.optimizers:
            if entry in diverged:
                continue
            for ref_event, cand_event in zip(self.ref.steps[entry], self.cand.steps[entry], strict=True):
                for group, (expected, actual) in enumerate(zip(ref_event.lr, cand_event.lr, strict=True)):
                    mismatch = compare_leaves(expected, actual, self.comparison)
                    if mismatch is None or ignored(f"{entry}.param_groups.{group}.lr", self.comparison.ignore):
                        continue
                    used = (f"Observed: optimizer '{entry}' stepped with learning rates {_numbers(cand_event.lr)} "
                            f"where the reference used {_numbers(ref_event.lr)}.")
                    if earlier:
                        cause, explanation = None, FOLLOWS
                    elif scheduler_cause is not None:
                        cause, explanation = "scheduler_per_microbatch", scheduler_cause
                    else:
                        cause, explanation = "lr_schedule_per_microbatch", (
                            "Diagnosis (lr_schedule_per_microbatch): both runs stepped the optimizer as often, but "
                            "with other learning rates, and no LR scheduler stepped between the candidate's steps: a "
                            "learning rate computed from a counter that advances per micro-batch (such as iter_num "
                            "+= 1 inside the micro-batch loop, then get_lr(iter_num)); count optimizer steps instead.")
                    found.append(self._draft(
                        "learning_rate_mismatch", f"{entry}.param_groups.{group}.lr", mismatch, cause,
                        f"The learning rate at the step of optimizer '{entry}' in window {self.index} differs from "
                        "the full-batch reference.", explanation, used))
        return found

    def _end_state(self, what: str, ref: Snapshot, cand: Snapshot, kind: str, earlier: bool,
                   own_cause: str | None) -> list[Draft]:
        mismatches = list(compare_snapshots(ref, cand, self.comparison))
        if not mismatches:
            return []
        preface = f"{what} after window {self.index} differs from the full-batch reference."
        if own_cause is not None:
            cause, explanation = "scheduler_per_microbatch", own_cause
        elif earlier:
            cause, explanation = None, FOLLOWS
        else:
            cause, explanation = None, NO_CAUSE
        return [self._draft(kind, m.path, m, cause, preface, explanation) for m in mismatches]

    def _draft(self, kind: str, path: str, mismatch: Mismatch, cause: str | None, preface: str, explanation: str,
               *observed: str) -> Draft:
        return Draft(kind, path, self.index, preface, mismatch.message, cause, explanation, observed,
                     mismatch.expected, mismatch.actual)


def _consistent(drafts: list[Draft]) -> list[Violation]:
    """At one step, one explanation of the numbers: a later violation whose diagnosis contradicts the first
    one's is said to follow from it instead."""
    claimed = next((d.cause for d in drafts if d.cause in NUMERIC_CAUSES), None)
    for draft in drafts:
        if draft.cause in NUMERIC_CAUSES and draft.cause != claimed:
            draft.cause, draft.explanation = None, f"{FOLLOWS[:-1]} (diagnosed {claimed})."
    return [draft.violation() for draft in drafts]
