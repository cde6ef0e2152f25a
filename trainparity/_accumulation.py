"""`check_accumulation`: the recipe's own accumulation loop over k micro-batches vs one full-batch step.

Two runs from the same seeded setup, in-process by default (or in fresh processes):

- the reference: the recipe built with `accumulation_steps=1`, one `step()` per full batch,
  every window started from gradients set to None (so a missing `zero_grad` in the recipe
  cannot hide in the reference too);
- the candidate: the recipe built with `accumulation_steps=k`, one `step()` per micro-batch
  of the same full batches, cut by `split` (default `split_batch`).

Both draw `cycles` full batches from their own `batches(state)`; the check verifies that the
initial States and the batches are equal before judging. Judgement, window by window, in
phase order: `loss_accounting` (only when `step` returns `tp.LossAccounting`),
`optimizer_steps`, `gradients.<param>`, `parameters.<param>`, `optimizer.<...>`,
`scheduler.<...>`. The first window that diverges ends the judgement (later windows start
from diverged state). Each violation carries a diagnosis code where one fits, tested with a
fixed loose tolerance (`DIAGNOSIS_RTOL`) on what was observed; the verdict itself uses the
declared comparison only.
"""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch

from trainparity._compare import (
    EXACT,
    Comparison,
    Mismatch,
    compare_leaves,
    compare_snapshots,
    resolve_comparison,
)
from trainparity._engine import Job, first_error, run_jobs, validate_isolation, validate_timeout
from trainparity._observe import OBSERVATION_LOCK, Observer
from trainparity._recipe import LossAccounting, Recipe, RecipeRef, import_attribute, resolve_recipe
from trainparity._result import AccumulationResult, JsonValue, Outcome, Violation, json_safe
from trainparity._snapshot import snapshot_state, to_leaf
from trainparity._split import Microbatches, batch_size, leaves, split_batch, validate_microbatches
from trainparity._state import seed_everything
from trainparity._trace import loss_value, next_batch, require_state

TASK = "trainparity._accumulation:accumulation_run"
#: relative (normwise) tolerance for testing a diagnosis against what was observed; never the verdict
DIAGNOSIS_RTOL = 1e-4
#: normwise relative difference below which a divergence is described as floating-point rounding
ROUNDING_LEVEL = 1e-5
#: at most this many gradient elements enter the least-squares fit of micro-batch weights
FIT_ELEMENTS = 1 << 20

SplitFunction = Callable[[Any, Microbatches], Sequence[Any]]


# -- running one side ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AccumulationPayload:
    """One run: the reference (`microbatches=None`) or the candidate."""

    recipe: RecipeRef
    accumulation_steps: int
    microbatches: Microbatches | None
    #: the function itself in-process; "module:qualname" for a child, resolved after its sys.path is set
    split: SplitFunction | str | None
    cycles: int
    seed: int
    disable_dropout: bool


class _InputError(Exception):
    """The batch cannot be cut as declared: the check's input is wrong, not the recipe."""


def accumulation_run(payload: AccumulationPayload, workdir: pathlib.Path) -> dict[str, Any]:
    """Task: set the recipe up, run `cycles` windows observed; the trace holds tensors and plain values only."""
    recipe = payload.recipe.build(accumulation_steps=payload.accumulation_steps)
    seed_everything(payload.seed)
    state = require_state(recipe.setup(), recipe, "setup")
    with OBSERVATION_LOCK, Observer(
        state,
        type(recipe),
        disable_dropout=payload.disable_dropout,
        record_contributions=payload.microbatches is not None,
    ) as observer:
        # Snapshot after dropout was disabled, so both runs are compared as they will train.
        initial = snapshot_state(state, rng=True)
        try:
            windows = _run_windows(recipe, observer, payload)
        except _InputError as error:
            return {"input_error": str(error), "initial": initial}
        return {
            "input_error": None,
            "initial": initial,
            "windows": windows,
            "optimizers": list(observer.optimizers),
            "dropout": list(observer.dropout),
            "batch_dependent": sorted(observer.batch_dependent),
        }


def _run_windows(recipe: Recipe, observer: Observer, payload: AccumulationPayload) -> list[dict[str, Any]]:
    batches = iter(recipe.batches(observer.state))
    try:
        return _observe_windows(recipe, observer, payload, batches)
    finally:
        close = getattr(batches, "close", None)
        if callable(close):  # a generator over a DataLoader: its workers stop now, not at garbage collection
            close()


