"""The process engine: run tasks in fresh processes, with timeouts, and bring back their output.

Written once, used by every check that needs processes. Three isolations:

- "process": a child forked from the warmed fork server (`_forkserver.py`): a new PID and
  fresh imports of the user's modules, without paying torch's import in every child;
- "spawn": a completely fresh interpreter (`python -m trainparity._child`);
- "inprocess": the task runs in this process (fast, no isolation; for debugging).

Each child runs in its own session, so on timeout, failure or exit the whole process tree
is killed; nothing is left running and the temporary directory is removed. Children
write their output in the `_wire` format (JSON and raw bytes: reading it cannot run code).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pathlib
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from trainparity import _wire as wire
from trainparity._child import ERROR_FILE, RAISED_EXIT, RESULT_FILE, Request, error_record, load_task
from trainparity._result import ChildError

ISOLATIONS = ("process", "spawn", "inprocess")
#: seconds to wait for the fork server to import torch and warm up
SERVER_START_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True)
class Job:
    """One task to run: `task(payload, workdir) -> dict` in a fresh process."""

    task: str
    payload: Any
    #: names the run in reports: "baseline", "resumed", "rank 1", ...
    phase: str
    timeout: float
    rank: int | None = None
    #: index (in the same run_jobs call) of a job that must succeed before this one starts
    after: int | None = None


@dataclasses.dataclass
class JobOutcome:
    phase: str
    output: dict[str, Any] | None
    error: ChildError | None = None
    #: the live exception, only for isolation="inprocess"
    exception: BaseException | None = None


def first_error(outcomes: Sequence[JobOutcome]) -> JobOutcome | None:
    """The outcome whose error caused the others (an "abandoned" job only reports a consequence)."""
    errors = [o for o in outcomes if o.error is not None]
    return next((o for o in errors if o.error is not None and o.error.kind != "abandoned"), None) or next(
        iter(errors), None
    )


def validate_isolation(isolation: object) -> str:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation= must be one of {', '.join(map(repr, ISOLATIONS))}, got {isolation!r}")
    return str(isolation)


def validate_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout= must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


# -- launchers -----------------------------------------------------------------------------------


class ForkServer:
    """Parent side of the fork server: starts it once per parent process, talks to it by lines."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._buffer = b""
        self._events: list[tuple[str, str, int, int]] = []

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None and self._owner == os.getpid()

    def ensure_running(self) -> None:
        if self.running():
            return
        package_root = str(pathlib.Path(__file__).resolve().parent.parent)
        code = f"import sys; sys.path.insert(0, {package_root!r}); from trainparity._forkserver import serve; serve()"
        self._owner = os.getpid()
        self._buffer = b""
        self._events = []
        self._process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )
        kind, *_ = self._next_event(time.monotonic() + SERVER_START_TIMEOUT)
        if kind != "READY":
            raise RuntimeError(f"the trainparity fork server did not start (got {kind!r})")

    def shutdown(self) -> None:
        process, self._process = self._process, None
        if process is None or self._owner != os.getpid():
            return
        assert process.stdin is not None
        try:
            process.stdin.close()
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def start(self, job_id: str, request_path: str) -> int:
        self.ensure_running()
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(f"RUN {job_id} {request_path}\n".encode())
        self._process.stdin.flush()
        while True:
            for index, event in enumerate(self._events):
                if event[0] == "STARTED" and event[1] == job_id:
                    del self._events[index]
                    return event[2]
            self._events.append(self._next_event(time.monotonic() + SERVER_START_TIMEOUT))

    def exits(self, wait: float) -> list[tuple[str, int, int]]:
        """(job, exit code, signal) for every child that ended, waiting up to `wait` seconds for one."""
        if not any(e[0] == "EXIT" for e in self._events):
            try:
                self._events.append(self._next_event(time.monotonic() + wait))
            except TimeoutError:
                pass
        ended = [(e[1], e[2], e[3]) for e in self._events if e[0] == "EXIT"]
        self._events = [e for e in self._events if e[0] != "EXIT"]
        return ended

    def _next_event(self, deadline: float) -> tuple[str, str, int, int]:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._process.wait()
                    raise RuntimeError(f"the trainparity fork server exited ({self._process.returncode})")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        kind, *fields = line.decode().split()
        if kind == "READY":
            return ("READY", "", 0, 0)
        if kind == "STARTED":
            return ("STARTED", fields[0], int(fields[1]), 0)
        return ("EXIT", fields[0], int(fields[1]), int(fields[2]))


