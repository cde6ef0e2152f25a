"""A run of several ranks seen as one trace, for the resume check across ranks and world sizes.

Each rank of a run records its own `RunTrace`; the parent merges them into one, so that the
resume judgement compares runs of any world size as it compares single processes:

- RNG streams are per rank: `rng.torch[rank 1]`. Across a world-size change, the ranks both
  worlds have are compared.
- The State is judged on the values every rank holds alike (parameters and optimizer state are
  gathered by the snapshot walk, so FSDP, DDP and tensor parallelism all give whole values): a
  path that all ranks of the uninterrupted world hold alike, in every snapshot (every path but
  the loaders', when that world has a single rank), is *replicated*
  and merges into one entry under its own path, rank 0's value. A rank of another run whose
  value differs from its rank 0's is added as `path[rank r]` (and expected to hold the replicated
  value), so a rank that loaded nothing is still seen. Other paths are *rank-local* (a loader's
  position, a per-rank counter): `path[rank r]` for each rank, compared when the world size is
  kept and set aside, with a note, when it changes, since another number of ranks splits them
  otherwise.
- The batch of a step is the global batch: the ranks' sample IDs in rank order, each ID once
  (the ranks of a tensor-parallel group read the same batch). Across a world-size change the
  order within a step is not the same, so the global batch is compared as a set, in sorted order.
- The loss of a step is the mean of the ranks' losses: with equal shards, the global batch's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TypeVar

from trainparity._batches._sample_ids import SampleIds
from trainparity._resume._trace import Boundary, RunTrace, StepRecord
from trainparity._state._compare import EXACT, Snapshot, compare_leaves
from trainparity._state._snapshot import state_entry

T = TypeVar("T")

_AT_RANK = re.compile(r"^(.*)\[rank (\d+)\]$")


def at_rank(path: str, rank: int) -> str:
    return f"{path}[rank {rank}]"


def _split(path: str) -> tuple[str, int | None]:
    """A merged path's own path and rank (None when it has no rank)."""
    match = _AT_RANK.match(path)
    return (path, None) if match is None else (match.group(1), int(match.group(2)))


def own_path(path: str) -> str:
    """A merged path without its rank: the path in the rank's own snapshot."""
    return _split(path)[0]


def path_rank(path: str) -> int | None:
    """The rank a merged path names, if it names one."""
    return _split(path)[1]


def _points(trace: RunTrace) -> list[tuple[Snapshot, Snapshot]]:
    """(State, RNG streams) at each point a trace observed: every step, then the save and the load."""
    points = [(record.state, record.rng) for record in trace.steps]
    return points + [(b.state, b.rng) for b in (trace.saved, trace.loaded) if b is not None]


def replicated_paths(runs: Sequence[Sequence[RunTrace]]) -> frozenset[str]:
    """The State paths that every rank of every given run holds alike, in every snapshot."""
    seen: set[str] = set()
    local: set[str] = set()
    for ranks in runs:
        own = {entry for trace in ranks for entry in trace.rank_local}
        # the ranks of one run observe the same points
        for point in zip(*(_points(trace) for trace in ranks), strict=True):
            snapshots = [state for state, _ in point]
            first = snapshots[0]
            for snapshot in snapshots:
                seen.update(snapshot)
                local.update(path for path in snapshot.keys() ^ first.keys())
                local.update(path for path in snapshot if state_entry(path) in own)
                local.update(path for path, value in snapshot.items() if path in first
                             and compare_leaves(first[path], value, EXACT) is not None)
    return frozenset(seen - local)


def _merge_state(snapshots: Sequence[Snapshot], replicated: frozenset[str]) -> Snapshot:
    out: Snapshot = {}
    first = snapshots[0]
    for rank, snapshot in enumerate(snapshots):
        for path, value in snapshot.items():
            if path not in replicated:
                out[at_rank(path, rank)] = value
            elif rank == 0:
                out[path] = value
            elif path not in first or compare_leaves(first[path], value, EXACT) is not None:
                out[at_rank(path, rank)] = value
    return out


def _each_rank(values: Sequence[dict[str, T]]) -> dict[str, T]:
    """Every rank's own values under its rank's path (RNG streams, modules' modes)."""
    return {at_rank(path, rank): value for rank, found in enumerate(values) for path, value in found.items()}


def _global_batch(ranks: Sequence[SampleIds | None], unordered: bool) -> SampleIds | None:
    if any(ids is None for ids in ranks):
        return None
    batch = list(dict.fromkeys(sample for ids in ranks if ids is not None for sample in ids))
    return sorted(batch, key=lambda sample: (isinstance(sample, str), sample)) if unordered else batch


def _merge_step(records: Sequence[StepRecord], replicated: frozenset[str], unordered: bool) -> StepRecord:
    losses = [record.loss for record in records]
    loss = None if any(value is None for value in losses) else sum(v for v in losses if v is not None) / len(losses)
    return StepRecord(records[0].step, _each_rank([r.rng for r in records]),
                      _global_batch([r.sample_ids for r in records], unordered), loss,
                      _merge_state([r.state for r in records], replicated),
                      modes=_each_rank([r.modes for r in records]))


def _merge_boundary(boundaries: Sequence[Boundary | None], replicated: frozenset[str]) -> Boundary | None:
    if not all(isinstance(b, Boundary) for b in boundaries):
        return None
    present = [b for b in boundaries if b is not None]
    return Boundary(_merge_state([b.state for b in present], replicated), _each_rank([b.rng for b in present]),
                    _each_rank([b.modes for b in present]))


def merge_ranks(ranks: Sequence[RunTrace], replicated: frozenset[str], unordered: bool) -> RunTrace:
    """One run's rank traces as one trace (see the module's rules); `unordered` sorts each global batch."""
    steps = [_merge_step([trace.steps[index] for trace in ranks], replicated, unordered)
             for index in range(len(ranks[0].steps))]
    unobserved = sorted({entry for trace in ranks for entry in trace.unobserved})
    return RunTrace(steps, _merge_boundary([t.loaded for t in ranks], replicated),
                    _merge_boundary([t.saved for t in ranks], replicated), unobserved, ranks[0].rank_local)


@dataclasses.dataclass(frozen=True)
class SetAside:
    """What a world-size change leaves uncompared."""

    #: rank-local State paths (without their rank)
    state: list[str]
    #: ranks whose RNG streams have no counterpart in the other world
    rng_ranks: list[int]


def align(traces: Sequence[RunTrace], replicated: frozenset[str], common_ranks: int | None) -> SetAside:
    """Give the merged traces of one check the same paths, in place.

    A rank that differs from its rank 0 on a replicated path is expected to hold the replicated
    value in every other trace. With `common_ranks` (the world size changes), rank-local State
    paths are dropped, and so are the RNG streams of ranks at or beyond `common_ranks`.
    """
    points = [point for trace in traces for point in _points(trace)]
    diverged = {path for state, _ in points for path in state
                if _split(path)[1] is not None and _split(path)[0] in replicated}
    local: set[str] = set()
    extra_rng: set[int] = set()
    for state, rng in points:
        for path in diverged - state.keys():
            own = _split(path)[0]
            if own in state:
                state[path] = state[own]
        if common_ranks is None:
            continue
        for path in list(state):
            own, rank = _split(path)
            if rank is not None and own not in replicated:
                local.add(own)
                del state[path]
        for path in list(rng):
            rank = _split(path)[1]
            if rank is not None and rank >= common_ranks:
                extra_rng.add(rank)
                del rng[path]
    return SetAside(sorted(local), sorted(extra_rng))
