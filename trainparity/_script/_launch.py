"""A script launched by `torchrun`: observed on every rank, one trace for the launch.

The check's `sitecustomize` runs in torchrun's own process (the launcher) and in each worker it starts. The launcher
observes nothing: it leaves the check's environment to its workers and, as it exits, reads what they wrote (each
in `rank-<RANK>/` of the run's directory) and writes the run's one trace, or the error of the rank that failed
first. A worker is observed as a script run alone is; in the interrupted run it ends at its first optimizer step
after the step any rank saved after, since most data-parallel scripts save on rank 0 only. Workers end together
(`wait_for_peers`).

The launch's trace, per step: the sample IDs of the replicas of one stage in rank order (together, the step's
batch; a pipeline's stages read the same samples), the mean of the losses the ranks computed (each rank's loss is
the mean over its shard, as DDP averages the gradients), and each State path as the lowest rank holding it has it
(the parameters each stage's optimizer steps, all of them). Ranks whose modules hold the same paths are replicas of
one another: where their copies differ at the load, or else after a step, the first such differences are kept
(`RunTrace.copies`).
"""

from __future__ import annotations

import atexit
import os
import pathlib
import re
import sys
from collections.abc import Sequence

from trainparity._process import _wire as wire
from trainparity._process._child import ERROR_FILE, RAISED_EXIT, RESULT_FILE
from trainparity._records import read
from trainparity._results._violation import Violation
from trainparity._resume._trace import GRADIENTS, Boundary, RankCopy, RunTrace, StepRecord
from trainparity._state._compare import EXACT, Snapshot, compare_snapshots

#: the prefix of the paths of a script's modules (`Recorder.state`): ranks whose modules hold the same are replicas
MODEL = "model."
#: the path of the names of the parameters an optimizer's param group steps (`_entries`' walk of an optimizer)
STEPPED = re.compile(r"^optimizer(\.\d+)?\.param_groups\.\d+\.params$")
#: the store's keys that count the workers that ended their run, and say that all did
ARRIVED, ALL_ARRIVED = "trainparity/ended", "trainparity/all-ended"
#: the file a worker leaves in the launch's directory once its rank wrote a checkpoint the interrupted run ends at:
#: the step after which it saved
SAVED = "saved"


def is_launcher() -> bool:
    """Whether this process is torchrun's launcher (`torchrun ...` or `python -m torch.distributed.run ...`)."""
    argv = sys.orig_argv
    module = "torch.distributed.run" in argv and argv[argv.index("torch.distributed.run") - 1] == "-m"
    return module or pathlib.Path(sys.argv[0]).name == "torchrun"


def worker_rank() -> int | None:
    """This process's rank when torchrun started it (it sets TORCHELASTIC_RUN_ID and RANK for its workers)."""
    rank = os.environ.get("RANK")
    return int(rank) if os.environ.get("TORCHELASTIC_RUN_ID") and rank is not None and rank.isdigit() else None


def rank_directory(launch: pathlib.Path, rank: int) -> pathlib.Path:
    directory = launch / f"rank-{rank}"
    directory.mkdir(exist_ok=True)
    return directory


def mark_saved(launch: pathlib.Path, step: int) -> None:
    """Tell the launch's other workers that this rank's checkpoint after `step` ends the interrupted run (written,
    then renamed into place: a reader never sees part of it)."""
    partial = launch / f"{SAVED}.{os.getpid()}"
    partial.write_text(str(step))
    os.replace(partial, launch / SAVED)


def saved_after(launch: pathlib.Path) -> int | None:
    """The step after which a rank of the launch saved the checkpoint the interrupted run ends at; None before any
    did."""
    try:
        return int((launch / SAVED).read_text())
    except FileNotFoundError:
        return None


def wait_for_peers() -> None:
    """Return once every rank of the launch got here (the point where each ends its run): a worker that exits
    while a peer still reads its last collective's data makes the peer's gloo raise "Connection closed by peer".
    Through the default group's store, which blocks without polling; nothing to wait for outside a group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    store = dist.distributed_c10d._get_default_store()
    if store.add(ARRIVED, 1) == dist.get_world_size():
        store.set(ALL_ARRIVED, "1")
    store.wait([ALL_ARRIVED])


def install_launcher(launch: pathlib.Path) -> None:
    """Write the launch's trace or error once torchrun has ended (its workers all exited)."""
    atexit.register(_write_launch, launch)


def _write_launch(launch: pathlib.Path) -> None:
    ranks = sorted((int(d.name.removeprefix("rank-")), d) for d in launch.glob("rank-*") if d.is_dir())
    errors = [(record, rank) for rank, d in ranks if (d / ERROR_FILE).exists()
              for record in [wire.load(d / ERROR_FILE)]]
    if errors:  # the first to fail is the cause: the others lost their peer
        record, rank = min(errors, key=lambda error: float(error[0].get("raised_at", 0.0)))
        wire.dump({**record, "rank": rank}, launch / ERROR_FILE)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(RAISED_EXIT)
    if ranks and all((d / RESULT_FILE).exists() for _, d in ranks):
        traces = [read(RunTrace, wire.load(d / RESULT_FILE), f"rank {rank}'s trace") for rank, d in ranks]
        wire.dump(merged(traces), launch / RESULT_FILE)


