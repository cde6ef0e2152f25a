"""What runs inside the DataLoader's workers during `check_worker_randomness`: the recording `worker_init_fn` and
`collate_fn` that the check puts on the loader, around the user's own.

- `RecordingInit` (the loader's `worker_init_fn` while the check runs) snapshots every stream of the worker
  before and after the user's `worker_init_fn` (torch has seeded the worker by then), and keeps the latter as the
  worker's last known state.
- `RecordingCollate` (its `collate_fn`) runs the user's collate function on the samples the worker fetched, then
  snapshots the streams again: the state before the batch (the worker's last known state) and after it travel
  back with the batch, as a `Fetched`, through the loader's own result queue. No other channel, no extra
  process: what the loader does with its workers (persistence, prefetching, shutdown) stays its own.

The states of one check live in `_RUNS` under the check's token, per process: a worker has its own copy (forked
or spawned), and with `num_workers=0` the check's own process keeps it. Both objects pickle (for the spawn and
forkserver start methods) when the user's functions do.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any

import torch.utils.data

from trainparity._state._rng import StreamDigest
from trainparity._workers._streams import snapshot


@dataclasses.dataclass
class Start:
    """A worker's streams before and after the user's `worker_init_fn` (the same when there is none)."""

    before: dict[str, StreamDigest]
    after: dict[str, StreamDigest]


@dataclasses.dataclass
class Fetch:
    """One batch: which worker fetched it (None: this process), its number in that worker's life, and the
    digests of every stream before and after the fetch (and the collate function)."""

    worker: int | None
    number: int
    before: dict[str, StreamDigest]
    after: dict[str, StreamDigest]
    #: path -> kind of each object stream seen
    kinds: dict[str, str]
    #: on a worker's first batch: its start
    start: Start | None = None


class Fetched:
    """A batch as the recording collate function returns it (unwrapped by the check, never seen by the user)."""

    def __init__(self, batch: Any, record: Fetch) -> None:
        self.batch, self.record = batch, record


@dataclasses.dataclass
class Process:
    """One process's recording state in one check: the last known digests, the batches fetched, the start."""

    last: dict[str, StreamDigest]
    dataset: Any = None
    fetched: int = 0
    start: Start | None = None


_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, functools.partial)
#: check token -> this process's recording state
_RUNS: dict[str, Process] = {}


def roots(dataset: Any, collate: Any) -> list[tuple[str, Any]]:
    """Where object streams are looked for: the dataset, and the user's collate function when it is an object, or
    the object it is a method of (`collate_fn=collator.collate`). What two roots reach is walked and recorded
    once, by the dataset's path (`snapshot`)."""
    found: list[tuple[str, Any]] = [("dataset", dataset)]
    if isinstance(collate, types.MethodType):
        if not isinstance(collate.__self__, (type, types.ModuleType)):
            found.append(("collate_fn.__self__", collate.__self__))
    elif collate is not None and hasattr(collate, "__dict__") and not isinstance(collate, _FUNCTIONS):
        found.append(("collate_fn", collate))
    return found


def begin(token: str, dataset: Any, collate: Any) -> None:
    """In this process (num_workers=0): the streams as they are before the first fetch."""
    _RUNS[token] = Process(snapshot(roots(dataset, collate))[0], dataset)


def end(token: str) -> None:
    _RUNS.pop(token, None)


class RecordingInit:
    """The loader's `worker_init_fn` during the check: the user's, between two snapshots."""

    def __init__(self, token: str, user: Callable[[int], Any] | None, collate: Any) -> None:
        self.token, self.user, self.collate = token, user, collate

    def __call__(self, worker_id: int) -> None:
        info = torch.utils.data.get_worker_info()
        where = roots(info.dataset if info is not None else None, self.collate)
        before = snapshot(where)[0]
        if self.user is not None:
            self.user(worker_id)
        after = snapshot(where)[0]
        _RUNS[self.token] = Process(after, start=Start(before, after))


class RecordingCollate:
    """The loader's `collate_fn` during the check: the user's, then a snapshot; returns a `Fetched`."""

    def __init__(self, token: str, user: Callable[[Any], Any]) -> None:
        self.token, self.user = token, user

    def __call__(self, samples: Any) -> Fetched:
        batch = self.user(samples)
        info = torch.utils.data.get_worker_info()
        process = _RUNS.get(self.token)
        if process is None:  # a worker started by a worker_init_fn that never ran ours: cannot happen, but say so
            raise RuntimeError("trainparity: the recording worker_init_fn did not run in this DataLoader worker")
        dataset = info.dataset if info is not None else process.dataset
        after, kinds = snapshot(roots(dataset, self.user))
        record = Fetch(None if info is None else info.id, process.fetched, process.last, after, kinds,
                       process.start)
        process.last, process.fetched, process.start = after, process.fetched + 1, None
        return Fetched(batch, record)
