"""`check_resume`: save, real process exit, fresh-process load and continue vs uninterrupted training.

Runs (each in a fresh process): two uninterrupted baselines and the interrupted run that
trains to `resume_at` and saves, concurrently; then the resumed run that loads and trains
the rest. These snapshot the State at the save, the load and the end; a check they do not
PASS runs again with a snapshot after every step, and its report is judged on those. Judgement,
in observation order: the State right after `load` against the State right after `save` (cause
`not_restored`), then per resumed step the RNG streams at the start of the step, the batch's
sample IDs, the loss and the State after the step against the baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from trainparity._process import _session
from trainparity._process._comparing import ComparisonSetup
from trainparity._process._engine import Job, JobOutcome, first_error, first_failure, run_jobs
from trainparity._process._options import Deadline, Isolation
from trainparity._process._scratch import scratch_directory
from trainparity._process._world import World, validate_backend
from trainparity._recipe._recipe import Recipe
from trainparity._recipe._reference import RecipeRef, RecipeSpec
from trainparity._results._result import ResumeResult
from trainparity._results._violation import ChildError, JsonValue, Outcome
from trainparity._resume._judge import judge_resume
from trainparity._resume._ranks import align, merge_ranks, own_path, replicated_paths
from trainparity._resume._trace import RunTrace, TrainPayload, Whole, WorldRuns
from trainparity._resume._values import fetch_values, values_wanted
from trainparity._state._compare import (
    Comparison,
    ExactComparison,
)
from trainparity._state._snapshot import state_entry
from trainparity._validation import check_argument, check_int, check_optional_int, check_resume_at

TASK = "trainparity._resume._trace:train_run"
THREADS_TASK = "trainparity._resume._trace:train_threads"


def _validate_steps(steps: object, resume_at: object) -> tuple[int, int]:
    steps = check_int("steps", steps, 2, "one step before and one after the resume")
    if resume_at is None:
        return steps, steps // 2
    return steps, check_resume_at(resume_at, steps)


def _validate_worlds(world_size: object, resume_world_size: object) -> tuple[int, int]:
    world_size = check_int("world_size", world_size, 1, "the ranks of every run but the resumed one")
    resumed = check_optional_int("resume_world_size", resume_world_size, 1, "the same as world_size")
    return world_size, world_size if resumed is None else resumed


def _require_own_checkpoint_code(ref: RecipeRef, world_size: int, resume_world_size: int) -> None:
    recipe_class = ref.recipe_class()
    check_argument(recipe_class.save is not Recipe.save and recipe_class.load is not Recipe.load,
                   f"resume_world_size={resume_world_size} != world_size={world_size} needs {recipe_class.__name__}'s "
                   "own save() and load() (for example with torch.distributed.checkpoint): the default tp.save_state "
                   "file of each rank holds that rank's loader position and RNG state, which another number of ranks "
                   "splits otherwise")


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
    ignore: str | Sequence[str] | None = None,
) -> ResumeResult:
    """Check that saving at `resume_at`, exiting, loading in a fresh process and continuing
    reproduces `steps` steps of uninterrupted training. Never raises for a FAIL.

    `resume_at` defaults to `steps // 2`. `isolation` is "process" (a child of the warmed
    fork server; the default), "spawn" (a new interpreter) or "inprocess" (no isolation, for
    debugging). `timeout` bounds the whole check: its runs, the reruns that fetch the values a report
    shows, and their process starts (default 120 s); a check past it ends in ERROR within about two
    seconds. Left at None, both take the session's defaults (`--trainparity-isolation`,
    `--trainparity-timeout` under pytest).

    With `world_size > 1`, every run is a world of real torch.distributed ranks (`backend`), which
    the recipe joins before `setup()` as under torchrun, and saves and loads with its own code (for
    example torch.distributed.checkpoint); `resume_world_size` resumes on another number of ranks.
    `backend="threads"` runs each world as threads of one process (8 to 64 ranks on a small machine), the
    resumed world in a new process after the interrupted one's has exited. Runs of several ranks are judged
    on gathered values, per-rank RNG streams (`rng.torch[rank 1]`) and the global batch (see docs/api.md).
    `precision` is "native" (the recipe's dtypes, judged exactly unless a comparison is declared) or
    "float64"; left at None it is "native", but when the world size changes, whose other reduction order
    changes the rounding, the session's default ("float64": every run in float64, judged with the fixed
    float64 tolerance).
    """
    steps, resume_at = _validate_steps(steps, resume_at)
    world_size, resume_world_size = _validate_worlds(world_size, resume_world_size)
    ranked = max(world_size, resume_world_size) > 1
    backend = validate_backend(backend, max(world_size, resume_world_size))
    shown: dict[str, JsonValue] = {"steps": steps, "resume_at": resume_at}
    if ranked:
        shown.update(world_size=world_size, resume_world_size=resume_world_size, backend=backend)
    setup = ComparisonSetup.prepare(
        recipe, comparison=comparison, seed=seed, isolation=isolation, timeout=timeout, default_isolation="process",
        backend=backend if ranked else None, shown=shown, ignore=ignore,
        # another world size reduces in another order, which changes the rounding: the session's default
        precision="native" if precision is None and world_size == resume_world_size else precision)
    if world_size != resume_world_size:
        _require_own_checkpoint_code(setup.recipe, world_size, resume_world_size)
    worlds = (world_size, resume_world_size) if ranked else (0, 0)
    with scratch_directory("trainparity-checkpoint-") as checkpoint_dir:
        # Exact comparisons are decided by digests; a tolerance needs the values themselves.
        run = TrainPayload(setup.recipe, setup.seed, 1, steps, f"{checkpoint_dir}/checkpoint",
                           digests=isinstance(setup.judged, ExactComparison), precision=setup.precision)
        return _run_and_judge(setup, run, resume_at, backend, worlds, str(checkpoint_dir))


def _run_and_judge(setup: ComparisonSetup, run: TrainPayload, resume_at: int, backend: str, worlds: tuple[int, int],
                   checkpoint_dir: str) -> ResumeResult:
    """The four runs, judged; then again with a snapshot after every step unless they PASS; then the values the
    report shows, where digests alone were compared."""
    # A PASS needs the State only where the runs meet (the save, the load, the end) beside every step's RNG
    # streams, samples and loss, and hashing the State of a large model after every step doubles the check's
    # cost. Anything but a PASS is judged again on runs that snapshot every step, so that the report names
    # the first step and path that diverged.
    sparse = dataclasses.replace(run, states_at=frozenset({resume_at, run.last}))
    started = 0
    judged_sparse: ResumeResult | None = None
    for payload in (sparse, dataclasses.replace(run, checkpoint=f"{checkpoint_dir}/checkpoint.steps")):
        runs = _Runs(setup.deadline, setup.isolation, backend, checkpoint_dir, worlds, started=started)
        # The resumed run needs only the interrupted one: it starts as soon as that has saved,
        # while the baselines run beside them.
        traces, failed = runs.run([
            _Run("interrupted", dataclasses.replace(payload, last=resume_at, save=True)),
            _Run("baseline", payload),
            _Run("resumed", dataclasses.replace(payload, first=resume_at + 1, load=True), resumed=True, after=0),
            _Run("baseline (repeat)", payload),
        ])
        if failed is not None:
            assert failed.error is not None
            if judged_sparse is None:
                return setup.errored(ResumeResult, failed.error, failed.exception)
            # The verdict stands on the first runs; only the step the report names is coarser.
            judged_sparse.notes.append(
                f"the runs that snapshot the State at every step did not finish ({failed.error.headline()}): "
                f"the State was compared after steps {resume_at} and {run.last} only, so a difference in it "
                "may have begun at an earlier step than the one named")
            return judged_sparse
        interrupted, baseline, resumed, repeat = traces
        result = judge_resume(baseline, repeat, interrupted, resumed, resume_at, setup.judged, setup.config)
        if result.outcome is Outcome.PASS:
            break
        result.notes.extend(runs.notes)
        judged_sparse = result
        started = runs.started
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
    result = judge_resume(baseline, repeat, interrupted, resumed, resume_at, setup.judged, setup.config)
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

    deadline: Deadline
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
                jobs.append(Job(TASK, run.payload, run.phase, after=waits, record=RunTrace))
                continue
            self.started += 1
            store = f"{self.scratch}/store.{self.started}"
            if self.backend == "threads":  # the whole world in one process
                jobs.append(Job(THREADS_TASK, dataclasses.replace(run.payload, world=World("threads", 0, size, store)),
                                run.phase, after=waits, record=WorldRuns))
                continue
            # A rank that waits for another run waits for its rank 0, which ends after that world's last barrier.
            jobs += [Job(TASK, dataclasses.replace(run.payload, world=World(self.backend, rank, size, store)),
                         run.phase, rank=rank, after=waits, record=RunTrace)
                     for rank in range(size)]
        ranked = self.worlds != (0, 0)
        # The ranks of a world block in collectives when one of them fails: every job is ended at once.
        outcomes = run_jobs(jobs, deadline=self.deadline, isolation=self.isolation,
                            concurrency=len(jobs) if ranked else None,
                            on_failure="all" if ranked else "later")
        failed = first_failure(outcomes) if ranked else first_error(outcomes)
        if failed is None:  # a threaded world reports its failed rank in its record
            failed = next((JobOutcome(o.phase, None, dataclasses.replace(o.output.failure, phase=o.phase))
                           for o in outcomes if isinstance(o.output, WorldRuns) and o.output.failure is not None),
                          None)
        if failed is not None:
            return [], failed
        if not ranked:
            return [o.output for o in outcomes], None
        if self.backend == "threads":
            groups = [outcomes[start].output.ranks for start in starts]
        else:
            groups = [[o.output for o in outcomes[start:start + size]]
                      for start, size in zip(starts, sizes, strict=True)]
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

