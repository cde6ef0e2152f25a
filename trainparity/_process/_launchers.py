"""Launching children: the parent's side of the warmed fork server, and fresh interpreters (isolation="spawn").

Both offer the same interface to the engine (`start`, `kill`, `exits`); the engine decides when.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

from trainparity._process._tree import JOB_MARKER, kill_tree

#: seconds to wait for the fork server to import torch and warm up
SERVER_START_TIMEOUT = 120.0


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a protocol line is written: a line cut in half corrupts the pipe."""
    # The mask is read before it is changed, and changed inside the `try`: an interrupt that comes
    # right after the change (a Python handler runs after the call returns) still restores it.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class ForkServer:
    """Parent side of the fork server: starts it once per parent process, talks to it by lines."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._buffer = b""
        #: jobs sent to the server whose exit it has not reported yet
        self._live: set[str] = set()
        #: whether the server said READY; until then it is starting (`_started`, monotonic)
        self._ready = False
        self._started = 0.0
        #: the directory where the server's children cache bytecode (`_forkserver._cache_bytecode`), if any: the
        #: server removes it as it exits, and this process once the server has ended, whatever ended it
        self._bytecode: str | None = None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None and self._owner == os.getpid()

    def ensure_running(self, until: float) -> None:
        """Start the server unless it runs, and wait until it is ready or `until` (monotonic) passes: then
        TimeoutError, and the server goes on starting for the next caller. RuntimeError if it cannot start."""
        if not self.running():
            self._remove_bytecode()  # of a server that was killed
            package_root = str(pathlib.Path(__file__).resolve().parents[2])
            code = (f"import sys; sys.path.insert(0, {package_root!r}); "
                    "from trainparity._process._forkserver import serve; serve()")
            self._owner = os.getpid()
            self._buffer = b""
            self._live = set()
            self._ready = False
            self._started = time.monotonic()
            self._process = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
            )
        if self._ready:
            return
        given_up = self._started + SERVER_START_TIMEOUT
        try:
            line = self._next_line(min(until, given_up))
        except TimeoutError:
            if time.monotonic() < given_up:
                raise
            self.shutdown()
            raise RuntimeError(f"the trainparity fork server did not start within {SERVER_START_TIMEOUT:g} s") from None
        if not line or line[0] != "READY" or len(line) > 2:
            raise RuntimeError(f"the trainparity fork server did not start (it said {' '.join(line)!r})")
        self._bytecode = os.fsdecode(base64.b64decode(line[1])) if len(line) == 2 else None
        self._ready = True

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
        self._remove_bytecode()

    def bytecode_directory(self) -> str | None:
        """Where the running server's children cache bytecode (`_forkserver._cache_bytecode`); None if nowhere."""
        return self._bytecode if self.running() else None

    def _remove_bytecode(self) -> None:
        if self._bytecode is not None and self._owner == os.getpid():
            shutil.rmtree(self._bytecode, ignore_errors=True)
        self._bytecode = None

    def _send(self, line: str) -> None:
        assert self._process is not None and self._process.stdin is not None
        data = (line + "\n").encode()
        with signals_deferred():
            fd = self._process.stdin.fileno()
            while data:
                data = data[os.write(fd, data):]

    def start(self, job: str, request: bytes) -> None:
        """Send a job to the running server (`ensure_running` first); RuntimeError if it has exited since."""
        if not (self.running() and self._ready):
            raise RuntimeError("the trainparity fork server exited during the check")
        self._live.add(job)  # before the line is sent: an interrupted launch is still killed and awaited
        self._send(f"RUN {job} {base64.b64encode(request).decode()}")

    def kill(self, job: str) -> None:
        if job in self._live and self.running():
            self._send(f"KILL {job}")

    def exits(self, wait: float) -> list[tuple[str, int, int]]:
        """(job, exit code, signal) of the live jobs that ended, waiting up to `wait` seconds for one."""
        ended: list[tuple[str, int, int]] = []
        deadline = time.monotonic() + wait
        while True:
            try:
                fields = self._next_line(deadline)
            except TimeoutError:
                return ended
            if fields[0] == "EXIT" and fields[1] in self._live:  # other lines are late news of an old run
                self._live.discard(fields[1])
                ended.append((fields[1], int(fields[2]), int(fields[3])))
                deadline = 0.0  # take what has arrived, without waiting for more

    def _next_line(self, deadline: float) -> list[str]:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if not select.select([fd], [], [], max(remaining, 0))[0]:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                self._process.wait()
                raise RuntimeError(f"the trainparity fork server exited ({self._process.returncode})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().split()


class Spawner:
    """Launches fresh interpreters (isolation="spawn"), with the same interface as the fork server."""

    def __init__(self) -> None:
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, job: str, request: bytes) -> None:
        popen = subprocess.Popen(
            [sys.executable, "-c", "from trainparity._process._child import main; main()"],
            stdin=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), JOB_MARKER: job},
        )
        self._children[job] = popen
        assert popen.stdin is not None
        try:
            with signals_deferred():
                popen.stdin.write(request)
                popen.stdin.close()
        except BrokenPipeError:
            pass  # the child died at start; its exit status says how

    def start_command(self, job: str, command: Sequence[str], env: dict[str, str], cwd: str | None) -> None:
        """Run a program of the user's (a training script) as the job, its stdin at end of file."""
        self._children[job] = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, start_new_session=True,
                                               env={**os.environ, **env, JOB_MARKER: job}, cwd=cwd)

    def kill(self, job: str) -> None:
        if job in self._children:
            kill_tree(self._children[job].pid, job)

    def exits(self, wait: float) -> list[tuple[str, int, int]]:
        ended = self._reap()
        if not ended and wait > 0 and self._children:
            self._wait_for_an_exit(wait)
            ended = self._reap()
        return ended

    def _reap(self) -> list[tuple[str, int, int]]:
        ended = []
        for job, popen in list(self._children.items()):
            # WNOWAIT: the child stays a zombie while what it left running is killed, so its pid is not reused
            if os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                continue
            kill_tree(popen.pid, job, ended=True)
            code = popen.wait()
            del self._children[job]
            ended.append((job, max(code, 0), -code if code < 0 else 0))
        return ended

    def _wait_for_an_exit(self, wait: float) -> None:
        """Block until a child ends or `wait` seconds pass: on the children's pidfds (readable once a process has
        ended), so that an exit is seen at once, not at a poll's next turn; a short sleep where there are none."""
        fds: list[int] = []
        try:
            for popen in self._children.values():
                fds.append(os.pidfd_open(popen.pid))
        except (AttributeError, OSError):  # not Linux 5.3 or later, or refused in a sandbox
            for fd in fds:
                os.close(fd)
            time.sleep(min(wait, 0.01))
            return
        try:
            select.select(fds, [], [], wait)
        finally:
            for fd in fds:
                os.close(fd)


SERVER = ForkServer()
SERVER_LOCK = threading.Lock()
atexit.register(SERVER.shutdown)


def warm_up() -> None:
    """Start the fork server now (it is otherwise started by the first check that needs it)."""
    with SERVER_LOCK:
        SERVER.ensure_running(time.monotonic() + SERVER_START_TIMEOUT)


def shutdown() -> None:
    """Stop the fork server (it is stopped at exit anyway)."""
    with SERVER_LOCK:
        SERVER.shutdown()
