"""A world of ranks as threads of one process (`backend="threads"`): torch's threaded process group, with real
collectives reduced in memory, so worlds of 8 to 64 ranks run on a machine of two cores.

The group is torch's private test harness (`torch.testing._internal.distributed.multi_threaded_pg`, in every
supported torch, 2.7 to 2.15): its collectives meet in `Collective.join`, where rank 0 of the group does the work
for all; it has no send/recv, which `_Mailbox` gives it. Threads of one process share its random generators, so
the ranks here run one at a time (`Baton`): a rank holds the baton while it computes and hands it on while it
waits in a collective, in a receive or at the group's store barrier, and each rank's random streams (torch's CPU
generator, numpy's and Python's global ones) travel with it. Each rank then draws what it would draw as a
process, whatever order the threads are scheduled in, and the world is deterministic.

The world lives in a child of the process engine (the check's timeout kills it, with every rank's stack); it
changes process-wide state (torch.distributed's world becomes thread-local, autograd's multithreading is off)
and puts it back on exit.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np
import torch
import torch.distributed as dist

T = TypeVar("T")


def threads_unavailable() -> str | None:
    """Why this torch cannot run a threaded world, or None."""
    try:
        from torch.testing._internal.distributed import multi_threaded_pg as threaded
    except Exception as error:  # noqa: BLE001 - any failure to import torch's private module means no threads
        return f"torch {torch.__version__} has no threaded process group ({type(error).__name__}: {error})"
    missing = [name for name in ("Collective", "ProcessLocalGroup", "_install_threaded_pg", "_uninstall_threaded_pg",
                                 "_store_based_barrier") if not hasattr(threaded, name)]
    if not hasattr(torch._C._distributed_c10d, "_set_thread_isolation_mode"):
        missing.append("_set_thread_isolation_mode")
    if missing:
        return f"torch {torch.__version__}'s threaded process group lacks {', '.join(missing)}"
    return None


class _Streams:
    """The global random streams a rank draws from, as their own objects (cheaper than `_rng.capture_rng`: the
    baton changes hands at every collective)."""

    def __init__(self) -> None:
        self.torch = torch.get_rng_state()
        self.numpy: Any = np.random.get_state()
        self.python = random.getstate()

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        np.random.set_state(self.numpy)
        random.setstate(self.python)


class Baton:
    """One rank computes at a time. The streams are swapped only when the baton passes to another rank than the
    one that held it last: a rank that takes it back after its own collective pays nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, _Streams] = {}
        self._last: int | None = None
        self._local = threading.local()

    @property
    def rank(self) -> int:
        """The rank of the calling thread (which holds, or held, the baton)."""
        rank: int = self._local.rank
        return rank

    def rank_or_none(self) -> int | None:
        """The rank of the calling thread; None for a thread that is no rank."""
        rank: int | None = getattr(self._local, "rank", None)
        return rank

    def take(self, rank: int) -> None:
        self._lock.acquire()
        self._local.rank = rank
        if self._last != rank:
            if self._last is not None:
                self._streams[self._last] = _Streams()
            if rank in self._streams:
                self._streams.pop(rank).restore()
            self._last = rank

    def hand_on(self) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Hand the baton on while this rank waits for the others; take it back before going on."""
        rank = self.rank
        self.hand_on()
        try:
            yield
        finally:
            self.take(rank)


class _Mailbox:
    """Point-to-point messages between the ranks, which torch's threaded group lacks (pipelines send activations and
    gradients from stage to stage): a send leaves a copy of its tensor under (group, source, destination, tag) and
    completes; a receive's `wait()` takes the first copy left there, in the order they were sent (as gloo matches
    them), handing the baton on while it waits."""

    def __init__(self, baton: Baton) -> None:
        self.baton = baton
        self.condition = threading.Condition()
        self.letters: defaultdict[tuple[str, int, int, int], deque[torch.Tensor]] = defaultdict(deque)
        self.stopped = False

    def send(self, group: Any, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _Sent:
        with self.condition:
            self.letters[group.pg_name, group._rank, dst, tag].append(tensors[0].detach().clone())
            self.condition.notify_all()
        return _Sent()

    def recv(self, group: Any, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _Receipt:
        return _Receipt(self, (group.pg_name, src, group._rank, tag), tensors[0])

    def take(self, key: tuple[str, int, int, int]) -> torch.Tensor:
        with self.baton.waiting(), self.condition:
            self.condition.wait_for(lambda: bool(self.letters[key]) or self.stopped)
            if not self.letters[key]:  # another rank raised: leave as the group's collectives do
                sys.exit("Test termination event occurs.")
            return self.letters[key].popleft()

    def stop(self) -> None:
        with self.condition:
            self.stopped = True
            self.condition.notify_all()


class _Sent(dist.distributed_c10d.Work):
    """A send: complete once its copy is in the mailbox."""

    def wait(self, timeout: object = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Receipt(dist.distributed_c10d.Work):
    """A receive: its tensor is filled on `wait()`."""

    def __init__(self, mailbox: _Mailbox, key: tuple[str, int, int, int], tensor: torch.Tensor) -> None:
        super().__init__()
        self.mailbox, self.key, self.tensor = mailbox, key, tensor
        self.done = False

    def wait(self, timeout: object = None) -> bool:
        if not self.done:
            self.tensor.detach().copy_(self.mailbox.take(self.key))
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done


class _Uncoalesced:
    """The threaded group's backend as `batch_isend_irecv` asks about it: it sends and receives one by one."""

    supports_coalescing = False