def merged(ranks: Sequence[RunTrace]) -> RunTrace:
    """The launch's trace from its ranks' (in rank order); steps that not every rank took are left out."""
    steps = [_merged_step(records) for records in zip(*(trace.steps for trace in ranks), strict=False)]
    return RunTrace(steps, _merged_boundary([t.loaded for t in ranks]), _merged_boundary([t.saved for t in ranks]),
                    sorted({entry for t in ranks for entry in t.unobserved}),
                    holders={k: v for t in reversed(ranks) for k, v in t.holders.items()},
                    copies=_first_copies(ranks))


def _replicas(snapshots: Sequence[Snapshot]) -> list[list[int]]:
    """The ranks grouped by the paths their modules hold (a stage's replicas: every rank under plain data
    parallelism), each group in rank order, the groups in the order of their first ranks."""
    groups: dict[frozenset[str], list[int]] = {}
    for rank, snapshot in enumerate(snapshots):
        groups.setdefault(frozenset(path for path in snapshot if path.startswith(MODEL)), []).append(rank)
    return list(groups.values())


def _union(snapshots: Sequence[Snapshot]) -> Snapshot:
    """Each path as the lowest rank holding it has it, but the parameters an optimizer's group steps: those of every
    stage, in stage order (each stage's optimizer steps its own)."""
    union: Snapshot = {}
    for snapshot in snapshots:
        for path, leaf in snapshot.items():
            union.setdefault(path, leaf)
    for path in [p for p in union if STEPPED.search(p)]:
        stages = [snapshots[group[0]].get(path) for group in _replicas(snapshots)]
        union[path] = ",".join(dict.fromkeys(names for names in stages if isinstance(names, str) and names))
    return union


def _merged_step(records: Sequence[StepRecord]) -> StepRecord:
    # the samples of one stage's replicas (a pipeline's stages read the same ones): its first that names any
    stage = next((group for group in _replicas([r.state for r in records])
                  if any(records[rank].sample_ids is not None for rank in group)), [])
    ids = [i for rank in stage for i in records[rank].sample_ids or []]
    losses = [r.loss for r in records if r.loss is not None]
    starts = [r.start for r in records if r.start is not None]
    return StepRecord(records[0].step, records[0].rng, ids if stage else None,
                      sum(losses) / len(losses) if losses else None, _union([r.state for r in records]),
                      _union(starts) if starts else None, records[0].modes)


def _merged_boundary(boundaries: Sequence[Boundary | None]) -> Boundary | None:
    taken = [b for b in boundaries if b is not None]
    if not taken:
        return None
    return Boundary(_union([b.state for b in taken]), taken[0].rng, taken[0].modes)


def _first_copies(ranks: Sequence[RunTrace]) -> list[RankCopy]:
    """The copies that differ between replicas (ranks holding the same paths): at the load if any do there, else at
    the first step where any do."""
    loads = [trace.loaded.state for trace in ranks if trace.loaded is not None]
    if len(loads) == len(ranks) and ranks[0].steps:
        copies = _differing(loads, ranks[0].steps[0].step - 1, at_load=True)
        if copies:
            return copies
    for records in zip(*(trace.steps for trace in ranks), strict=False):
        copies = _differing([record.state for record in records], records[0].step)
        if copies:
            return copies
    return []


def _differing(snapshots: Sequence[Snapshot], step: int, at_load: bool = False) -> list[RankCopy]:
    """Each rank's differences from the first of its replicas."""
    return [RankCopy(step, rank, group[0], m, at_load) for group in _replicas(snapshots) for rank in group[1:]
            for m in compare_snapshots(snapshots[group[0]], snapshots[rank], EXACT)]


def copy_violations(trace: RunTrace) -> list[Violation]:
    """A launch's replicas that disagree, as violations: a gradient never all-reduced, a State restored on some ranks
    only, replicas drifted apart after a step."""
    unsynchronized = any(c.mismatch.path.startswith(GRADIENTS) for c in trace.copies if not c.at_load)
    found = []
    for copy in trace.copies:
        mismatch, rank, first = copy.mismatch, copy.rank, copy.first
        cause: str | None
        if copy.at_load:
            kind, cause, preface = "state_mismatch", "not_restored", (
                f"Rank {rank}'s state right after the load differs from rank {first}'s: the checkpoint was restored "
                "on some ranks only (loaded on one rank and never broadcast to the others?).")
        elif mismatch.path.startswith(GRADIENTS):
            kind, cause, preface = "gradient_mismatch", "grads_not_synchronized", (
                f"Rank {rank} holds other gradients than rank {first} at its optimizer step: they were not all-reduced "
                "(the model not wrapped in DistributedDataParallel, or its gradients never all-reduced?).")
        else:
            kind, cause, preface = "replica_mismatch", "grads_not_synchronized" if unsynchronized else None, (
                f"Rank {rank}'s state after the step differs from rank {first}'s: the replicas drifted apart.")
        found.append(Violation(kind, mismatch.path, f"{preface}\n{mismatch.message}", step=copy.step,
                               expected=mismatch.expected, actual=mismatch.actual, cause=cause, rank=rank))
    return found