def _observe_windows(
    recipe: Recipe, observer: Observer, payload: AccumulationPayload, batches: Iterator[Any]
) -> list[dict[str, Any]]:
    name = type(recipe).__name__
    out: list[dict[str, Any]] = []
    for window in range(1, payload.cycles + 1):
        batch = next_batch(batches, recipe, f"window {window}")
        record = {path: to_leaf(leaf) for path, leaf in leaves(batch)}
        if payload.microbatches is None:
            observer.zero_grad()
            parts: Sequence[Any] = [batch]
        else:
            parts = _split(batch, payload)
        calls = []
        for index, part in enumerate(parts):
            observer.begin_call(index)
            before = _rng_state()
            try:
                returned = recipe.step(observer.state, part)
            finally:
                call = observer.end_call()
            call["rng_drawn"] = not _same_rng(before, _rng_state())
            call.update(_loss_record(returned, f"{name}.step() in window {window}, call {index}"))
            calls.append(call)
        out.append({
            "batch": record,
            "sizes": _sizes(parts),
            "calls": calls,
            "steps": observer.take_step_events(),
            "end": observer.end_state(),
        })
    return out


RngState = tuple[list[torch.Tensor], Any, Any]


def _rng_state() -> RngState:
    """The global RNG streams as they are (cheaper than `capture_rng`'s portable form: taken twice per call)."""
    torch_states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # GPU dropout
        torch_states += torch.cuda.get_rng_state_all()
    return torch_states, np.random.get_state(legacy=True), random.getstate()


def _same_rng(a: RngState, b: RngState) -> bool:
    # Streams present in both: CUDA initialized during the call brings new ones that nothing drew from yet.
    return (all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=False))
            and bool(np.array_equal(a[1][1], b[1][1])) and a[1][2:] == b[1][2:] and a[2] == b[2])


def _split(batch: Any, payload: AccumulationPayload) -> Sequence[Any]:
    assert payload.microbatches is not None
    k = payload.microbatches if isinstance(payload.microbatches, int) else len(payload.microbatches)
    if payload.split is None:
        try:
            return split_batch(batch, payload.microbatches)
        except ValueError as error:
            raise _InputError(str(error)) from None
    split = payload.split if callable(payload.split) else import_attribute(*payload.split.split(":", 1))
    parts = split(batch, payload.microbatches)
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or len(parts) != k:
        got = f"{len(parts)} parts" if isinstance(parts, Sequence) else type(parts).__name__
        raise _InputError(f"split= must return a sequence of {k} micro-batches, got {got}")
    return parts


def _sizes(parts: Sequence[Any]) -> list[int] | None:
    try:
        return [batch_size(part) for part in parts]
    except ValueError:
        return None


def _loss_record(returned: Any, where: str) -> dict[str, Any]:
    if not isinstance(returned, LossAccounting):
        return {"loss": loss_value(returned, where), "accounting": False, "numerator": None, "denominator": None}
    return {
        "loss": loss_value(returned, where),
        "accounting": True,
        "numerator": loss_value(returned.numerator, f"{where}, LossAccounting.numerator"),
        "denominator": loss_value(returned.denominator, f"{where}, LossAccounting.denominator"),
    }


# -- the check -----------------------------------------------------------------------------------


def _require_accumulation_parameter(recipe: object, ref: RecipeRef) -> None:
    cls = recipe if isinstance(recipe, type) else type(recipe) if isinstance(recipe, Recipe) else ref.recipe_class()
    init = cast(Any, cls).__init__
    if init is not object.__init__:
        parameters = inspect.signature(init).parameters.values()
        if any(p.name == "accumulation_steps" or p.kind is p.VAR_KEYWORD for p in parameters):
            return
    raise TypeError(
        f"{ref.name} takes no accumulation_steps parameter: give its __init__ `accumulation_steps: int = 1` "
        "and make step() step the optimizer once every accumulation_steps calls"
    )


def _split_reference(split: object) -> str | None:
    """`module:qualname` of a module-level split function, or None when it has no importable name."""
    module, qualname = getattr(split, "__module__", None), getattr(split, "__qualname__", "")
    if module == "__main__":
        module = getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", None)
    if not module or "<" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if import_attribute(module, qualname) is split else None
    except (ImportError, AttributeError):
        return None


