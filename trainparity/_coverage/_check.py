"""`check_coverage`: audit the sample IDs that ranks observed, epoch by epoch (an epoch may come in several windows).

The policies are planned first (when none can be judged, the check ABSTAINs before reading
anything); collection (`_collect.py`) iterates the user's iterables (DataLoaders, samplers,
batch samplers, lists) rank by rank into numpy arrays of IDs; the audit (`_audit.py`) judges
the policies over those arrays; this module turns its findings into `tp.Violation`s with
messages. An exception raised by the user's code (iterables, `sample_ids`, what it returns)
is an ERROR result; IDs that are not ints or strings are a TypeError naming the batch and position.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias, cast

import numpy as np

from trainparity._batches._reading import ReadingTimedOut, UserCodeFailed
from trainparity._batches._sample_ids import IdArray
from trainparity._coverage._audit import (
    CROSS_RANK,
    KINDS,
    MISSING,
    PADDING,
    REPEATED,
    SAME_RANK,
    UNEXPECTED,
    Codes,
    Findings,
    Observations,
    Plan,
    audit,
)
from trainparity._coverage._collect import Window, collect
from trainparity._coverage._policy import (
    AtLeastOnce,
    CoveragePolicy,
    DistinctEpochOrder,
    ExactlyOnce,
    ExpectedPadding,
    NoCrossRankOverlap,
    resolve_policies,
    shared_universe,
)
from trainparity._coverage._record import CoverageRecorder
from trainparity._coverage._universe import Universe
from trainparity._process import _session
from trainparity._process._alarm import interrupted_at
from trainparity._process._options import Deadline
from trainparity._results._result import CoverageResult
from trainparity._results._violation import JsonValue, Outcome, Violation
from trainparity._validation import check_argument, check_callable, check_int, check_optional_int

#: how many violations are listed when max_violations=None (a universe of 10**12 IDs may miss them all)
DEFAULT_MAX_VIOLATIONS = 1_000_000
#: what `check_coverage` audits: one window `{rank: batches}`, one per epoch, `(epoch, {rank: batches})`
#: windows, or a recorder
RankBatches: TypeAlias = (Mapping[int, Iterable[Any]] | Iterable[Mapping[int, Iterable[Any]]]
                           | Iterable[tuple[int, Mapping[int, Iterable[Any]]]] | CoverageRecorder)
Policies: TypeAlias = CoveragePolicy | list[CoveragePolicy] | tuple[CoveragePolicy, ...]


@_session.recorded
def check_coverage(
    ranks: RankBatches,
    *,
    policy: Policies,
    sample_ids: Callable[[Any], Any] | None = None,
    max_violations: int | None = None,
    timeout: float | None = None,
) -> CoverageResult:
    """Audit which sample IDs each rank observed against `policy`. Never raises for a FAIL.

    `ranks` is `{rank: iterable of batches}` for one window (epoch 0), a sequence of such
    mappings (one per epoch), a sequence of `(epoch, {rank: iterable of batches})` windows (the
    consecutive windows of one epoch are judged together, each rank's stream joined across them,
    e.g. a job preempted mid-epoch and resumed on fewer ranks), or a `tp.CoverageRecorder` (its
    recorded epochs). `sample_ids(batch)`
    extracts a batch's IDs (default: the batch is the IDs; a lone int or string is one ID);
    a `tp.WorkerBatch` is unwrapped first. `max_violations` stops listing violations after the
    first n in observation order (the notes then give the counts of all); None lists at most
    `DEFAULT_MAX_VIOLATIONS` (1,000,000). `timeout` bounds the reading of the iterables, which runs in this
    process: past it the reading is interrupted (on the main thread; see docs/api.md) and the check ends in
    ERROR. None (the default, whatever the session's default) reads them to their end, however long.
    """
    deadline = None if timeout is None else Deadline.after(timeout)
    policies = resolve_policies(policy)
    if sample_ids is not None:
        check_callable("sample_ids", sample_ids, "a function batch -> IDs")
    max_violations = check_optional_int("max_violations", max_violations, 1, "the first 10**6 listed")
    check_argument(not (isinstance(ranks, CoverageRecorder) and sample_ids is not None),
                   "a CoverageRecorder already holds IDs: pass sample_ids= to CoverageRecorder(...) instead")
    windows = _windows(ranks)
    epochs = list(dict.fromkeys(label for label, _ in windows))
    config: dict[str, Any] = {
        "policy": [p.describe() for p in policies],
        "epochs": epochs,
        "ranks": sorted({int(rank) for _, mapping in windows for rank in mapping}),
    }
    if len(epochs) < len(windows):  # some epoch was observed in several windows (a preemption, a resume)
        config["windows"] = [{"epoch": label, "ranks": sorted(int(rank) for rank in mapping)}
                             for label, mapping in windows]
    if max_violations is not None:
        config["max_violations"] = max_violations
    plan, abstained = _plan(policies, len(epochs))
    if not plan.judges_anything:  # decided before reading anything: the input may be an endless stream
        return CoverageResult(Outcome.ABSTAIN, [], [], config, reason="; ".join(abstained))
    try:
        with contextlib.nullcontext() if deadline is None else interrupted_at(deadline):
            observations = collect(windows, sample_ids)
    except UserCodeFailed as failure:
        return failure.result(config, CoverageResult)
    except ReadingTimedOut as late:
        assert deadline is not None
        return late.result(config, deadline, CoverageResult)
    findings, coded = audit(observations, plan)
    limit = DEFAULT_MAX_VIOLATIONS if max_violations is None else max_violations
    violations = _violations(findings, observations, coded, plan.universe, limit)
    notes = list(findings.notes)
    if len(findings) > limit:
        counts = ", ".join(f"{kind}={count}" for kind, count in sorted(findings.counts().items()))
        cap = (f"max_violations={limit}" if max_violations is not None
               else f"at most {limit} are listed when max_violations=None")
        notes.append(f"listed the first {limit} of {len(findings)} violations ({cap}); all of them: {counts}")
    if violations:
        notes += [f"not judged: {reason}" for reason in abstained]
        return CoverageResult(Outcome.FAIL, violations, notes, config)
    if abstained:
        return CoverageResult(Outcome.ABSTAIN, [], notes, config, reason="; ".join(abstained))
    return CoverageResult(Outcome.PASS, [], notes, config)


def _is_window(item: object) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping)


def _windows(ranks: object) -> list[Window]:
    """The observation windows as (epoch label, {rank: iterable}); windows of one epoch are consecutive."""
    if isinstance(ranks, CoverageRecorder):
        return list(ranks.windows())
    if isinstance(ranks, Mapping):
        windows: list[Window] = [(0, ranks)]
    else:
        check_argument(not isinstance(ranks, (str, bytes)) and isinstance(ranks, Iterable),
                       "ranks= must be a mapping {rank: iterable of batches}, a sequence of such mappings (one per "
                       "epoch), a sequence of (epoch, {rank: iterable of batches}) windows or a tp.CoverageRecorder, "
                       f"got {type(ranks).__name__}")
        items = list(cast(Iterable[Any], ranks))
        check_argument(items, "ranks= is an empty sequence: pass one mapping {rank: iterable of batches} per epoch")
        if any(_is_window(item) for item in items):
            first = [_is_window(item) for item in items].index(True)
            windows = []
            for index, item in enumerate(items):
                check_argument(_is_window(item), f"ranks= item {index} is a {type(item).__name__}, but item {first} "
                               "is an (epoch, {rank: iterable}) window: pass only windows, or only mappings (one per "
                               "epoch)")
                epoch, mapping = item
                check_argument(isinstance(epoch, (int, np.integer)) and not isinstance(epoch, (bool, np.bool_))
                               and epoch >= 0, f"ranks= window {index} must be (epoch, {{rank: iterable of batches}}) "
                               f"with an epoch int >= 0, got the epoch {epoch!r}")
                windows.append((int(epoch), mapping))
            done = set()
            for index, (epoch, _) in enumerate(windows):
                before = windows[index - 1][0]
                check_argument(epoch not in done or epoch == before, f"ranks= window {index} is of epoch {epoch}, but "
                               f"the window before it is of epoch {before}: list the windows of one epoch one after "
                               "the other")
                done.add(epoch)
        else:
            windows = list(enumerate(items))
    several = len(windows) != len({label for label, _ in windows})
    for index, (label, mapping) in enumerate(windows):
        where = f"window {index} (epoch {label})" if several else f"epoch {label}"
        check_argument(isinstance(mapping, Mapping), f"ranks= {where} must be a mapping {{rank: iterable of batches}}, "
                       f"got {type(mapping).__name__}")
        check_argument(mapping, f"ranks= {where} maps no rank: pass {{rank: iterable of batches}}")
        for rank, iterable in mapping.items():
            check_int("ranks= keys", rank, 0, f"ranks, in {where}")
            check_argument(not isinstance(iterable, (str, bytes)) and isinstance(iterable, Iterable),
                           f"ranks[{rank}] ({where}) must be an iterable of batches (a DataLoader, sampler, batch "
                           f"sampler or list), got {type(iterable).__name__}")
    return windows


def _plan(policies: list[CoveragePolicy], windows: int) -> tuple[Plan, list[str]]:
    """What the audit judges, and why each policy that cannot be judged abstains."""
    plan = Plan(shared_universe(policies))
    abstained: list[str] = []
    for policy in policies:
        if isinstance(policy, (ExactlyOnce, AtLeastOnce, ExpectedPadding)):
            if policy.universe is None:
                name = type(policy).__name__
                abstained.append(f"{name}: the universe is unknown (universe=None), so missing and unexpected IDs "
                                 f"cannot be judged; declare it, e.g. tp.{name}(range(len(dataset))"
                                 f"{', padding=n' if name == 'ExpectedPadding' else ''})")
                continue
            plan.unexpected = plan.missing = True
            if isinstance(policy, ExactlyOnce):
                plan.universe_duplicates = True
            if isinstance(policy, ExpectedPadding):
                plan.paddings = tuple(sorted({*plan.paddings, policy.padding}))
        elif isinstance(policy, NoCrossRankOverlap):
            plan.cross_rank = True
        elif isinstance(policy, DistinctEpochOrder):
            if windows < 2:
                abstained.append("DistinctEpochOrder: one epoch was observed, and an order can only repeat across "
                                 "epochs; pass a sequence of per-epoch mappings")
            else:
                plan.epoch_order = True
    return plan, abstained


def _batch(batch: int, worker: int) -> str:
    return f"batch {batch}" if worker < 0 else f"batch {batch}, worker {worker}"


def _at(rank: int, position: int, batch: int, worker: int) -> str:
    return f"rank {rank} at position {position} ({_batch(batch, worker)})"


@dataclasses.dataclass
class _Located:
    """Where a set of observations was made, as Python lists."""

    rank: list[int]
    position: list[int]
    batch: list[int]
    worker: list[int]

    @classmethod
    def of(cls, observations: Observations, index: IdArray) -> _Located:
        valid = index >= 0
        rank, position, batch, worker = (np.full(len(index), -1, dtype=np.int64) for _ in range(4))
        if valid.any():
            segment, position[valid], batch[valid], worker[valid] = observations.locate(index[valid])
            rank[valid] = observations.segment_rank[segment]
        return cls(rank.tolist(), position.tolist(), batch.tolist(), worker.tolist())


def _violations(findings: Findings, observations: Observations, coded: Codes, universe: Universe | None,
                limit: int) -> list[Violation]:
    """Materialize the first `limit` findings as Violations, with their messages."""
    rows = findings.first(limit)
    n = len(rows.kind)
    if n == 0:
        return []
    kinds, windows = rows.kind.tolist(), rows.window.tolist()
    columns = rows.columns
    seen = _Located.of(observations, columns["observation"])
    duplicate = np.isin(rows.kind, [SAME_RANK, CROSS_RANK])
    first = _Located.of(observations, np.where(duplicate, columns["reference"], -1))
    codes = columns["code"]
    samples: list[Any] = [None] * n
    with_sample = np.flatnonzero(codes >= 0)
    for row, sample in zip(with_sample.tolist(), coded.decode(codes[with_sample], universe), strict=True):
        samples[row] = sample
    references, details, counts = (columns[name].tolist() for name in ("reference", "detail", "count"))
    description = universe.description if universe is not None else "None"
    out = []
    for i in range(n):
        kind, epoch, sample = kinds[i], observations.epochs[windows[i]], samples[i]
        rank, position, worker = seen.rank[i], seen.position[i], seen.worker[i]
        at = _at(rank, position, seen.batch[i], worker) if rank >= 0 else ""
        expected: JsonValue = None
        actual: JsonValue = None
        if kind == UNEXPECTED:
            message = (f"Sample {sample!r} was observed by {at} of epoch {epoch}, but it is not in the universe "
                       f"{description}.")
        elif kind == SAME_RANK:
            message = (f"Sample {sample!r} was observed again by {at} of epoch {epoch}; rank {rank} first observed "
                       f"it at position {first.position[i]} ({_batch(first.batch[i], first.worker[i])}).")
            if worker >= 0 and first.worker[i] >= 0 and worker != first.worker[i]:
                message += (f"\nWorkers {first.worker[i]} and {worker} of rank {rank} both produced it: a DataLoader "
                            "over an IterableDataset replays the data in every worker unless the dataset shards it "
                            "with torch.utils.data.get_worker_info().")
        elif kind == CROSS_RANK:
            message = (f"Sample {sample!r} was observed by {at} of epoch {epoch}, but "
                       f"{_at(first.rank[i], first.position[i], first.batch[i], first.worker[i])} observed it first.")
        elif kind == MISSING:
            message = f"Sample {sample!r} of the universe was observed by no rank in epoch {epoch}."
        elif kind == PADDING:
            expected, actual = details[i], counts[i]
            message = (f"Epoch {epoch} has {counts[i]} observations beyond one per sample of the universe; "
                       f"ExpectedPadding declared padding={details[i]}.")
        else:
            assert kind == REPEATED
            rank = details[i]
            message = (f"Rank {rank} observed the same {counts[i]} samples in the same order in epoch {epoch} as in "
                       f"epoch {observations.epochs[references[i]]}.\nIs sampler.set_epoch(epoch) called before each "
                       "epoch? DistributedSampler shuffles with seed + epoch.")
        out.append(Violation(
            kind=KINDS[kind],
            path=f"coverage.{KINDS[kind]}",
            message=message,
            expected=expected,
            actual=actual,
            sample_id=sample,
            rank=rank if rank >= 0 else None,
            epoch=epoch,
            position=position if position >= 0 else None,
            worker=worker if worker >= 0 else None,
        ))
    return out
