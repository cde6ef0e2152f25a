"""The judgement of `check_worker_randomness`: streams that two workers of an epoch, or two epochs, walk alike.

Per epoch, worker and stream, the states a stream passed through are the digests before and after each batch
that consumed it (its state changed over the batch). A stream consumed by two workers of one epoch whose state
sets meet started (or met) at the same state: they draw the same numbers, `worker_rng_shared`. A stream whose
states in one epoch meet its states in an earlier epoch, `epoch_rng_repeated` (a persistent worker's state at
the start of an epoch that it carried over from the end of the last one is a continuation, not a repeat).
Streams no batch consumed are not judged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from trainparity._results._result import WorkerRandomnessResult
from trainparity._results._violation import JsonValue, Outcome, Violation
from trainparity._state._rng import StreamDigest
from trainparity._workers._record import Fetch
from trainparity._workers._streams import GLOBAL_STREAMS

#: how each kind of object stream is seeded per worker, for the messages
_RESEED = {
    "numpy.random.Generator": "np.random.default_rng(torch.initial_seed())",
    "numpy.random.RandomState": "np.random.RandomState(torch.initial_seed() % 2**32)",
    "torch.Generator": "torch.Generator().manual_seed(torch.initial_seed())",
    "random.Random": "random.Random(torch.initial_seed())",
}
_GLOBAL_FIX = {
    "rng.torch": "torch seeds it in every worker (base seed + worker id): do not reseed it with a constant",
    "rng.numpy": "seed it from torch.initial_seed(), which differs per worker and per epoch: "
                 "np.random.seed(torch.initial_seed() % 2**32)",
    "rng.python": "seed it from torch.initial_seed(), which differs per worker and per epoch: "
                  "random.seed(torch.initial_seed())",
}


@dataclasses.dataclass
class Epoch:
    """What one epoch of the loader showed: each batch's record, and this process's object streams at its start."""

    fetches: list[Fetch]
    main: dict[str, StreamDigest]


@dataclasses.dataclass
class _Walk:
    """One stream in one worker over one epoch."""

    #: the digests before and after each batch that consumed it, in the worker's order
    states: list[StreamDigest]
    #: its state before the worker's first batch of the epoch, and after its last
    first: StreamDigest | None
    last: StreamDigest | None


def _walks(epoch: Epoch) -> dict[str, dict[int | None, _Walk]]:
    """stream path -> worker -> its walk, for the streams some batch of the epoch consumed."""
    by_worker: dict[int | None, list[Fetch]] = {}
    for fetch in epoch.fetches:
        by_worker.setdefault(fetch.worker, []).append(fetch)
    walks: dict[str, dict[int | None, _Walk]] = {}
    for worker, fetches in by_worker.items():
        fetches.sort(key=lambda f: f.number)
        paths = dict.fromkeys(p for f in fetches for p in (*f.before, *f.after))
        for path in paths:
            states: list[StreamDigest] = []
            for fetch in fetches:
                before, after = fetch.before.get(path), fetch.after.get(path)
                if before != after:
                    states += [d for d in (before, after) if d is not None]
            if states:
                walks.setdefault(path, {})[worker] = _Walk(states, fetches[0].before.get(path),
                                                           fetches[-1].after.get(path))
    return walks


def _workers_text(workers: Sequence[int | None]) -> str:
    names = [str(w) for w in workers]
    return f"workers {', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else f"worker {names[0]}"


def _describe(path: str, kinds: dict[str, str]) -> str:
    return f"{path} ({GLOBAL_STREAMS.get(path) or kinds.get(path, 'a random stream')})"


def _shared_cause(path: str, kind: str | None, walks: dict[int | None, _Walk], group: list[int | None],
                  epoch: Epoch) -> str:
    """Why workers start a stream alike: copied from this process, or seeded alike by worker_init_fn."""
    if path in GLOBAL_STREAMS:
        starts = [f.start for f in epoch.fetches if f.start is not None and f.worker in group]
        reseeded = len({s.before.get(path) for s in starts}) > 1 and len({s.after.get(path) for s in starts}) == 1
        how = ("The worker_init_fn seeds it to the same state in every worker" if reseeded else
               "Every worker starts it from the same state")
        return f"{how}; {_GLOBAL_FIX[path]}."
    reseed = _RESEED.get(kind or "", "a generator seeded from torch.initial_seed()")
    rest = path.split(".", 1)[1] if "." in path else path
    target = f"info.dataset.{rest}" if path.startswith("dataset.") else path
    fix = (f"Seed it per worker in a worker_init_fn: info = torch.utils.data.get_worker_info(); {target} = {reseed} "
           "(torch.initial_seed() differs per worker and per epoch).")
    if any(walks[w].first is not None and walks[w].first == epoch.main.get(path) for w in group):
        return f"It is copied into every worker as it is in this process (built once, e.g. in __init__). {fix}"
    return f"Every worker seeds it alike (with a constant, not with torch.initial_seed() or the worker id). {fix}"


def _repeat_cause(path: str, persistent: bool) -> str:
    if persistent:
        return ("The workers are persistent (persistent_workers=True): they keep the objects they started with, so "
                "a seed derived from an epoch counter set in this process (set_epoch) never changes in them and the "
                "stream is reset to the same state every epoch. Draw each epoch's seed from a stream that goes on in "
                "the worker (torch.randint on its torch generator), or do not reseed it per epoch.")
    fix = _GLOBAL_FIX.get(path, "seed it from torch.initial_seed(), which changes every epoch (the DataLoader draws a "
                                "new base seed per epoch)")
    return f"Every epoch's workers start it from the same state: {fix}."


def _shared_groups(workers: dict[int | None, _Walk]) -> list[list[int | None]]:
    """The workers whose walks of one stream meet, in groups of two or more (in worker order)."""
    groups: list[list[int | None]] = []
    for worker in sorted(workers, key=lambda w: -1 if w is None else w):
        states = set(workers[worker].states)
        group = next((g for g in groups if any(states & set(workers[other].states) for other in g)), None)
        if group is None:
            groups.append([worker])
        else:
            group.append(worker)
    return [group for group in groups if len(group) > 1]


def _repeat(walks: list[dict[str, dict[int | None, _Walk]]], number: int, path: str
            ) -> tuple[int | None, int, int | None] | None:
    """(worker, earlier epoch, its worker): the first worker of epoch `number` whose walk of `path` meets one of an
    earlier epoch, without the state a persistent worker carried over from the epoch before."""
    mine = walks[number].get(path, {})
    for worker in sorted(mine, key=lambda w: -1 if w is None else w):
        states = set(mine[worker].states)
        carried = walks[number - 1].get(path, {}).get(worker) if number else None
        if carried is not None and mine[worker].first == carried.last:
            states.discard(carried.last)
        for earlier in range(number):
            for other, theirs in walks[earlier].get(path, {}).items():
                if states & set(theirs.states):
                    return worker, earlier, other
    return None


def judge_workers(epochs: list[Epoch], config: dict[str, JsonValue], persistent: bool) -> WorkerRandomnessResult:
    kinds: dict[str, str] = {}
    for epoch in epochs:
        for fetch in epoch.fetches:
            kinds.update(fetch.kinds)
    walks = [_walks(epoch) for epoch in epochs]
    order = [*GLOBAL_STREAMS, *(path for walk in walks for path in walk)]
    consumed = list(dict.fromkeys(path for path in order if any(path in walk for walk in walks)))
    violations: list[Violation] = []
    for number, (epoch, walk) in enumerate(zip(epochs, walks, strict=True)):
        for path in consumed:
            shared = _shared_groups(walk.get(path, {}))
            if shared:
                text = "; ".join(_workers_text(group) for group in shared)
                violations.append(Violation(
                    "worker_rng_shared", path,
                    f"Stream {_describe(path, kinds)} was consumed from the same state by {text} in epoch {number}: "
                    "they draw the same random numbers, so they apply the same random augmentations to different "
                    f"samples. {_shared_cause(path, kinds.get(path), walk[path], shared[0], epoch)}",
                    epoch=number, worker=shared[0][1], cause="worker_rng_shared"))
            repeat = _repeat(walks, number, path)
            if repeat is not None:
                worker, earlier, other = repeat
                violations.append(Violation(
                    "epoch_rng_repeated", path,
                    f"Stream {_describe(path, kinds)} in worker {worker} of epoch {number} went through the states "
                    f"it had in worker {other} of epoch {earlier}: epoch {number} repeats the random draws (the "
                    f"augmentations) of epoch {earlier}. {_repeat_cause(path, persistent)}",
                    epoch=number, worker=worker, cause="epoch_rng_repeated"))
    notes = _notes(epochs, walks, consumed, config)
    if violations:
        return WorkerRandomnessResult(Outcome.FAIL, violations, notes, config)
    if not any(epoch.fetches for epoch in epochs):
        return WorkerRandomnessResult(Outcome.ABSTAIN, [], notes, config, reason=(
            "the loader gave no batch in any epoch (an empty dataset, or a sampler of nothing): nothing was observed"))
    comparable = any(len(walk.get(path, {})) > 1 or sum(path in w for w in walks) > 1
                     for walk in walks for path in consumed)
    if consumed and not comparable:
        return WorkerRandomnessResult(Outcome.ABSTAIN, [], notes, config, reason=(
            "no stream was consumed by two workers of an epoch or in two epochs: nothing to compare; fetch more "
            "batches, more epochs, or with num_workers >= 2"))
    return WorkerRandomnessResult(Outcome.PASS, [], notes, config)


def _notes(epochs: list[Epoch], walks: list[dict[str, dict[int | None, Any]]], consumed: list[str],
           config: dict[str, JsonValue]) -> list[str]:
    """What the check observed: epochs, batches, workers, the streams consumed and those not judged."""
    workers = sorted({f.worker for e in epochs for f in e.fetches if f.worker is not None})
    batches = ", ".join(f"{len(e.fetches)} in epoch {n}" for n, e in enumerate(epochs))
    in_process = config.get("num_workers") == 0
    who = (f"fetched by {_workers_text(workers)}" if workers else
           "fetched by this process (num_workers=0)" if in_process else "with no batch fetched by any worker")
    notes = [f"Observed {len(epochs)} epoch{'s' if len(epochs) != 1 else ''} {who}; batches: {batches}."]
    if consumed:
        used = []
        for path in consumed:
            seen = sorted({w for walk in walks for w in walk.get(path, {}) if w is not None})
            used.append(f"{path} ({_workers_text(seen)})" if seen else path)
        notes.append(f"Streams consumed while fetching: {', '.join(used)}.")
    else:
        notes.append("No random stream was consumed while fetching: nothing random to share.")
    every = list(dict.fromkeys([*GLOBAL_STREAMS, *(p for e in epochs for f in e.fetches for p in f.after)]))
    idle = [p for p in every if p not in consumed]
    if idle:
        notes.append(f"Not consumed, so not judged: {', '.join(idle)}.")
    if in_process:
        notes.append("num_workers=0: the batches were fetched in this process, so no two workers can share a stream; "
                     "the epochs were compared.")
    return notes