class _RankEnvironment(os._Environ[str]):
    """`os.environ` for the world's time, as `torchrun` gives each process its own: RANK and LOCAL_RANK read as the
    rank of the thread that reads them (code written for torchrun picks its device and shard by them), WORLD_SIZE
    and LOCAL_WORLD_SIZE as the world's size; the rest is the process's environment itself."""

    RANKED = ("RANK", "LOCAL_RANK")

    def __init__(self, environ: os._Environ[str], size: int, rank: Callable[[], int | None]) -> None:
        super().__init__(environ._data, environ.encodekey, environ.decodekey,  # type: ignore[attr-defined]
                         environ.encodevalue, environ.decodevalue)
        self.rank = rank
        for name in self.RANKED:
            self[name] = "0"  # listed, and read per thread
        self["WORLD_SIZE"] = self["LOCAL_WORLD_SIZE"] = str(size)

    def __getitem__(self, key: str) -> str:
        rank = self.rank() if key in self.RANKED else None
        return super().__getitem__(key) if rank is None else str(rank)


class RankFailure(Exception):
    """A rank of the threaded world raised: which, and what (the exception is `__cause__`)."""

    def __init__(self, rank: int, error: BaseException) -> None:
        super().__init__(f"rank {rank} raised {type(error).__name__}")
        self.rank = rank
        self.error = error


class ThreadedWorld(Generic[T]):
    """`size` ranks, each a thread that joins the group (`join()`) and runs `body(rank)`; `run()` returns their
    results in rank order, or raises `RankFailure` for the first rank that raised (the others stop at their next
    collective)."""

    def __init__(self, size: int, body: Callable[[int], T]) -> None:
        self.size, self.body = size, body
        self.baton = Baton()
        self.mailbox = _Mailbox(self.baton)
        self._results: dict[int, T] = {}
        self._failure: RankFailure | None = None

    def join(self) -> None:
        """Join the default process group as this thread's rank."""
        dist.init_process_group("threaded", rank=self.baton.rank, world_size=self.size, store=self._store)

    def run(self) -> list[T]:
        from torch.testing._internal.distributed import multi_threaded_pg as threaded

        with self._installed(threaded):
            threads = [threading.Thread(target=self._rank, args=(rank, threaded), name=f"rank {rank}", daemon=True)
                       for rank in range(self.size)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if self._failure is not None:
            raise self._failure from self._failure.error
        return [self._results[rank] for rank in range(self.size)]

    def _rank(self, rank: int, threaded: Any) -> None:
        self.baton.take(rank)
        try:
            self._results[rank] = self.body(rank)
        except BaseException as error:  # noqa: BLE001 - reported by run()
            if self._failure is None:  # the first to raise; the others exit from their collectives after it
                self._failure = RankFailure(rank, error)
            threaded.ProcessLocalGroup.exception_handle(error)
            self.mailbox.stop()
        finally:
            self.baton.hand_on()

    @contextlib.contextmanager
    def _installed(self, threaded: Any) -> Iterator[None]:
        """The threaded group in place, its waits handing the baton on; everything put back on exit."""
        baton = self.baton
        join, barrier = threaded.Collective.join, threaded._store_based_barrier
        c10d_barrier = dist.distributed_c10d._store_based_barrier

        def joined(collective: Any, rank: int, data: Any) -> Any:
            with baton.waiting():
                return join(collective, rank, data)

        def barrier_waiting(original: Callable[..., Any]) -> Callable[..., Any]:
            def wait(*args: Any, **kwargs: Any) -> Any:
                with baton.waiting():
                    return original(*args, **kwargs)
            return wait

        environ = os.environ
        os.environ = _RankEnvironment(environ, self.size, baton.rank_or_none)  # noqa: B003
        torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]
        threaded._install_threaded_pg()
        self._store = torch._C._distributed_c10d.HashStore()
        threaded.Collective.join = joined
        threaded._store_based_barrier = barrier_waiting(barrier)
        dist.distributed_c10d._store_based_barrier = barrier_waiting(c10d_barrier)
        group = threaded.ProcessLocalGroup
        own = {name: vars(group)[name] for name in ("send", "recv", "_get_backend") if name in vars(group)}
        mailbox = self.mailbox

        def send(pg: Any, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _Sent:
            return mailbox.send(pg, tensors, dst, tag)

        def recv(pg: Any, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _Receipt:
            return mailbox.recv(pg, tensors, src, tag)

        def backend(pg: Any, device: Any) -> Any:
            try:
                return dist.ProcessGroup._get_backend(pg, device)
            except RuntimeError:  # none for the threaded group: what batch_isend_irecv asks it (torch >= 2.14)
                return _Uncoalesced()

        group.send, group.recv, group._get_backend = send, recv, backend
        try:
            yield
        finally:
            for name in ("send", "recv", "_get_backend"):
                if name in own:
                    setattr(group, name, own[name])
                else:
                    delattr(group, name)
            threaded.Collective.join, threaded._store_based_barrier = join, barrier
            dist.distributed_c10d._store_based_barrier = c10d_barrier
            threaded.ProcessLocalGroup.reset()
            threaded._uninstall_threaded_pg()
            torch._C._distributed_c10d._set_thread_isolation_mode(False)  # type: ignore[attr-defined]
            os.environ = environ  # noqa: B003
