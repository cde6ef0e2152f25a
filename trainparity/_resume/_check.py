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
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from trainparity._process import _session
from trainparity._process._engine import Job, JobOutcome, first_error, first_failure, run_jobs, scratch_directory
from trainparity._process._options import Isolation
from trainparity._process._world import World, validate_backend, world_isolation
from trainparity._recipe._recipe import Recipe
from trainparity._recipe._reference import RecipeSpec, resolve_recipe
from trainparity._results._result import ChildError, ResumeResult
from trainparity._results._violation import Outcome, Violation
from trainparity._resume._ranks import align, merge_ranks, own_path, path_rank, replicated_paths
from trainparity._resume._trace import RunTrace, StepRecord, TrainPayload, Whole, diff_steps
from trainparity._state._compare import (
    EXACT,
    Comparison,
    ExactComparison,
    Mismatch,
    Snapshot,
    compare_snapshots,
    resolve_comparison,
)
from trainparity._state._digest import Digest, digest
from trainparity._state._precision import describe_comparison, dtype_error_hint, effective_comparison
from trainparity._state._rng import validate_seed
from trainparity._state._snapshot import state_entry

TASK = "trainparity._resume._trace:train_run"


def _validate_steps(steps: object, resume_at: object) -> tuple[int, int]:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps= must be an int >= 2 (one step before and one after the resume), got {steps!r}")
    if resume_at is None:
        return steps, steps // 2
    if isinstance(resume_at, bool) or not isinstance(resume_at, int) or not 1 <= resume_at <= steps - 1:
        raise ValueError(f"resume_at= must be an int in 1..{steps - 1} (steps={steps}), got {resume_at!r}")
    return steps, resume_at


def _validate_worlds(world_size: object, resume_world_size: object) -> tuple[int, int]:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size= must be an int >= 1 (the ranks of every run but the resumed one), "
                         f"got {world_size!r}")
    if resume_world_size is None:
        return world_size, world_size
    if isinstance(resume_world_size, bool) or not isinstance(resume_world_size, int) or resume_world_size < 1:
        raise ValueError(f"resume_world_size= must be an int >= 1 or None (the same as world_size), "
                         f"got {resume_world_size!r}")
    return world_size, resume_world_size