def _validate(cycles: object, seed: object, split: object, isolation: str, flags: dict[str, object]) -> int:
    if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 1:
        raise ValueError(f"cycles= must be an int >= 1 (windows of k micro-batches compared), got {cycles!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed= must be an int, got {type(seed).__name__}")
    if split is not None and not callable(split):
        raise TypeError(f"split= must be a function split(batch, microbatches) -> micro-batches, got {split!r}")
    if split is not None and isolation != "inprocess" and _split_reference(split) is None:
        raise TypeError(
            f"split= must be a function defined at module level in an importable module to reach a fresh process "
            f"(isolation={isolation!r}), got {split!r}"
        )
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name}= must be True or False, got {value!r}")
    return cycles


def check_accumulation(
    recipe: object,
    *,
    microbatches: int | Sequence[int] = 4,
    cycles: int = 2,
    comparison: object = None,
    seed: int = 0,
    split: SplitFunction | None = None,
    disable_dropout: bool = True,
    allow_batch_dependent: bool = False,
    isolation: str = "inprocess",
    timeout: float = 120.0,
) -> AccumulationResult:
    """Check that the recipe's accumulation over micro-batches matches one full-batch step.

    `microbatches` is k (equal parts) or the sizes, e.g. (3, 3, 2). `split(batch,
    microbatches)` cuts a full batch (default `tp.split_batch`). `cycles` windows are
    compared. Dropout modules are disabled in both runs unless `disable_dropout=False`; a
    BatchNorm-like module in training mode makes the check ABSTAIN unless
    `allow_batch_dependent=True`. `isolation` is "inprocess" (default), "process" or "spawn";
    `timeout` bounds each run in a child process. Never raises for a FAIL; misuse raises
    TypeError/ValueError.
    """
    ref = resolve_recipe(recipe)
    declared_microbatches = validate_microbatches(microbatches)
    k = declared_microbatches if isinstance(declared_microbatches, int) else len(declared_microbatches)
    declared = resolve_comparison(comparison)
    isolation = validate_isolation(isolation)
    timeout = validate_timeout(timeout)
    cycles = _validate(cycles, seed, split, isolation, {
        "disable_dropout": disable_dropout, "allow_batch_dependent": allow_batch_dependent})
    _require_accumulation_parameter(recipe, ref)
    config: dict[str, JsonValue] = {
        "recipe": ref.name,
        "microbatches": json_safe(declared_microbatches),
        "cycles": cycles,
        "seed": seed,
        "comparison": declared.describe(),
        "isolation": isolation,
        "split": "split_batch" if split is None else _split_reference(split) or getattr(split, "__qualname__", "split"),
        "disable_dropout": disable_dropout,
        "allow_batch_dependent": allow_batch_dependent,
    }
    reference = AccumulationPayload(ref, 1, None, None, cycles, seed, disable_dropout)
    sent = split if split is None or isolation == "inprocess" else _split_reference(split)
    candidate = dataclasses.replace(reference, accumulation_steps=k, microbatches=declared_microbatches, split=sent)
    outcomes = run_jobs(
        [Job(TASK, reference, "reference", timeout), Job(TASK, candidate, "candidate", timeout)], isolation=isolation
    )
    failed = first_error(outcomes)
    if failed is not None and failed.error is not None:
        return AccumulationResult.errored(failed.error, config, failed.exception)
    traces = [o.output for o in outcomes if o.output is not None]
    assert len(traces) == 2
    return judge_accumulation(traces[0], traces[1], k, declared, config, allow_batch_dependent)


# -- judgement -----------------------------------------------------------------------------------


