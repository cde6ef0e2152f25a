"""`check_equivalent`: two recipes that should train the same (activation checkpointing on and off, compiled and
eager, a refactor), each trained from the same seed on its own batches, compared step by step.

Two runs, in this process by default (or in fresh processes): the run (`_run.py`) records a typed trace per
`step()` call; the judgement (`_judge.py`, shared with `check_runs_equivalent`) finds the first step that differs
and tests the causes it can against what the runs observed. Where the first judgement FAILs, the reference runs a
second time: a reference that does not reproduce itself makes the check ABSTAIN, never blame the candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainparity._equivalent._judge import judge_equivalent, not_reproducible
from trainparity._equivalent._run import EquivalentPayload, EquivalentTrace
from trainparity._process import _session
from trainparity._process._comparing import ComparisonSetup
from trainparity._process._engine import Job, first_error, run_jobs
from trainparity._process._options import Isolation
from trainparity._recipe._reference import RecipeSpec, resolve_recipe
from trainparity._results._result import RunsResult
from trainparity._results._violation import ChildError, Outcome
from trainparity._state._compare import Comparison, ignored
from trainparity._validation import check_int

__all__ = ["check_equivalent"]

TASK = "trainparity._equivalent._run:equivalent_run"


@_session.recorded
def check_equivalent(
    reference: RecipeSpec,
    candidate: RecipeSpec,
    *,
    steps: int = 4,
    precision: _session.Precision | None = None,
    comparison: Comparison | None = None,
    seed: int = 0,
    ignore: str | Sequence[str] | None = None,
    isolation: Isolation | None = None,
    timeout: float | None = None,
) -> RunsResult:
    """Check that the `candidate` recipe trains like the `reference` recipe for `steps` calls of `step()`.

    Each is a Recipe class, an instance or a spec (`"module:Recipe(checkpointing=True)"`). Both are set up from
    `seed` and trained on their own batches; per step the samples, the loss, the gradients each optimizer stepped
    on, and the State after the step (parameters, buffers, optimizer and scheduler state) are compared, and the
    first step that differs is reported with a cause where one is recognised. `precision="float64"` (default)
    runs both in float64 and judges with `FLOAT64_TOLERANCE`; `"native"` runs the recipes' own dtypes, exactly
    unless a comparison is declared. What differs right after setup() and holds no tensor (a `checkpointing`
    flag) is configuration: named in a note, not compared. `ignore`: globs over State paths not compared either
    (`ema.*`; a glob that names a path ignores what lies under it). `isolation` is "inprocess" (default),
    "process" or "spawn"; `timeout` bounds the whole check. Never raises for a FAIL; misuse raises
    `tp.InvalidArgument`.
    """
    candidate_ref = resolve_recipe(candidate)
    steps = check_int("steps", steps, 1, "calls of step() compared")
    setup = ComparisonSetup.prepare(reference, comparison=comparison, precision=precision, seed=seed,
                                    isolation=isolation, timeout=timeout, default_isolation="inprocess",
                                    key="reference", shown={"candidate": candidate_ref.name, "steps": steps},
                                    ignore=ignore)

    def job(recipe: EquivalentPayload, phase: str) -> Job:
        return Job(TASK, recipe, phase, record=EquivalentTrace, workdir=False)

    payload = EquivalentPayload(setup.recipe, steps, setup.seed, setup.precision)
    outcomes = run_jobs([job(payload, "reference"), job(EquivalentPayload(candidate_ref, steps, setup.seed,
                                                                          setup.precision), "candidate")],
                        deadline=setup.deadline, isolation=setup.isolation)
    failed = first_error(outcomes)
    if failed is not None and failed.error is not None:
        return _errored(setup, failed.error, failed.exception)
    expected, actual = outcomes[0].output, outcomes[1].output
    result = judge_equivalent(expected, actual, setup.judged, setup.config)
    if result.outcome is not Outcome.FAIL:
        return result
    # A FAIL blames the candidate: only once the reference reproduces itself.
    del outcomes[1:]
    repeated = run_jobs([job(payload, "reference (repeat)")], deadline=setup.deadline, isolation=setup.isolation)[0]
    if repeated.error is not None:
        return _errored(setup, repeated.error, repeated.exception)
    again: EquivalentTrace = repeated.output
    unstable = not_reproducible(expected.steps, again.steps, setup.judged,
                                lambda path: not ignored(path, setup.judged.ignore), setup.config)
    return result if unstable is None else unstable


def _errored(setup: ComparisonSetup, error: ChildError, exception: BaseException | None) -> RunsResult:
    """The ERROR result; where torch.compile's inductor backend found no C++ compiler, a note says what to do."""
    result = setup.errored(RunsResult, error, exception)
    if "InvalidCxxCompiler" in error.message or "C++ compiler" in error.message:
        result.notes.append("torch.compile's default (inductor) backend needs a C++ compiler on a CPU and found none: "
                            "install one (gcc or clang), or compile with backend='aot_eager', which runs the same "
                            "captured graph eagerly and trains exactly like eager.")
    return result
