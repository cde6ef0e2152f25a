"""`check_accumulation`: the recipe's own accumulation loop over k micro-batches vs one full-batch step.

Two runs from the same seeded setup, in-process by default (or in fresh processes):

- the reference: the recipe built with `accumulation_steps=1`, one `step()` per full batch;
- the candidate: the recipe built with `accumulation_steps=k`, one `step()` per micro-batch
  of the same full batches, cut by `split` (default `split_batch`); in-process it runs again,
  sampling what only that diagnosis reads, where the judge diagnoses a gradient that differs.

The run (`_run.py`) records a typed trace (`_trace.py`); the judgement (`_judge.py`) walks the
two traces window by window and phase by phase; the diagnoses (`_diagnoses.py`) are tables of
hypotheses tested against what was observed. By default both runs compute in float64
(`_state/_precision.py`), so one fixed tolerance separates rounding from bugs on any machine.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Sequence
from typing import Any, Literal, cast

from trainparity._accumulation._judge import judge_accumulation
from trainparity._accumulation._run import AccumulationPayload, SplitFunction
from trainparity._accumulation._trace import AccumulationTrace
from trainparity._batches._split import validate_microbatches
from trainparity._process import _session
from trainparity._process._comparing import ComparisonSetup
from trainparity._process._engine import Job, JobOutcome, first_error, run_jobs
from trainparity._process._options import Isolation
from trainparity._recipe._modules import import_attribute
from trainparity._recipe._recipe import Recipe
from trainparity._recipe._reference import RecipeRef, RecipeSpec
from trainparity._results._result import AccumulationResult
from trainparity._results._violation import json_safe
from trainparity._state._compare import Comparison
from trainparity._validation import InvalidArgument, check_argument, check_bool, check_callable, check_choice, check_int

__all__ = ["check_accumulation"]

TASK = "trainparity._accumulation._run:accumulation_run"
BATCH_DEPENDENT_MODES = ("fail", "eval")


def _require_accumulation_parameter(recipe: object, ref: RecipeRef) -> None:
    cls = recipe if isinstance(recipe, type) else type(recipe) if isinstance(recipe, Recipe) else ref.recipe_class()
    init = cast(Any, cls).__init__
    if init is not object.__init__:
        parameters = inspect.signature(init).parameters.values()
        if any(p.name == "accumulation_steps" or p.kind is p.VAR_KEYWORD for p in parameters):
            return
    raise InvalidArgument(
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


def _validate(split: object, isolation: str, disable_dropout: object, batch_dependent: object) -> None:
    if split is not None:
        check_callable("split", split, "a function split(batch, microbatches) -> micro-batches")
        check_argument(isolation == "inprocess" or _split_reference(split) is not None, f"split= must be a function "
                       f"defined at module level in an importable module to reach a fresh process "
                       f"(isolation={isolation!r}), got {split!r}")
    check_bool("disable_dropout", disable_dropout)
    check_choice("batch_dependent", batch_dependent, BATCH_DEPENDENT_MODES)


@_session.recorded
def check_accumulation(
    recipe: RecipeSpec,
    *,
    microbatches: int | Sequence[int] = 4,
    cycles: int = 2,
    comparison: Comparison | None = None,
    seed: int = 0,
    split: SplitFunction | None = None,
    precision: _session.Precision | None = None,
    disable_dropout: bool = True,
    batch_dependent: Literal["fail", "eval"] = "fail",
    isolation: Isolation | None = None,
    timeout: float | None = None,
    ignore: str | Sequence[str] | None = None,
) -> AccumulationResult:
    """Check that the recipe's accumulation over micro-batches matches one full-batch step.

    `microbatches` is k (equal parts) or the sizes, e.g. (3, 3, 2). `split(batch,
    microbatches)` cuts a full batch (default `tp.split_batch`). `cycles` windows are
    compared. `precision="float64"` (default) runs both in float64 and, without a declared
    comparison, judges with `FLOAT64_TOLERANCE`; `"native"` runs the recipe's own dtypes (exact
    unless a comparison is declared). Dropout (modules and functional) is disabled in both runs
    unless `disable_dropout=False`. A BatchNorm-like layer in training mode really makes
    micro-batches differ: the divergence FAILs with `batch_dependent_layer`, unless
    `batch_dependent="eval"` runs those layers in eval mode. `isolation` is "inprocess"
    (default), "process" or "spawn"; `timeout` bounds the whole check, all its runs and their process
    starts (default 120 s; a run in this process is interrupted at it, see docs/api.md). `precision`,
    `isolation` and `timeout` left at None take the session's defaults (`--trainparity-*` under pytest).
    Never raises for a FAIL; misuse raises TypeError/ValueError.
    """
    declared_microbatches = validate_microbatches(microbatches)
    k = declared_microbatches if isinstance(declared_microbatches, int) else len(declared_microbatches)
    cycles = check_int("cycles", cycles, 1, "windows of k micro-batches compared")
    setup = ComparisonSetup.prepare(recipe, comparison=comparison, precision=precision, seed=seed, isolation=isolation,
                                    timeout=timeout, default_isolation="inprocess",
                                    shown={"microbatches": json_safe(declared_microbatches), "cycles": cycles},
                                    ignore=ignore)
    _validate(split, setup.isolation, disable_dropout, batch_dependent)
    _require_accumulation_parameter(recipe, setup.recipe)
    setup = setup.showing({
        "split": "split_batch" if split is None else _split_reference(split) or getattr(split, "__qualname__", "split"),
        "disable_dropout": disable_dropout,
        "batch_dependent": batch_dependent,
    })
    reference = AccumulationPayload(setup.recipe, 1, None, None, cycles, setup.seed, disable_dropout, setup.precision,
                                    batch_dependent)
    sent = split if split is None or setup.isolation == "inprocess" else _split_reference(split)
    candidate = dataclasses.replace(reference, accumulation_steps=k, microbatches=declared_microbatches, split=sent)
    outcomes = _first_runs(setup, reference, candidate)
    errored = _errored(outcomes, setup)
    if errored is not None:
        return errored
    reference_trace = outcomes[0].output
    verdict = judge_accumulation(reference_trace, outcomes[1].output, k, setup.judged, setup.config, setup.precision,
                                 batch_dependent)
    if isinstance(verdict, AccumulationResult):
        return verdict
    # a gradient differs, and its diagnosis reads each micro-batch's contribution: the candidate runs again
    del outcomes[1:]  # the first run's copies of what differed are not held through the second
    sampling = dataclasses.replace(candidate, expected=reference_trace, comparison=setup.judged)
    outcomes += run_jobs([Job(TASK, sampling, "candidate", record=AccumulationTrace, workdir=False)],
                         deadline=setup.deadline, isolation=setup.isolation)
    errored = _errored(outcomes, setup)
    if errored is not None:
        return errored
    verdict = judge_accumulation(reference_trace, outcomes[1].output, k, setup.judged, setup.config, setup.precision,
                                 batch_dependent)
    assert isinstance(verdict, AccumulationResult), "a candidate that sampled the contributions is judged"
    return verdict


def _first_runs(setup: ComparisonSetup, reference: AccumulationPayload,
                candidate: AccumulationPayload) -> list[JobOutcome]:
    """The reference and the candidate; in this process the candidate runs second, sharing the reference's tensors."""
    def job(payload: AccumulationPayload, phase: str) -> Job:
        return Job(TASK, payload, phase, record=AccumulationTrace, workdir=False)

    if setup.isolation != "inprocess":
        return run_jobs([job(reference, "reference"), job(candidate, "candidate")], deadline=setup.deadline,
                        isolation=setup.isolation)
    # The candidate runs after the reference in this process and holds the reference's tensors wherever its own
    # agree with them under the comparison: it copies, and the process pages in, only what differs. It samples
    # no micro-batch contribution (a gradient hook per parameter and backward) until the judge needs them.
    outcomes = run_jobs([job(reference, "reference")], deadline=setup.deadline, isolation=setup.isolation)
    if outcomes[0].error is None:
        sharing = dataclasses.replace(candidate, expected=outcomes[0].output, comparison=setup.judged,
                                      sample_contributions=False)
        outcomes += run_jobs([job(sharing, "candidate")], deadline=setup.deadline, isolation=setup.isolation)
    return outcomes


def _errored(outcomes: list[JobOutcome], setup: ComparisonSetup) -> AccumulationResult | None:
    """The ERROR result of the first run that failed, or None when none did."""
    failed = first_error(outcomes)
    if failed is None or failed.error is None:
        return None
    return setup.errored(AccumulationResult, failed.error, failed.exception)