@_session.recorded
def check_resume(
    recipe: RecipeSpec,
    *,
    steps: int = 6,
    resume_at: int | None = None,
    comparison: Comparison | None = None,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    world_size: int = 1,
    resume_world_size: int | None = None,
    backend: str = "gloo",
    precision: _session.Precision | None = None,
) -> ResumeResult:
    """Check that saving at `resume_at`, exiting, loading in a fresh process and continuing
    reproduces `steps` steps of uninterrupted training. Never raises for a FAIL.

    `resume_at` defaults to `steps // 2`. `isolation` is "process" (a child of the warmed
    fork server; the default), "spawn" (a new interpreter) or "inprocess" (no isolation, for
    debugging). `timeout` bounds each run (default 120 s). Left at None, both take the session's
    defaults (`--trainparity-isolation`, `--trainparity-timeout` under pytest).

    With `world_size > 1`, every run is a world of real torch.distributed ranks (`backend`), which
    the recipe joins before `setup()` as under torchrun, and saves and loads with its own code (for
    example torch.distributed.checkpoint); `resume_world_size` resumes on another number of ranks.
    Runs of several ranks are judged on gathered values, per-rank RNG streams (`rng.torch[rank 1]`)
    and the global batch (see docs/api.md). `precision` is "native" (the recipe's dtypes, judged
    exactly unless a comparison is declared) or "float64"; left at None it is "native", but when
    the world size changes, whose other reduction order changes the rounding, the session's
    default ("float64": every run in float64, judged with the fixed float64 tolerance).
    """
    ref = resolve_recipe(recipe)
    steps, resume_at = _validate_steps(steps, resume_at)
    world_size, resume_world_size = _validate_worlds(world_size, resume_world_size)
    declared = None if comparison is None else resolve_comparison(comparison)
    ranked = max(world_size, resume_world_size) > 1
    if world_size != resume_world_size:
        recipe_class = ref.recipe_class()
        if recipe_class.save is Recipe.save or recipe_class.load is Recipe.load:
            raise ValueError(
                f"resume_world_size={resume_world_size} != world_size={world_size} needs {recipe_class.__name__}'s "
                "own save() and load() (for example with torch.distributed.checkpoint): the default tp.save_state "
                "file of each rank holds that rank's loader position and RNG state, which another number of ranks "
                "splits otherwise")
    backend = validate_backend(backend, max(world_size, resume_world_size))
    if precision is None and world_size == resume_world_size:
        precision = "native"
    precision = _session.precision(precision)
    judged = effective_comparison(declared, precision)
    timeout = _session.timeout(timeout)
    isolation = world_isolation(isolation, backend) if ranked else _session.isolation(isolation, "process")
    seed = validate_seed(seed)
    config: dict[str, Any] = {
        "recipe": ref.name,
        "steps": steps,
        "resume_at": resume_at,
        "seed": seed,
        "comparison": describe_comparison(declared, precision),
        "isolation": isolation,
    }
    if ranked:
        config.update(world_size=world_size, resume_world_size=resume_world_size, backend=backend)
    if precision != "native":
        config["precision"] = precision
    with scratch_directory("trainparity-checkpoint-") as checkpoint_dir:
        # Exact comparisons are decided by digests; a tolerance needs the values themselves.
        run = TrainPayload(ref, seed, 1, steps, f"{checkpoint_dir}/checkpoint",
                           digests=isinstance(judged, ExactComparison), precision=precision)
        runs = _Runs(timeout, isolation, backend, str(checkpoint_dir),
                     (world_size, resume_world_size) if ranked else (0, 0))
        # The resumed run needs only the interrupted one: it starts as soon as that has saved,
        # while the baselines run beside them.
        traces, failed = runs.run([
            _Run("interrupted", dataclasses.replace(run, last=resume_at, save=True)),
            _Run("baseline", run),
            _Run("resumed", dataclasses.replace(run, first=resume_at + 1, load=True), resumed=True, after=0),
            _Run("baseline (repeat)", run),
        ])
        if failed is not None:
            assert failed.error is not None
            result = ResumeResult.errored(failed.error, config, failed.exception)
            hint = dtype_error_hint(failed.error.message) if precision == "float64" else None
            if hint is not None:
                result.notes.append(hint)
            return result
        interrupted, baseline, resumed, repeat = traces
        result = judge_resume(baseline, repeat, interrupted, resumed, resume_at, judged, config)
        result.notes.extend(runs.notes)
        wanted = values_wanted(result, baseline, resumed, resume_at)
        if wanted is None:
            return result

        def rerun(last: int, whole: Whole) -> tuple[list[RunTrace], ChildError | None]:
            # A merged path names its rank (`path[rank r]`); each rank's child knows the path alone.
            own = tuple((step, frozenset(own_path(path) for path in paths)) for step, paths in whole)
            again, failed = runs.run([
                _Run("baseline (values)", dataclasses.replace(run, last=last, whole=own)),
                _Run("interrupted (values)", dataclasses.replace(run, last=resume_at, save=True, whole=own,
                                                                 checkpoint=run.checkpoint + ".values")),
                _Run("resumed (values)", dataclasses.replace(run, first=resume_at + 1, last=last, load=True,
                                                             whole=own), resumed=True),
            ])
            return again, None if failed is None else failed.error

        notes = fetch_values(wanted, (baseline, interrupted, resumed), resume_at, rerun)
        result = judge_resume(baseline, repeat, interrupted, resumed, resume_at, judged, config)
        result.notes.extend(runs.notes + notes)
        return result


class _Run(NamedTuple):
    """One run of the check: its phase, its payload, whether it is the resumed run (on the resumed world
    size), and the index of the run it waits for."""

    phase: str
    payload: TrainPayload
    resumed: bool = False
    after: int | None = None