def judge_accumulation(
    reference: dict[str, Any],
    candidate: dict[str, Any],
    k: int,
    comparison: Comparison,
    config: dict[str, JsonValue],
    allow_batch_dependent: bool,
) -> AccumulationResult:
    """The verdict on two traces; raises ValueError when the candidate's batches could not be cut."""
    for mismatch in compare_snapshots(reference["initial"], candidate["initial"], EXACT):
        violation = Violation("initial_state_mismatch", mismatch.path, mismatch.message, expected=mismatch.expected,
                              actual=mismatch.actual)
        return AccumulationResult(Outcome.ABSTAIN, [violation], config=config, reason=(
            f"the State right after setup() differs between accumulation_steps=1 and accumulation_steps={k} "
            f"at {mismatch.path}: the two runs do not start from the same state"))
    for trace in (reference, candidate):
        if trace["input_error"] is not None:
            raise ValueError(trace["input_error"])
    notes = [_dropout_note(reference, config)]
    batch_dependent = sorted(set(reference["batch_dependent"]) | set(candidate["batch_dependent"]))
    if batch_dependent and not allow_batch_dependent:
        return AccumulationResult(Outcome.ABSTAIN, notes=notes, config=config, reason=(
            f"{', '.join(batch_dependent)} normalizes by batch statistics in training mode: a micro-batch sees other "
            "statistics than the full batch, so accumulation equivalence cannot be verified; pass "
            "allow_batch_dependent=True to compare anyway"))
    if not reference["optimizers"] and not any(w["end"]["parameters"] for w in reference["windows"]):
        return AccumulationResult(Outcome.ABSTAIN, notes=notes, config=config, reason=(
            "the State holds no optimizer and no nn.Module with parameters, so there is nothing to compare; "
            "put the model and its optimizer in the tp.State that setup() returns"))
    if batch_dependent:
        notes.append(f"batch-dependent modules compared anyway (allow_batch_dependent=True): "
                     f"{', '.join(batch_dependent)}")
    calls = [c for trace in (reference, candidate) for w in trace["windows"] for c in w["calls"]]
    judge_loss = all(c["accounting"] and c["loss"] is not None for c in calls)
    if not judge_loss:
        notes.append(
            "loss_accounting not judged: step() "
            + ("returned tp.LossAccounting in only some calls" if any(c["accounting"] for c in calls)
               else "returns a bare loss")
            + "; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, "
            "denominator) to have the normalization judged)")
    violations: list[Violation] = []
    # Notes that hold in several windows are said once: template (with "{windows}") -> window numbers.
    window_notes: dict[str, list[int]] = {}
    for index, (ref_window, cand_window) in enumerate(
        zip(reference["windows"], candidate["windows"], strict=True), start=1
    ):
        for mismatch in compare_snapshots(ref_window["batch"], cand_window["batch"], EXACT):
            violation = Violation("batch_mismatch", mismatch.path, mismatch.message, step=index,
                                  expected=mismatch.expected, actual=mismatch.actual)
            return AccumulationResult(Outcome.ABSTAIN, [violation], notes, config, reason=(
                f"batches() yields another full batch in the candidate run at window {index} ({mismatch.path}): "
                "the two runs must train on the same data"))
        previous = candidate["windows"][index - 2] if index > 1 else None
        window = _Window(index, ref_window, cand_window, previous, k, comparison, candidate["optimizers"])
        found, templates = window.judge(judge_loss)
        for template in templates:
            window_notes.setdefault(template, []).append(index)
        if found:
            violations = found
            break
    for template, indices in window_notes.items():
        numbers = ", ".join(map(str, indices))
        notes.append(template.replace("{windows}", f"window {numbers}" if len(indices) == 1 else f"windows {numbers}"))
    if violations and violations[0].step is not None and violations[0].step < len(reference["windows"]):
        notes.append(f"windows after window {violations[0].step} not judged: they start from the diverged state")
    drawn = [name for name, trace in (("reference", reference), ("candidate", candidate))
             if any(c["rng_drawn"] for w in trace["windows"] for c in w["calls"])]
    if drawn:
        drew = f"step() draws random numbers (the global RNG advanced during step() in the {' and '.join(drawn)} run)"
        if violations:
            return AccumulationResult(Outcome.ABSTAIN, violations, notes, config, reason=(
                f"{drew}: micro-batches draw other numbers than the full batch, so the divergence may come from "
                "the randomness; make step() deterministic to judge accumulation"))
        notes.append(f"{drew}, yet nothing diverged")
    return AccumulationResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes, config)


def _dropout_note(reference: dict[str, Any], config: dict[str, JsonValue]) -> str:
    if not config["disable_dropout"]:
        return "dropout left active in both runs (disable_dropout=False)"
    disabled = reference["dropout"]
    where = ", ".join(disabled) if disabled else "no dropout module in the State"
    return f"dropout disabled in both runs (disable_dropout=True): {where}"


def _fmt(value: float | None) -> str:
    return "None" if value is None else f"{value:.6g}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _times(count: int) -> str:
    return "once" if count == 1 else _plural(count, "time")


def _indices(values: Sequence[int]) -> str:
    return ", ".join(str(i) for i, v in enumerate(values) if v)


