"""`check_parallel`: real torch.distributed ranks against the same recipe in a world of size 1.

The process engine starts `world_size` ranks and the reference concurrently (with `backend="threads"`, two
processes: the world's threads and the reference's one). Each child
initializes the default process group (a file store in a temporary directory) before the
recipe's `setup()`, so the recipe reads `dist.get_rank()`/`dist.get_world_size()`, shards
its data and wraps its model in DDP exactly as in production; the reference runs the same
code path in a world of size 1. Each child records, per step, the batch's sample IDs, the
gradients at its optimizer step (a step pre-hook, removed afterwards), the parameters
after the step, and a bounded sample of what its modules returned (forward hooks, removed
afterwards), in the order the modules finished.

Judgement per step, in observation order: the ranks' sample IDs against the reference's
full batch (`data.sample_ids`), the gradients across ranks and then against the reference
(`gradients.<param>`), the parameters across ranks (`replicas.<param>`) and then against the
reference (`parameters.<param>`). Ranks are compared with rank 0, the reference with rank 0.
When the ranks are a tensor-parallel group (all read the reference's batch), a module output
(`outputs.<module>`) or a gradient (`gradients.<param>`) that is a partial sum over the ranks
names the layer whose all-reduce is missing (`tp_partial_not_reduced`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trainparity._parallel._judge import judge_parallel
from trainparity._parallel._rank import REFERENCE, RankPayload
from trainparity._parallel._trace import RankTrace, WorldTrace
from trainparity._process import _session
from trainparity._process._comparing import ComparisonSetup
from trainparity._process._engine import Job, JobOutcome, first_failure, run_jobs
from trainparity._process._options import Deadline, Isolation
from trainparity._process._scratch import scratch_directory
from trainparity._process._world import validate_backend
from trainparity._recipe._reference import RecipeSpec
from trainparity._results._result import ParallelResult
from trainparity._results._violation import ChildError
from trainparity._state._compare import (
    Comparison,
)
from trainparity._validation import check_int

TASK = "trainparity._parallel._rank:run_rank"
THREADS_TASK = "trainparity._parallel._rank:run_threads"


def _validate(world_size: object, backend: object, steps: object) -> tuple[int, str, int]:
    world_size = check_int("world_size", world_size, 2, "the reference is the world of size 1")
    steps = check_int("steps", steps, 1, "optimizer steps")
    return world_size, validate_backend(backend, world_size), steps


@_session.recorded
def check_parallel(
    recipe: RecipeSpec,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    steps: int = 3,
    comparison: Comparison | None = None,
    seed: int = 0,
    precision: _session.Precision | None = None,
    timeout: float | None = None,
    isolation: Isolation | None = None,
    ignore: str | Sequence[str] | None = None,
) -> ParallelResult:
    """Check that `world_size` real torch.distributed ranks train like the same recipe in a world of size 1.

    `backend` is "gloo" (a process per rank), "threads" (every rank a thread of one process, with real
    collectives reduced in memory: worlds of 8 to 64 ranks on a machine of two cores; each rank has its own
    random streams and RANK/LOCAL_RANK) or "nccl". On a mesh (the recipe's `DeviceMesh`, found through its
    DTensors), the ranks that differ only along model dimensions (`tp`, ...) must read the same samples, and
    violations name each rank's mesh coordinate.

    Per step: the ranks' sample IDs together make the reference's batch, every rank holds the
    reference's gradients at its optimizer step, and every rank's parameters after the step
    equal each other's and the reference's. Never raises for a FAIL. `timeout` bounds the whole
    check: a rank that hangs (a collective that never completes) gets every process killed.
    `isolation` is "process" (children of the warmed fork server) or "spawn" (fresh interpreters);
    by default "process", and "spawn" for nccl: a child forked from the fork server may be unable
    to initialize CUDA. `precision="float64"` (default) runs every process in float64 and, without
    a declared comparison, judges with the fixed float64 tolerance; `"native"` keeps the recipe's
    dtypes (exact unless a comparison is declared). `timeout` defaults to 120 s. `precision`,
    `timeout` and `isolation` left at None take the session's defaults (`--trainparity-*` under
    pytest; an isolation the check cannot use, "inprocess" or, for nccl, "process", is passed over).
    """
    world_size, backend, steps = _validate(world_size, backend, steps)
    setup = ComparisonSetup.prepare(recipe, comparison=comparison, precision=precision, seed=seed, isolation=isolation,
                                    timeout=timeout, default_isolation="process", backend=backend,
                                    shown={"world_size": world_size, "backend": backend, "steps": steps},
                                    ignore=ignore)
    with scratch_directory("trainparity-dp-") as scratch:
        def payload(rank: int, size: int, tag: str) -> RankPayload:
            return RankPayload(setup.recipe, setup.seed, steps, backend, rank, size, tag, str(scratch),
                               setup.precision)

        if backend == "threads":  # two children: the world's threads, and the reference's one
            jobs = [Job(THREADS_TASK, payload(0, world_size, "ranks"), "ranks", record=WorldTrace),
                    Job(THREADS_TASK, payload(0, 1, REFERENCE), REFERENCE, record=WorldTrace)]
        else:
            jobs = [Job(TASK, payload(rank, world_size, f"rank {rank}"), f"rank {rank}", rank=rank, record=RankTrace)
                    for rank in range(world_size)]
            jobs.append(Job(TASK, payload(0, 1, REFERENCE), REFERENCE, record=RankTrace))
        outcomes = run_jobs(jobs, deadline=setup.deadline, isolation=setup.isolation, concurrency=len(jobs),
                            on_failure="all")
        error = _first_error(outcomes, setup.deadline, backend)
    if error is not None:
        return setup.errored(ParallelResult, error)
    traces: list[RankTrace] = []
    for outcome in outcomes:
        if isinstance(outcome.output, WorldTrace):
            if outcome.output.failure is not None:
                return setup.errored(ParallelResult, outcome.output.failure)
            traces += outcome.output.ranks
        else:
            assert isinstance(outcome.output, RankTrace)
            traces.append(outcome.output)
    *ranks, reference = traces
    return judge_parallel(reference, ranks, setup.judged, setup.config)


#: what else hangs a world of threads: the ranks run one at a time and hand the turn on only in torch.distributed's
#: collectives, receives and group set-up
THREADS_HANG = ("; on threads, a rank that waits anywhere else (a store, a group of another backend, a lock) keeps "
                "every other rank from running")


def _first_error(outcomes: Sequence[JobOutcome], deadline: Deadline, backend: str) -> ChildError | None:
    """The failure that ended the check; on a timeout, with the stacks of every process."""
    failed = first_failure(outcomes)
    if failed is None or failed.error is None:
        return None
    error = failed.error
    if error.kind != "timeout":
        return error
    stacks = [f"{o.phase}:\n{o.error.traceback}" for o in outcomes if o.error is not None and o.error.traceback]
    return dataclasses.replace(
        error,
        message=f"did not finish within {deadline.describe()} (a process that hangs, e.g. in a collective that "
        f"never completes, blocks the others{THREADS_HANG if backend == 'threads' else ''}); every process of the "
        "check was killed",
        traceback="Stacks of every process shortly before the timeout (most recent call first):\n"
        + "\n".join(stacks),
    )
