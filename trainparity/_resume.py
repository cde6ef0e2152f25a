"""`check_resume`: save, real process exit, fresh-process load and continue vs uninterrupted training.

Runs (each in a fresh process): two uninterrupted baselines and the interrupted run that
trains to `resume_at` and saves, concurrently; then the resumed run that loads and trains
the rest. Judgement, in observation order: the State right after `load` against the State
right after `save` (cause `not_restored`), then per resumed step the RNG streams at the
start of the step, the batch's sample IDs, the loss and the State after the step against
the baseline.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trainparity import _session
from trainparity._compare import (
    EXACT,
    Comparison,
    ExactComparison,
    Mismatch,
    Snapshot,
    compare_snapshots,
    resolve_comparison,
)
from trainparity._digest import Digest, digest
from trainparity._engine import Job, first_error, run_jobs, scratch_directory
from trainparity._recipe import RecipeSpec, resolve_recipe
from trainparity._result import ResumeResult
from trainparity._state import validate_seed
from trainparity._trace import RunTrace, StepRecord, TrainPayload, diff_steps
from trainparity._violation import Outcome, Violation

TASK = "trainparity._trace:train_run"


def _validate_steps(steps: object, resume_at: object) -> tuple[int, int]:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps= must be an int >= 2 (one step before and one after the resume), got {steps!r}")
    if resume_at is None:
        return steps, steps // 2
    if isinstance(resume_at, bool) or not isinstance(resume_at, int) or not 1 <= resume_at <= steps - 1:
        raise ValueError(f"resume_at= must be an int in 1..{steps - 1} (steps={steps}), got {resume_at!r}")
    return steps, resume_at


@_session.recorded
def check_resume(
    recipe: RecipeSpec,
    *,
    steps: int = 6,
    resume_at: int | None = None,
    comparison: Comparison | None = None,
    seed: int = 0,
    isolation: _session.Isolation | None = None,
    timeout: float | None = None,
) -> ResumeResult:
    """Check that saving at `resume_at`, exiting, loading in a fresh process and continuing
    reproduces `steps` steps of uninterrupted training. Never raises for a FAIL.

    `resume_at` defaults to `steps // 2`. `isolation` is "process" (a child of the warmed
    fork server; the default), "spawn" (a new interpreter) or "inprocess" (no isolation, for
    debugging). `timeout` bounds each run (default 120 s). Left at None, both take the session's
    defaults (`--trainparity-isolation`, `--trainparity-timeout` under pytest).
    """
    ref = resolve_recipe(recipe)
    steps, resume_at = _validate_steps(steps, resume_at)
    declared = resolve_comparison(comparison)
    isolation = _session.isolation(isolation, "process")
    timeout = _session.timeout(timeout)
    seed = validate_seed(seed)
    config: dict[str, Any] = {
        "recipe": ref.name,
        "steps": steps,
        "resume_at": resume_at,
        "seed": seed,
        "comparison": declared.describe(),
        "isolation": isolation,
    }
    with scratch_directory("trainparity-checkpoint-") as checkpoint_dir:
        checkpoint = f"{checkpoint_dir}/checkpoint"
        # Exact comparisons are decided by digests; a tolerance needs the values themselves.
        run = TrainPayload(ref, seed, 1, steps, checkpoint, digests=isinstance(declared, ExactComparison))
        decode = RunTrace.from_wire
        # The resumed run needs only the interrupted one: it starts as soon as that has saved,
        # while the baselines run beside them.
        outcomes = run_jobs(
            [
                Job(TASK, dataclasses.replace(run, last=resume_at, save=True), "interrupted", timeout, decode=decode),
                Job(TASK, run, "baseline", timeout, decode=decode),
                Job(TASK, dataclasses.replace(run, first=resume_at + 1, load=True), "resumed", timeout, after=0,
                    decode=decode),
                Job(TASK, run, "baseline (repeat)", timeout, decode=decode),
            ],
            isolation=isolation,
            on_failure="later",
        )
        failed = first_error(outcomes)
        if failed is not None and failed.error is not None:
            return ResumeResult.errored(failed.error, config, failed.exception)
        interrupted, baseline, resumed, repeat = (o.output for o in outcomes if o.output is not None)
        result = judge_resume(baseline, repeat, interrupted, resumed, resume_at, declared, config)
        wanted = _values_wanted(result, baseline, resumed, resume_at)
        if wanted is None:
            return result
        notes = _fetch_values(wanted, run, (baseline, interrupted, resumed), resume_at, isolation, timeout)
        result = judge_resume(baseline, repeat, interrupted, resumed, resume_at, declared, config)
        result.notes.extend(notes)
        return result


@dataclasses.dataclass(frozen=True)
class _Wanted:
    """The large tensors whose values the report shows, known so far by their digests only."""

    #: differing at the load (the save/load comparison)
    boundary: frozenset[str]
    #: the first step at which training diverged, and its differing tensors
    step: int
    at_step: frozenset[str]


def _values_wanted(result: ResumeResult, baseline: RunTrace, resumed: RunTrace, resume_at: int) -> _Wanted | None:
    """Which digested tensors the report needs the values of: the save/load mismatches and the first divergence."""
    assert resumed.loaded is not None
    boundary = frozenset(v.path for v in result.violations if v.step == resume_at and v.cause == "not_restored"
                         and isinstance(resumed.loaded.state.get(v.path), Digest))
    diverged = [v for v in result.violations if v.kind == "state_mismatch" and v.step is not None
                and v.step > resume_at]
    step = min((v.step for v in diverged if v.step is not None), default=resume_at)
    at_step = frozenset(v.path for v in diverged if v.step == step
                        and isinstance(baseline.steps[step - 1].state.get(v.path), Digest))
    return _Wanted(boundary, step, at_step) if boundary or at_step else None


def _fetch_values(wanted: _Wanted, run: TrainPayload, traces: tuple[RunTrace, RunTrace, RunTrace], resume_at: int,
                  isolation: str, timeout: float) -> list[str]:
    """Train again the runs the wanted values come from, keeping those tensors whole; put them in the traces.

    The runs were reproducible (the baseline ran twice alike), so training them again gives the same
    values: each fetched tensor replaces its digest only if it has that digest. Returns notes.
    """
    baseline, interrupted, resumed = traces
    last = wanted.step if wanted.at_step else resume_at
    whole = ((0, wanted.boundary), (wanted.step, wanted.at_step))
    jobs = [Job(TASK, dataclasses.replace(run, last=last, whole=whole), "baseline (values)", timeout,
                decode=RunTrace.from_wire),
            Job(TASK, dataclasses.replace(run, last=resume_at, save=True, checkpoint=run.checkpoint + ".values",
                                          whole=whole), "interrupted (values)", timeout, decode=RunTrace.from_wire),
            Job(TASK, dataclasses.replace(run, first=resume_at + 1, last=last, load=True, whole=whole),
                "resumed (values)", timeout, decode=RunTrace.from_wire)]
    outcomes = run_jobs(jobs, isolation=isolation)
    failed = first_error(outcomes)
    if failed is not None and failed.error is not None:
        return [f"the values of the differing tensors could not be fetched ({failed.error.headline()}): "
                "their violations say only that their digests differ."]
    again_baseline, again_interrupted, again_resumed = (o.output for o in outcomes)
    pairs = []
    if wanted.at_step:
        pairs += [(baseline.steps[wanted.step - 1].state, again_baseline.steps[-1].state, wanted.at_step),
                  (resumed.steps[wanted.step - resume_at - 1].state, again_resumed.steps[-1].state, wanted.at_step)]
    if wanted.boundary:
        assert interrupted.saved is not None and resumed.loaded is not None
        assert again_interrupted.saved is not None and again_resumed.loaded is not None
        pairs += [(interrupted.saved.state, again_interrupted.saved.state, wanted.boundary),
                  (resumed.loaded.state, again_resumed.loaded.state, wanted.boundary)]
    if all([_replace(known, fetched, paths) for known, fetched, paths in pairs]):
        return []
    return ["training again to fetch the values of the differing tensors gave other values than the first "
            "time, so some violations say only that their digests differ."]


def _replace(known: Snapshot, fetched: Snapshot, paths: frozenset[str]) -> bool:
    """Put the fetched values of `paths` in place of their digests; False if one does not match its digest."""
    matched = True
    for path in paths:
        value, known_digest = fetched.get(path), known.get(path)
        if not isinstance(known_digest, Digest):
            continue
        if isinstance(value, torch.Tensor) and digest(value) == known_digest:
            known[path] = value
        else:
            matched = False
    return matched


def _violation(kind: str, mismatch: Mismatch, step: int, cause: str | None, preface: str) -> Violation:
    return Violation(
        kind=kind,
        path=mismatch.path,
        message=f"{preface}\n{mismatch.message}" if preface else mismatch.message,
        step=step,
        expected=mismatch.expected,
        actual=mismatch.actual,
        cause=cause,
    )


def _nondeterminism(
    expected: list[StepRecord], actual: list[StepRecord], comparison: Comparison, what: str
) -> Violation | None:
    for a, b in zip(expected, actual, strict=False):
        for difference in diff_steps(a, b, comparison):
            return _violation(
                "nondeterministic_baseline",
                difference.mismatch,
                a.step,
                "baseline_nondeterministic",
                f"{what} at step {a.step}: the recipe is not reproducible, so resume equivalence cannot be judged.",
            )
    return None


def _data_cause(baseline: list[StepRecord], index: int, actual: list[int | str]) -> tuple[str | None, int | str, int]:
    """Why the resumed batch differs: IDs already consumed (replayed) or from later batches (skipped)."""
    expected = baseline[index].sample_ids or []
    position = next((i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a),
                    min(len(expected), len(actual)))
    sample: int | str = actual[position] if position < len(actual) else expected[position]
    earlier = {i for record in baseline[:index] for i in record.sample_ids or []}
    later = {i for record in baseline[index + 1:] for i in record.sample_ids or []}
    if position < len(actual) and actual[position] in earlier:
        return "data_replayed", sample, position
    if position < len(actual) and actual[position] in later:
        return "data_skipped", sample, position
    return None, sample, position


def judge_resume(
    baseline: RunTrace,
    repeat: RunTrace,
    interrupted: RunTrace,
    resumed: RunTrace,
    resume_at: int,
    comparison: Comparison,
    config: dict[str, Any],
    rng_at_load: bool = True,
) -> ResumeResult:
    """The verdict on the four runs' traces. `rng_at_load=False` (a script) says that the RNG
    streams right after the load were not observed, so an RNG divergence cannot be blamed on it."""
    base, again, before, after = baseline.steps, repeat.steps, interrupted.steps, resumed.steps
    for other, what in ((again, "Two uninterrupted runs differ"),
                        (before, "The interrupted run differs from the uninterrupted one before the save")):
        found = _nondeterminism(base, other, comparison, what)
        if found is not None:
            return ResumeResult(Outcome.ABSTAIN, [found], config=config,
                                reason=f"baseline not reproducible: {found.path} differs at step {found.step}")
    violations: list[Violation] = []
    notes: list[str] = []
    saved, loaded = interrupted.saved, resumed.loaded
    assert saved is not None and loaded is not None, "the interrupted run saves and the resumed run loads"
    for mismatch in compare_snapshots(saved.state, loaded.state, comparison):
        violations.append(_violation("state_mismatch", mismatch, resume_at, "not_restored",
                                     "The State right after load() differs from the State right after save()."))
    unrestored = {m.path for m in compare_snapshots(saved.rng, loaded.rng, EXACT)}
    rng_first: dict[str, tuple[Violation, int]] = {}
    last_divergence = 0
    for index, record in enumerate(after, start=resume_at):
        step = record.step
        for difference in diff_steps(base[index], record, comparison):
            mismatch = difference.mismatch
            if difference.aspect == "rng":
                if mismatch.path not in rng_first:
                    cause = "not_restored" if mismatch.path in unrestored else None
                    preface = (
                        "The RNG stream at the start of the step differs from uninterrupted training: "
                        + ("load() did not restore it." if cause else
                           "it was restored, then consumed between load() and this step (for example by a new "
                           "DataLoader iterator drawing its base seed)." if rng_at_load else
                           "the checkpoint does not hold it, or the resumed script draws from it differently.")
                    )
                    rng_first[mismatch.path] = (
                        _violation("rng_mismatch", Mismatch(mismatch.path, "Generator states are not equal.",
                                                            None, None), step, cause, preface),
                        len(violations),
                    )
                continue
            last_divergence = step
            if difference.aspect == "data":
                assert record.sample_ids is not None
                cause, sample, position = _data_cause(base, index, record.sample_ids)
                violation = _violation("data_mismatch", mismatch, step, cause,
                                       "The resumed run trained on other samples than uninterrupted training.")
                violations.append(dataclasses.replace(violation, sample_id=sample, position=position))
            elif difference.aspect == "loss":
                violations.append(_violation("loss_mismatch", mismatch, step, None,
                                             "The loss differs from uninterrupted training."))
            else:
                violations.append(_violation("state_mismatch", mismatch, step, None,
                                             "The State after the step differs from uninterrupted training."))
    # An RNG stream is blamed only when something diverged at or after the step it first differed.
    for offset, (path, (violation, position)) in enumerate(sorted(rng_first.items(), key=lambda i: i[1][1])):
        assert violation.step is not None
        if last_divergence >= violation.step:
            violations.insert(position + offset, violation)
        else:
            notes.append(f"{path} differs from uninterrupted training from step {violation.step} on, "
                         "but nothing else diverged: reported, not failed.")
    if baseline.unobserved:
        notes.append(f"not compared: {', '.join(baseline.unobserved)}: trainparity sees no state in these State "
                     "entries (no state_dict(), tensors, numbers or public attributes); give them a "
                     "state_dict()/load_state_dict() to have them checked.")
    if any(r.sample_ids is None for r in base):
        notes.append("data stream not checked: the recipe's sample_ids() returns None.")
    outcome = Outcome.FAIL if violations else Outcome.PASS
    return ResumeResult(outcome, violations, notes, config)