class _Window:
    """The judgement of one window: the reference's full-batch call vs the candidate's k calls."""

    def __init__(
        self,
        index: int,
        ref: dict[str, Any],
        cand: dict[str, Any],
        previous: dict[str, Any] | None,
        k: int,
        comparison: Comparison,
        optimizers: list[str],
    ) -> None:
        self.index, self.ref, self.cand, self.previous = index, ref, cand, previous
        self.k, self.comparison, self.optimizers = k, comparison, optimizers
        #: notes about this window, "{windows}" standing for where they hold
        self.notes: list[str] = []

    def judge(self, judge_loss: bool) -> tuple[list[Violation], list[str]]:
        accounting = self._loss_accounting() if judge_loss else []
        steps, diverged = self._optimizer_steps()
        found = steps + self._clip_contract() + self._gradients(diverged, earlier=bool(steps))
        # A scheduler stepped per micro-batch explains later phases only when the gradients agreed.
        scheduler_cause = self._scheduler_cause()
        gradients_agree = not found
        for phase, kind in (("parameters", "parameter_mismatch"), ("optimizer", "optimizer_state_mismatch"),
                            ("scheduler", "scheduler_state_mismatch")):
            cause = scheduler_cause if gradients_agree or phase == "scheduler" else None
            found += self._end_state(phase, kind, bool(found), cause)
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
            return found + accounting, self.notes
        return accounting + found, self.notes

    # -- what was returned ------------------------------------------------------------------------

    def _losses(self) -> str:
        ref = self.ref["calls"][0]["loss"]
        cand = [c["loss"] for c in self.cand["calls"]]
        total = sum(v for v in cand if v is not None) if all(v is not None for v in cand) else None
        return (f"Losses returned by step(): reference {_fmt(ref)}; candidate micro-batches "
                f"{', '.join(_fmt(v) for v in cand)} (sum {_fmt(total)}).")

    def _loss_accounting(self) -> list[Violation]:
        ref = self.ref["calls"][0]
        calls = self.cand["calls"]
        found = []
        for quantity in ("denominator", "numerator"):
            if ref[quantity] is None or any(c[quantity] is None for c in calls):
                continue
            total = float(sum(c[quantity] for c in calls))
            mismatch = compare_leaves(float(ref[quantity]), total, self.comparison)
            if mismatch is not None:
                found.append(self._violation(
                    "loss_accounting_mismatch", "loss_accounting", mismatch, None,
                    f"The micro-batches' LossAccounting {quantity}s add up to {_fmt(total)} but the full batch's "
                    f"is {_fmt(ref[quantity])}: the split or the per-micro-batch accounting lost or duplicated part "
                    "of the batch."))
        total = float(sum(c["loss"] for c in calls))
        mismatch = compare_leaves(float(ref["loss"]), total, self.comparison)
        if mismatch is not None:
            cause, explanation = self._loss_cause(ref, calls, total)
            found.append(self._violation(
                "loss_accounting_mismatch", "loss_accounting", mismatch, cause,
                f"The micro-batches' LossAccounting values add up to {_fmt(total)} but the full batch's loss is "
                f"{_fmt(ref['loss'])}.", explanation))
        return found

    def _loss_cause(self, ref: dict[str, Any], calls: list[dict[str, Any]], total: float) -> tuple[str | None, str]:
        k = self.k
        values = [float(c["loss"]) for c in calls]
        if all(c["numerator"] is not None and c["denominator"] for c in calls) and ref["denominator"]:
            window = float(ref["denominator"])
            hypotheses = [
                ("loss_not_scaled", [c["numerator"] / c["denominator"] for c in calls],
                 "each micro-batch's loss is its own mean (numerator / its own denominator), never divided by the "
                 f"number of micro-batches ({k})"),
                ("mean_of_means", [c["numerator"] / (k * c["denominator"]) for c in calls],
                 f"each micro-batch's loss is its own mean divided by {k}: a mean of means, where the full batch "
                 f"is normalized by the whole window's denominator ({_fmt(window)})"),
                ("loss_scaled_twice", [c["numerator"] / (k * window) for c in calls],
                 f"each micro-batch's loss is normalized by the whole window and divided by {k} again"),
            ]
            for cause, expected, explanation in hypotheses:
                if _close(torch.tensor(values, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)):
                    return cause, f"Diagnosis ({cause}): {explanation}."
        ratio = total / float(ref["loss"]) if ref["loss"] else None
        if ratio is not None and _near(ratio, k):
            return "loss_not_scaled", (f"Diagnosis (loss_not_scaled): the values add up to {k}x the full batch's "
                                       "loss: each micro-batch's loss was not divided by the number of micro-batches.")
        if ratio is not None and _near(ratio, 1 / k):
            return "loss_scaled_twice", (f"Diagnosis (loss_scaled_twice): the values add up to 1/{k} of the full "
                                         "batch's loss: the loss was divided by the number of micro-batches twice.")
        return None, "No known cause fits; this is the first observed divergence, not a root cause."

    # -- optimizer steps ---------------------------------------------------------------------------

    def _optimizer_steps(self) -> tuple[list[Violation], set[str]]:
        found, diverged = [], set()
        for entry in self.optimizers:
            expected_total = sum(c["steps"][entry] for c in self.ref["calls"])
            counts = [c["steps"][entry] for c in self.cand["calls"]]
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
            message = (
                f"Optimizer '{entry}' stepped {what} in window {self.index}: steps per micro-batch "
                f"{counts}, expected {expected} (the reference steps {once} per full batch, so the candidate "
                f"must step after the last of its {self.k} micro-batches, micro-batch {self.k - 1}).\n"
                f"Diagnosis ({cause}): " + {
                    "extra_step": "the optimizer stepped more often than once per window of micro-batches.",
                    "missing_step": "the optimizer did not step at the end of the window of micro-batches.",
                    "premature_step": f"the optimizer stepped at micro-batch {position}, before the window's "
                                      "gradients were complete.",
                }[cause])
            found.append(Violation("step_count_mismatch", "optimizer_steps", message, step=self.index,
                                   expected=expected, actual=counts, cause=cause, position=position))
        return found, diverged

    # -- clipping --------------------------------------------------------------------------------------

    def _clip_contract(self) -> list[Violation]:
        for run, calls in (("reference", self.ref["calls"]), ("candidate", self.cand["calls"])):
            for position, call in enumerate(calls):
                for clip in call["clips"]:
                    if not clip["scaled"]:
                        continue
                    first = clip["parameters"][0] if clip["parameters"] else "<none>"
                    message = (
                        f"In the {run} run, {clip['function']}() clipped gradients that the GradScaler still scaled "
                        f"(scale {_fmt(clip['scale'])}): the clipping threshold applies to scaled gradients.\n"
                        "Diagnosis (unscale_before_clip_missing): call scaler.unscale_(optimizer) before clipping.")
                    return [Violation("clip_on_scaled_gradients", f"gradients.{first}", message, step=self.index,
                                      cause="unscale_before_clip_missing",
                                      position=position if run == "candidate" else None)]
        return []

    def _clips_between_steps(self) -> list[int]:
        """Per candidate call: clips made in calls where no optimizer stepped."""
        return [len(c["clips"]) if not any(c["steps"].values()) else 0 for c in self.cand["calls"]]

    def _clip_note(self, found: list[Violation]) -> None:
        early = self._clips_between_steps()
        if any(early) and not any(v.cause == "clip_per_microbatch" for v in found):
            functions = sorted({clip["function"] for c in self.cand["calls"] for clip in c["clips"]})
            self.notes.append(
                f"the candidate called {', '.join(functions)}() at micro-batches {_indices(early)} of "
                "{windows}, before its optimizer step: clipping per micro-batch; it did not change the "
                "gradients in this run, but can with larger gradients")

    # -- gradients ---------------------------------------------------------------------------------

    def _gradients(self, diverged: set[str], earlier: bool) -> list[Violation]:
        found = []
        for entry in self.optimizers:
            if entry in diverged:
                continue
            for ref_event, cand_event in zip(self.ref["steps"][entry], self.cand["steps"][entry], strict=True):
                mismatches = []
                for name, expected in ref_event["grads"].items():
                    mismatch = compare_leaves(expected, cand_event["grads"].get(name), self.comparison)
                    if mismatch is not None:
                        mismatches.append(dataclasses.replace(mismatch, path=f"gradients.{name}"))
                if not mismatches:
                    continue
                # After a step out of place, the gradients were computed at other parameters: no diagnosis.
                cause, explanation = (None, "It follows from the earlier divergence in this window.") if earlier \
                    else self._gradient_cause(entry, ref_event, cand_event)
                for mismatch in mismatches:
                    found.append(self._violation(
                        "gradient_mismatch", mismatch.path, mismatch, cause,
                        f"The gradient at the step of optimizer '{entry}' in window {self.index} differs from the "
                        "full-batch reference.", explanation, self._losses()))
        return found

    def _gradient_cause(
        self, entry: str, ref_event: dict[str, Any], cand_event: dict[str, Any]
    ) -> tuple[str | None, str]:
        names = [n for n, g in ref_event["grads"].items() if g is not None]
        shapes = {n: ref_event["grads"][n].shape for n in names}

        def vector(grads: dict[str, torch.Tensor | None]) -> torch.Tensor:
            parts = []
            for name in names:
                grad = grads.get(name)
                parts.append((torch.zeros(shapes[name]) if grad is None else grad).reshape(-1).to(torch.float64))
            flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
            stride = max(1, flat.numel() // FIT_ELEMENTS)
            return flat[::stride]

        def pre_clip(event: dict[str, Any]) -> torch.Tensor:
            return vector({**event["grads"], **event["pre_clip"]})

        reference, candidate = pre_clip(ref_event), pre_clip(cand_event)
        window_calls = self.cand["calls"][: cand_event["call"] + 1]
        contributions = [vector(c["contribution"]) for c in window_calls]
        total = torch.stack(contributions).sum(0)
        relative = _relative(vector(ref_event["grads"]), vector(cand_event["grads"]))
        if not _close(candidate, total):
            previous = None
            if self.previous is not None and self.previous["steps"][entry]:
                previous = vector(self.previous["steps"][entry][-1]["grads"])
            early = self._clips_between_steps()
            if previous is not None and bool(previous.abs().sum() > 0) and _close(candidate - total, previous):
                return "grads_not_reset", (
                    "Diagnosis (grads_not_reset): the candidate's gradients at the step are this window's micro-batch "
                    f"gradients plus the gradients of the previous step (window {self.index - 1}): they were not "
                    "reset after the optimizer step (call optimizer.zero_grad() after stepping).")
            if any(early):
                functions = sorted({clip["function"] for c in window_calls for clip in c["clips"]})
                return "clip_per_microbatch", (
                    f"Diagnosis (clip_per_microbatch): the candidate called {', '.join(functions)}() at micro-batches "
                    f"{_indices(early)}, before the window's gradients were complete; clip once per optimizer step, "
                    "after the last micro-batch's backward.")
            if len(contributions) > 1 and _close(candidate, contributions[-1]):
                return None, (
                    "No diagnosis code fits. Observed: the gradients at the step hold only the last micro-batch's "
                    "gradient: they were reset between micro-batches, e.g. by a zero_grad() before each backward.")
            return None, (
                "No known cause fits: the gradients at the step are not the sum of the gradients back-propagated "
                "in this window's micro-batches; this is the first observed divergence, not a root cause.")
        return self._weighting_cause(reference, total, contributions, relative)

    def _weighting_cause(
        self, reference: torch.Tensor, total: torch.Tensor, contributions: list[torch.Tensor], relative: float
    ) -> tuple[str | None, str]:
        """How the reference's gradient relates to the candidate's per-micro-batch gradients."""
        k = self.k
        if _close(reference, total):
            rounding = (f"The difference is at the level of floating-point rounding (normwise relative difference "
                        f"{relative:.2g}): accumulating micro-batch gradients adds the same numbers in another "
                        "order. If that is expected, declare a tolerance (see docs/api.md, Accumulation "
                        "equivalence).") if relative <= ROUNDING_LEVEL else ""
            return None, " ".join(filter(None, [
                "No known cause fits; this is the first observed divergence, not a root cause.", rounding]))
        if _close(reference * k, total):
            return "loss_not_scaled", (
                f"Diagnosis (loss_not_scaled): the candidate's gradients are {k}x the reference's: each micro-batch "
                f"loss was back-propagated without dividing by the number of micro-batches ({k}).")
        if _close(reference, total * k):
            return "loss_scaled_twice", (
                f"Diagnosis (loss_scaled_twice): the candidate's gradients are 1/{k} of the reference's: the loss "
                "was divided by the number of micro-batches twice.")
        weights = _fit_weights(reference, contributions)
        if weights is None:
            return None, "No known cause fits; this is the first observed divergence, not a root cause."
        mean = float(weights.mean())
        shown = "[" + ", ".join(f"{w:.3g}" for w in weights.tolist()) + "]"
        sizes = self.cand["sizes"]
        of = f" ({', '.join(map(str, sizes))} samples)" if sizes else ""
        fit = f"the reference's gradient equals the gradients of the micro-batches{of} weighted by {shown}"
        if _near(mean, 1 / k):
            return "loss_not_scaled", (
                f"Diagnosis (loss_not_scaled): {fit}, adding up to 1 instead of {k}: the micro-batch losses were "
                f"summed without dividing by the number of micro-batches ({k}).")
        if _near(mean, 1.0):
            return "mean_of_means", (
                f"Diagnosis (mean_of_means): {fit} instead of all 1: each micro-batch was normalized by its own "
                "count and the results averaged, where the full batch is normalized by the whole window's count.")
        if _near(mean, k):
            return "loss_scaled_twice", (
                f"Diagnosis (loss_scaled_twice): {fit}, adding up to {k * k} instead of {k}: the loss was divided by "
                "the number of micro-batches twice.")
        return None, f"No known cause fits: {fit} instead of all 1; this is the first observed divergence."

    # -- parameters, optimizer and scheduler state -------------------------------------------------

    def _scheduler_cause(self) -> str | None:
        """Set when a scheduler stepped more often than the reference, at micro-batches without a step."""
        early = [sum(c["scheduler_steps"].values()) if not any(c["steps"].values()) else 0
                 for c in self.cand["calls"]]
        ref_total = sum(sum(c["scheduler_steps"].values()) for c in self.ref["calls"])
        cand_total = sum(sum(c["scheduler_steps"].values()) for c in self.cand["calls"])
        if any(early) and cand_total > ref_total:
            return (f"Diagnosis (scheduler_per_microbatch): the candidate stepped its scheduler "
                    f"{_plural(cand_total, 'time')} in window {self.index} (at micro-batches "
                    f"{_indices([sum(c['scheduler_steps'].values()) for c in self.cand['calls']])}) where the "
                    f"reference steps it {_times(ref_total)}: step the scheduler once per optimizer step.")
        return None

    def _lr_used(self) -> str:
        described = []
        for entry in self.optimizers:
            for ref_event, cand_event in zip(self.ref["steps"][entry], self.cand["steps"][entry], strict=False):
                if ref_event["lr"] != cand_event["lr"]:
                    described.append(f"optimizer '{entry}' stepped with learning rates {cand_event['lr']} where "
                                     f"the reference used {ref_event['lr']}")
        return "; ".join(described)

    def _end_state(self, phase: str, kind: str, earlier: bool, scheduler_cause: str | None) -> list[Violation]:
        mismatches = list(compare_snapshots(self.ref["end"][phase], self.cand["end"][phase], self.comparison))
        if not mismatches:
            return []
        what = {"parameters": "The parameter", "optimizer": "The optimizer state",
                "scheduler": "The scheduler state"}[phase]
        preface = f"{what} after window {self.index} differs from the full-batch reference."
        lr = self._lr_used() if phase != "scheduler" else ""
        if scheduler_cause is not None:
            cause, explanation = "scheduler_per_microbatch", scheduler_cause
        elif earlier:
            cause, explanation = None, "It follows from the earlier divergence in this window."
        else:
            cause, explanation = None, "No known cause fits; this is the first observed divergence, not a root cause."
        extra = f"Observed: {lr}." if lr and not earlier else ""
        return [self._violation(kind, m.path, m, cause, preface, explanation, extra) for m in mismatches]

    def _violation(
        self, kind: str, path: str, mismatch: Mismatch, cause: str | None, preface: str, *after: str
    ) -> Violation:
        """The preface, the torch.testing-style detail, then the diagnosis and observations."""
        tail = [line for line in after if line]
        message = "\n".join([preface, mismatch.message, *([""] + tail if tail else [])])
        return Violation(kind, path, message, step=self.index, expected=mismatch.expected,
                         actual=mismatch.actual, cause=cause)


# -- numerics of the diagnosis -------------------------------------------------------------------


def _norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x)) if x.numel() else 0.0


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Normwise agreement within DIAGNOSIS_RTOL (for testing a hypothesis, never for the verdict)."""
    scale = max(_norm(a), _norm(b))
    return _norm(a - b) <= DIAGNOSIS_RTOL * scale if scale else True


def _relative(expected: torch.Tensor, actual: torch.Tensor) -> float:
    scale = _norm(expected)
    return _norm(expected - actual) / scale if scale else float("inf")


def _near(value: float, target: float) -> bool:
    return abs(value - target) <= 1e-2 * abs(target)


def _fit_weights(reference: torch.Tensor, contributions: list[torch.Tensor]) -> torch.Tensor | None:
    """Weights w with reference = sum_j w_j * contribution_j, when they are unique and reproduce it."""
    matrix = torch.stack(contributions, dim=1)
    if matrix.shape[0] < matrix.shape[1]:
        return None
    solution = torch.linalg.lstsq(matrix, reference.unsqueeze(1), driver="gelsd")
    if int(solution.rank) < matrix.shape[1]:
        return None
    weights = solution.solution.squeeze(1)
    return weights if _close(matrix @ weights, reference) else None