_SERVER = ForkServer()
_SERVER_LOCK = threading.Lock()
atexit.register(_SERVER.shutdown)


def warm_up() -> None:
    """Start the fork server now (it is otherwise started by the first check that needs it)."""
    with _SERVER_LOCK:
        _SERVER.ensure_running()


def shutdown() -> None:
    """Stop the fork server (it is stopped at exit anyway)."""
    with _SERVER_LOCK:
        _SERVER.shutdown()


@dataclasses.dataclass
class _Running:
    #: unique across runs, so that a late EXIT line of a killed child is never mistaken for a new one
    key: str
    index: int
    job: Job
    workdir: pathlib.Path
    pid: int
    deadline: float
    popen: subprocess.Popen[bytes] | None = None


def kill_tree(pid: int) -> None:
    """Kill a child's whole session (it called setsid, so its process group id is its pid)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _read_outcome(job: Job, workdir: pathlib.Path, exitcode: int, signal_number: int) -> JobOutcome:
    if (workdir / RESULT_FILE).exists() and exitcode == 0:
        return JobOutcome(job.phase, wire.load(workdir / RESULT_FILE))
    if (workdir / ERROR_FILE).exists() and exitcode == RAISED_EXIT:
        record = wire.load(workdir / ERROR_FILE)
        return JobOutcome(
            job.phase,
            None,
            ChildError.raised(record, job.phase, job.rank),
        )
    if signal_number:
        name = signal.Signals(signal_number).name
        return JobOutcome(
            job.phase, None, ChildError("died", job.phase, f"killed by signal {name}", signal=name, rank=job.rank)
        )
    return JobOutcome(
        job.phase, None, ChildError("died", job.phase, f"exit code {exitcode}", exitcode=exitcode, rank=job.rank)
    )


def run_jobs(
    jobs: Sequence[Job], *, isolation: str = "process", concurrency: int | None = None, fail_fast: bool = False
) -> list[JobOutcome]:
    """Run `jobs` (concurrently where cores allow) and return their outcomes in order.

    With `fail_fast`, the first job that raises, dies or times out gets every other job
    killed (ranks of one distributed run wait on each other forever otherwise); those are
    reported with kind "abandoned", the failed job carries the error. `first_error`
    picks the error to report.
    """
    for index, job in enumerate(jobs):
        if job.after is not None and not 0 <= job.after < index:
            raise ValueError(f"Job.after must name an earlier job, got {job.after} for job {index}")
    if isolation == "inprocess":
        done: list[JobOutcome] = []
        for job in jobs:
            before = None if job.after is None else done[job.after]
            if before is not None and before.error is not None:
                error = ChildError("abandoned", job.phase, f"not started: {before.phase} failed", rank=job.rank)
                done.append(JobOutcome(job.phase, None, error))
            else:
                done.append(_run_inprocess(job))
        return done
    workroot = pathlib.Path(tempfile.mkdtemp(prefix="trainparity-"))
    try:
        with _SERVER_LOCK:
            return _run_processes(jobs, workroot, isolation, concurrency or max(1, os.cpu_count() or 1), fail_fast)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)


def _run_inprocess(job: Job) -> JobOutcome:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="trainparity-"))
    try:
        return JobOutcome(job.phase, load_task(job.task)(job.payload, workdir))
    except Exception as error:  # noqa: BLE001 - the user's error becomes an ERROR outcome
        return JobOutcome(job.phase, None, ChildError.raised(error_record(error), job.phase, job.rank), exception=error)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _launch(index: int, job: Job, workroot: pathlib.Path, isolation: str) -> _Running:
    key = f"{workroot.name}.{index}"
    workdir = workroot / f"job{index}"
    workdir.mkdir()
    request = Request(job.task, job.payload, str(workdir), list(sys.path), os.getcwd(), dict(os.environ))
    request_path = workdir / "request.pkl"
    request_path.write_bytes(pickle.dumps(request))
    if isolation == "spawn":
        popen = subprocess.Popen(
            [sys.executable, "-m", "trainparity._child", str(request_path)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        return _Running(key, index, job, workdir, popen.pid, time.monotonic() + job.timeout, popen)
    pid = _SERVER.start(key, str(request_path))
    return _Running(key, index, job, workdir, pid, time.monotonic() + job.timeout)


def _collect_exits(running: dict[int, _Running], isolation: str) -> list[tuple[_Running, int, int]]:
    if isolation == "spawn":
        ended = []
        for item in running.values():
            assert item.popen is not None
            code = item.popen.poll()
            if code is not None:
                ended.append((item, max(code, 0), -code if code < 0 else 0))
        if not ended:
            time.sleep(0.002)
        return ended
    by_key = {item.key: item for item in running.values()}
    return [(by_key[key], code, sig) for key, code, sig in _SERVER.exits(0.05) if key in by_key]


def _run_processes(
    jobs: Sequence[Job], workroot: pathlib.Path, isolation: str, concurrency: int, fail_fast: bool
) -> list[JobOutcome]:
    outcomes: list[JobOutcome | None] = [None] * len(jobs)
    pending = list(enumerate(jobs))
    running: dict[int, _Running] = {}
    #: fork-server children killed by us, whose exit the server has yet to confirm
    killed: set[str] = set()
    try:
        while pending or running:
            for index, job in _ready(pending, outcomes, concurrency - len(running)):
                running[index] = _launch(index, job, workroot, isolation)
            for item, code, sig in _collect_exits(running, isolation):
                if item.index not in running:  # settled as abandoned by an earlier failure in this batch
                    continue
                del running[item.index]
                kill_tree(item.pid)  # reap what the child left behind (e.g. DataLoader workers)
                outcomes[item.index] = outcome = _read_outcome(item.job, item.workdir, code, sig)
                if fail_fast and outcome.error is not None:
                    killed.update(r.key for r in running.values() if r.popen is None)
                    _abandon(running, pending, outcomes, f"killed after {item.job.phase} failed")
            now = time.monotonic()
            for item in [r for r in running.values() if r.deadline < now]:
                if item.index not in running:  # already abandoned by fail_fast
                    continue
                kill_tree(item.pid)
                if item.popen is None:
                    killed.add(item.key)
                else:
                    item.popen.wait()
                del running[item.index]
                outcomes[item.index] = JobOutcome(
                    item.job.phase,
                    None,
                    ChildError(
                        "timeout",
                        item.job.phase,
                        f"did not finish within timeout={item.job.timeout:g} s; its process tree was killed",
                        rank=item.job.rank,
                    ),
                )
                if fail_fast:
                    killed.update(r.key for r in running.values() if r.popen is None)
                    _abandon(running, pending, outcomes, f"killed after {item.job.phase} timed out")
    finally:
        for item in running.values():
            kill_tree(item.pid)
            if item.popen is not None:
                item.popen.wait()
        killed.update(item.key for item in running.values() if item.popen is None)
        _await_server_exits(killed)
    return [o for o in outcomes if o is not None]


def _ready(pending: list[tuple[int, Job]], outcomes: list[JobOutcome | None], slots: int) -> list[tuple[int, Job]]:
    """Take up to `slots` pending jobs whose dependency has finished (in list order).

    A job whose dependency failed is settled as not started.
    """
    taken: list[tuple[int, Job]] = []
    for index, job in list(pending):
        before = None if job.after is None else outcomes[job.after]
        if job.after is not None and before is None:
            continue
        if before is not None and before.error is not None:
            pending.remove((index, job))
            outcomes[index] = JobOutcome(job.phase, None, ChildError("abandoned", job.phase,
                                                                     f"not started: {before.phase} failed",
                                                                     rank=job.rank))
        elif len(taken) < slots:
            pending.remove((index, job))
            taken.append((index, job))
    return taken


def _abandon(
    running: dict[int, _Running], pending: list[tuple[int, Job]], outcomes: list[JobOutcome | None], why: str
) -> None:
    for item in list(running.values()):
        kill_tree(item.pid)
        if item.popen is not None:
            item.popen.wait()
        outcomes[item.index] = JobOutcome(item.job.phase, None, ChildError("abandoned", item.job.phase, why,
                                                                           rank=item.job.rank))
    running.clear()
    for index, job in pending:
        outcomes[index] = JobOutcome(job.phase, None, ChildError("abandoned", job.phase, f"not started: {why}",
                                                                 rank=job.rank))
    pending.clear()


def _await_server_exits(keys: set[str]) -> None:
    """Wait (bounded) until the fork server has reaped the children we killed: none is left running."""
    deadline = time.monotonic() + 10.0
    while keys and time.monotonic() < deadline and _SERVER.running():
        for key, _, _ in _SERVER.exits(0.05):
            keys.discard(key)