@dataclasses.dataclass
class _Runs:
    """Launches the check's runs: single processes, or worlds of ranks merged into one trace each."""

    timeout: float
    isolation: Isolation
    backend: str
    scratch: str
    #: the ranks of the runs and of the resumed run; (0, 0): single processes, no process group
    worlds: tuple[int, int]
    #: what the merge of ranks set aside, said once in the result
    notes: list[str] = dataclasses.field(default_factory=list)
    #: the replicated State paths (`trainparity._resume._ranks`), fixed by the check's first runs
    replicated: frozenset[str] | None = None
    #: worlds started so far: each meets at a store file of its own (a finished world's file lives on)
    started: int = 0

    def run(self, runs: list[_Run]) -> tuple[list[RunTrace], JobOutcome | None]:
        """Run `runs`; their traces in order, or the failure that ended them."""
        jobs: list[Job] = []
        starts: list[int] = []
        sizes: list[int] = []
        for run in runs:
            size = self.worlds[1] if run.resumed else self.worlds[0]
            waits = None if run.after is None else starts[run.after]
            starts.append(len(jobs))
            sizes.append(size)
            if size == 0:
                jobs.append(Job(TASK, run.payload, run.phase, self.timeout, after=waits, decode=RunTrace.from_wire))
                continue
            # A rank that waits for another run waits for its rank 0, which ends after that world's last barrier.
            self.started += 1
            store = f"{self.scratch}/store.{self.started}"
            jobs += [Job(TASK, dataclasses.replace(run.payload, world=World(self.backend, rank, size, store)),
                         run.phase, self.timeout, rank=rank, after=waits, decode=RunTrace.from_wire)
                     for rank in range(size)]
        ranked = self.worlds != (0, 0)
        # The ranks of a world block in collectives when one of them fails: every job is ended at once.
        outcomes = run_jobs(jobs, isolation=self.isolation, concurrency=len(jobs) if ranked else None,
                            on_failure="all" if ranked else "later")
        failed = first_failure(outcomes) if ranked else first_error(outcomes)
        if failed is not None:
            return [], failed
        if not ranked:
            return [o.output for o in outcomes], None
        groups = [[o.output for o in outcomes[start:start + size]] for start, size in zip(starts, sizes, strict=True)]
        return self._merge(groups, [run.resumed for run in runs]), None

    def _merge(self, groups: list[list[RunTrace]], resumed: list[bool]) -> list[RunTrace]:
        world_size, resume_world_size = self.worlds
        first = self.replicated is None
        if self.replicated is None:
            # From the uninterrupted world only, so that a resumed rank that restored something else is
            # named (`path[rank r]`) instead of making the path rank-local.
            self.replicated = replicated_paths([g for g, r in zip(groups, resumed, strict=True) if not r])
        changes = world_size != resume_world_size
        traces = [merge_ranks(group, self.replicated, unordered=changes) for group in groups]
        set_aside = align(traces, self.replicated, min(self.worlds) if changes else None)
        if not first:
            return traces
        if set_aside.state:
            loaders = sorted({entry for trace in traces for entry in trace.rank_local})
            others = [path for path in set_aside.state if state_entry(path) not in loaders]
            self.notes.append(
                f"not compared across the change from {world_size} to {resume_world_size} ranks, as each rank's own "
                "state, which another number of ranks splits otherwise: "
                + "; ".join(part for part in (
                    f"the State's loaders and samplers ({', '.join(loaders)})" if loaders else "",
                    f"{', '.join(others)}, which the ranks hold differently" if others else "") if part)
                + " (the data stream is judged on the global batch).")
        if set_aside.rng_ranks:
            ranks = set_aside.rng_ranks
            self.notes.append(f"RNG streams of rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                              "not compared: the other world has no such rank.")
        return traces


@dataclasses.dataclass(frozen=True)
class Wanted:
    """The large tensors whose values the report shows, known so far by their digests only."""

    #: differing at the load (the save/load comparison)
    boundary: frozenset[str]
    #: the first step at which training diverged, and its differing tensors
    step: int
    at_step: frozenset[str]


def values_wanted(result: ResumeResult, baseline: RunTrace, resumed: RunTrace, resume_at: int) -> Wanted | None:
    """Which digested tensors the report needs the values of: the save/load mismatches and the first divergence."""
    assert resumed.loaded is not None
    boundary = frozenset(v.path for v in result.violations if v.step == resume_at and v.cause == "not_restored"
                         and isinstance(resumed.loaded.state.get(v.path), Digest))
    diverged = [v for v in result.violations if v.kind == "state_mismatch" and v.step is not None
                and v.step > resume_at]
    step = min((v.step for v in diverged if v.step is not None), default=resume_at)
    at_step = frozenset(v.path for v in diverged if v.step == step
                        and isinstance(baseline.steps[step - 1].state.get(v.path), Digest))
    return Wanted(boundary, step, at_step) if boundary or at_step else None


def fetch_values(wanted: Wanted, traces: tuple[RunTrace, RunTrace, RunTrace], resume_at: int,
                 rerun: Callable[[int, Whole], tuple[list[RunTrace], ChildError | None]]) -> list[str]:
    """Train again the runs the wanted values come from, keeping those tensors whole; put them in the traces.

    `rerun(last, whole)` runs the baseline to step `last`, the interrupted run and the resumed run to
    `last` again, shipping `whole` whole. The runs were reproducible (the baseline ran twice alike), so
    training them again gives the same values: each fetched tensor replaces its digest only if it has
    that digest. Returns notes.
    """
    baseline, interrupted, resumed = traces
    last = wanted.step if wanted.at_step else resume_at
    again, error = rerun(last, ((0, wanted.boundary), (wanted.step, wanted.at_step)))
    if error is not None:
        return [f"the values of the differing tensors could not be fetched ({error.headline()}): "
                "their violations say only that their digests differ."]
    again_baseline, again_interrupted, again_resumed = again
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
        rank=path_rank(mismatch.path),  # a run of several ranks names a rank's own values `path[rank r]`
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
    """Why the resumed batch differs: IDs already consumed (replayed) or from later batches (skipped).
    Named by the first differing position, else by the first sample of the batch that tells."""
    expected = baseline[index].sample_ids or []
    position = next((i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a),
                    min(len(expected), len(actual)))
    earlier = {i for record in baseline[:index] for i in record.sample_ids or []}
    later = {i for record in baseline[index + 1:] for i in record.sample_ids or []}
    belongs = set(expected)
    for at in (position, *range(len(actual))):
        # a sample of the expected batch is not what went wrong, though later epochs bring it back
        if at < len(actual) and actual[at] not in belongs:
            if actual[at] in earlier:
                return "data_replayed", actual[at], at
            if actual[at] in later:
                return "data_skipped", actual[at], at
    return None, actual[position] if position < len(actual) else expected[position], position


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


