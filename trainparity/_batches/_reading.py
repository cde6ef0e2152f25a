"""Reading the user's batch iterables, as the coverage and worker-randomness checks do: what their failures
become, and letting go of an iterator.

The user's code (`iter()`, `next()`, `sample_ids(batch)`) runs guarded: an exception it raises becomes
`UserCodeFailed`, the check's timeout passing while it runs `ReadingTimedOut`; each turns into the check's ERROR
result. The frames of the exception are cleared (`release_frames`: a timeout's at once, a failure's when its
result is made) and `release_iterator` lets go of the iterator, so that an ERROR result does not keep a
DataLoader iterator, and its worker processes, alive.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import traceback
import types
from typing import Any, TypeVar

from torch.utils.data import DataLoader

from trainparity._process._alarm import DeadlinePassed
from trainparity._process._options import Deadline
from trainparity._results._result import Result
from trainparity._results._violation import ChildError, JsonValue

R = TypeVar("R", bound=Result)


class UserCodeFailed(Exception):
    """The user's iterable or sample_ids raised: the check ends in ERROR."""

    def __init__(self, error: Exception, phase: str, rank: int | None) -> None:
        super().__init__(phase)
        self.error, self.phase, self.rank = error, phase, rank

    def result(self, config: dict[str, JsonValue], result_type: type[R]) -> R:
        # Imported here: the child's error records stand on the report and comparison modules, which the
        # coverage package does not otherwise need (test/test_coverage_imports.py).
        from trainparity._process._child import error_record

        error = ChildError.raised(error_record(self.error), self.phase, self.rank)
        release_frames(self.error)
        return result_type.errored(error, config, self.error)


class ReadingTimedOut(Exception):
    """The check's timeout passed while the user's iterables were read: the check ends in ERROR."""

    def __init__(self, interruption: DeadlinePassed, phase: str, rank: int | None) -> None:
        super().__init__(phase)
        self.stack, self.phase, self.rank = interruption.stack(), phase, rank
        release_frames(interruption)

    def result(self, config: dict[str, JsonValue], deadline: Deadline, result_type: type[R]) -> R:
        error = ChildError("timeout", self.phase, f"did not finish reading within {deadline.describe()}: the "
                           "iterable was interrupted there", traceback=self.stack, rank=self.rank)
        return result_type.errored(error, config)


def release_frames(error: BaseException) -> None:
    """Clear the local variables of the frames that `error` and its causes keep (their lines stay).

    A DataLoader iterator that raised is `self` in the frames of its own `__next__`; a result
    that keeps the exception would keep the iterator, its worker processes and the batches alive.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]


def start_iterator(iterable: Any) -> Any:
    """`iter(iterable)`; for a DataLoader with worker processes, this process's multiprocessing temporary directory
    made first: the workers, forked here, share it instead of each making its own (for the socket through which a
    worker hands over file descriptors). Python removes a process's directory when the process exits; a worker
    killed at the check's timeout never does, and would leave its directory behind. Only then: a process that ends
    with `os._exit` (a check's child) would leave the directory itself."""
    if isinstance(iterable, DataLoader) and iterable.num_workers > 0:
        multiprocessing.util.get_temp_dir()
    return iter(iterable)


def release_iterator(iterator: Any, iterable: Any, finished: bool, late: bool) -> None:
    """Let go of a rank's iterator: close a generator; shut down the workers of a DataLoader iterator that did
    not finish, unless it is the loader's persistent iterator (the loader owns those workers and reuses them).
    `late`: the check's timeout has passed, so the workers are killed at once instead of being asked to stop
    (a worker stuck in `__getitem__` would hold the shutdown for seconds)."""
    with contextlib.suppress(Exception):  # the error being reported matters more than one raised in cleanup
        if isinstance(iterator, types.GeneratorType):
            iterator.close()
        elif not finished and callable(getattr(iterator, "_shutdown_workers", None)) \
                and (late or getattr(iterable, "_iterator", None) is not iterator):
            if late:
                for worker in getattr(iterator, "_workers", ()):
                    worker.kill()
            iterator._shutdown_workers()
