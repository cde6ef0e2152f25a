"""The warmed fork server: a process that has paid torch's start-up costs once and forks children.

It imports torch, numpy and trainparity, builds an optimizer and takes a step (torch
imports much lazily on first use), restores every RNG stream it touched, and then forks
one child per request. It never imports the user's modules, so each child imports them
anew; each child starts its own session. The server owns its children's lives: it kills a
child's whole tree on request and, when a child ends, whatever the child left running
(it is a child subreaper, so orphans of its children become its own), before it reports
the exit.

Protocol on stdin/stdout, one line each:
  parent -> server: `RUN <job> <base64 of the pickled request>`, `KILL <job>`
  server -> parent: `READY [<base64 of its bytecode directory>]`, `EXIT <job> <exit code> <signal number>`
The request travels through the pipe so that the environment it holds never rests on disk.
End of stdin means the parent is gone: the server kills its children's trees and exits.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import gc
import os
import pathlib
import select
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable

from trainparity._process._tree import kill_tree

#: prctl option making this process the reaper of its descendants' orphans (linux/prctl.h)
PR_SET_CHILD_SUBREAPER = 36


def warm_up() -> None:
    """Pay torch's lazy first-use costs here, once, instead of in every child."""
    import io
    import random

    import numpy as np
    import torch

    from trainparity._process import _child, _wire  # noqa: F401 - imported to be warm in children
    from trainparity._state import _snapshot  # noqa: F401 - imported to be warm in children
    from trainparity._state._rng import capture_rng, restore_rng

    streams = capture_rng()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(4, 1))
    for optimizer in (torch.optim.AdamW(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)):
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        loss = torch.nn.functional.mse_loss(model(torch.randn(3, 4)), torch.zeros(3, 1))
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=True)
    for module in ("trainparity._resume._check", "trainparity._accumulation", "trainparity._parallel._rank"):
        try:
            __import__(module)
        except ImportError:
            pass
    from trainparity._observe._autocast import formulas

    formulas()  # torch's FLOP table, read on first use: the mixed-precision check's children find it built
    restore_rng(streams)
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def run_child(job: str, request: bytes, protocol_fds: tuple[int, ...]) -> None:
    """In the forked child: detach from the server, then run the request. Never returns."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(2, 1)  # the user's prints go to stderr, never into the protocol pipe
        for fd in (devnull, *protocol_fds):
            if fd > 2:
                os.close(fd)
        from trainparity._process._child import run_request

        code = run_request(request)
    except BaseException:  # noqa: BLE001 - a child must never fall back into the server loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


#: the name (`/proc/<pid>/comm`, `ps`) of the spare child while it waits for a request
SPARE_NAME = b"trainparity-spare"[:15]
#: prctl option setting the calling thread's name (linux/prctl.h)
PR_SET_NAME = 15


def _set_name(name: bytes) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the name is only a courtesy to `ps`
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


class _Spare:
    """A child forked ahead of the next request, waiting for it on a pipe: a run starts without waiting for the fork
    (milliseconds for a process that has imported torch), which happens instead while that run runs. It is the same
    process a fork on request would make: the server changes nothing between its forks."""

    def __init__(self) -> None:
        self.pid = 0
        #: the write end of the spare's request pipe; -1 when there is no spare
        self.request_fd = -1
        #: the server's name, which a spare takes back as it becomes a run (b"" where there is no /proc)
        comm = pathlib.Path("/proc/self/comm")
        self.server_name = comm.read_bytes().strip() if comm.exists() else b""

    def fork(self, server_fds: tuple[int, ...]) -> None:
        read, write = os.pipe()
        # Born with its name (the server's thread lends it for the fork): a spare that named itself after the fork
        # would pass for a run while it starts (`ps`, the tests' look for what a check left running).
        _set_name(SPARE_NAME)
        pid = os.fork()
        if pid == 0:
            _wait_as_spare(read, (*server_fds, write), self.server_name)
        if self.server_name:
            _set_name(self.server_name)
        os.close(read)
        self.pid, self.request_fd = pid, write

    def take(self, job: str, request: bytes) -> int | None:
        """Hand the request to the spare; its pid, or None when there is no spare or it has died."""
        pid, fd = self.pid, self.request_fd
        self.pid, self.request_fd = 0, -1
        if not pid:
            return None
        try:
            data = job.encode() + b"\n" + request
            while data:
                data = data[os.write(fd, data):]
        except OSError:  # it died (killed from outside): reaped as an unknown child, and a fork takes its place
            return None
        finally:
            os.close(fd)
        return pid


def _wait_as_spare(read: int, server_fds: tuple[int, ...], name: bytes) -> None:
    """In the spare child: hold none of the server's pipes (the parent sees the server's end by their closing), wait
    for the request, then run it under the server's `name`; end of file without one means the server is gone. Never
    returns."""
    try:
        signal.set_wakeup_fd(-1)
        for fd in server_fds:
            os.close(fd)
        chunks = []
        while chunk := os.read(read, 1 << 20):
            chunks.append(chunk)
        os.close(read)
        if chunks:
            if name:
                _set_name(name)
            job, _, request = b"".join(chunks).partition(b"\n")
            run_child(job.decode(), request, ())
    finally:
        os._exit(0)


def _exit_when_orphaned(parent: int) -> Callable[[], None]:
    """Exit at once if the parent dies while we warm up (seconds in which stdin is not read).

    Returns the function that ends the watch and joins its thread; from then on end of stdin
    tells the server that its parent is gone.
    """
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            if os.getppid() != parent:
                os._exit(0)

    thread = threading.Thread(target=watch, name="trainparity-orphan-watch", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join()

    return stop


def _cache_bytecode() -> str | None:
    """Where the user's environment says not to write bytecode (PYTHONDONTWRITEBYTECODE, usual in containers and
    CI), every child would compile the recipe's modules from source again (milliseconds for each, tens for a long
    test module): the children write and read it in a directory of the server's instead, removed as it exits, and
    the user's source trees stay free of it. Its path, or None where bytecode is written as usual."""
    if not sys.dont_write_bytecode or sys.pycache_prefix is not None:
        return None
    directory = tempfile.mkdtemp(prefix="trainparity-bytecode-")
    sys.pycache_prefix = directory
    sys.dont_write_bytecode = False
    return directory


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init, and the environment marker still finds them


def serve() -> None:
    # Collection during torch's import costs a third of its time; nothing here makes cycles
    # worth collecting before warm-up ends. Afterwards everything is frozen so that children
    # neither scan nor copy-on-write the server's objects.
    gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    stop_watching = _exit_when_orphaned(os.getppid())
    # Protocol pipes moved off fds 0/1 so that nothing the children print can reach them.
    inbound, outbound = os.dup(0), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    _become_subreaper()
    warm_up()
    stop_watching()  # no thread may be running when the server forks
    gc.freeze()
    gc.enable()
    children: dict[int, str] = {}
    # A child's end wakes the loop at once (SIGCHLD writes a byte to this pipe), with no polling: a check waits
    # for each of its runs' exits, and a poll's period is added to each.
    ended, ended_signal = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda number, frame: None)
    signal.set_wakeup_fd(ended_signal, warn_on_full_buffer=False)

    def send(line: str) -> None:
        os.write(outbound, (line + "\n").encode())

    bytecode = _cache_bytecode()
    spare = _Spare()
    server_fds = (inbound, outbound, ended, ended_signal)
    try:
        # the parent removes the bytecode directory if this process is killed
        send("READY" if bytecode is None else f"READY {base64.b64encode(os.fsencode(bytecode)).decode()}")
        spare.fork(server_fds)
        _serve_requests(inbound, ended, server_fds, spare, children, send)
    except BrokenPipeError:
        pass  # the parent is gone (it closed its end of the protocol): what it started ends with it
    finally:
        for pid, job in children.items():
            kill_tree(pid, job)
        if spare.pid:
            os.close(spare.request_fd)  # the spare reads end of file and exits
        if bytecode is not None:
            shutil.rmtree(bytecode, ignore_errors=True)


def _serve_requests(inbound: int, ended: int, server_fds: tuple[int, ...], spare: _Spare, children: dict[int, str],
                    send: Callable[[str], None]) -> None:
    """Run requests until the parent closes its end of the protocol (end of file)."""
    buffer = b""
    while True:
        readable, _, _ = select.select([inbound, ended], [], [])
        if ended in readable:
            with contextlib.suppress(BlockingIOError):  # drained before reaping: a later exit writes again
                while os.read(ended, 4096):
                    pass
        if inbound in readable:
            chunk = os.read(inbound, 1 << 20)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                command, job, *rest = line.decode().split(" ")
                if command == "RUN":
                    request = base64.b64decode(rest[0])
                    taken = spare.take(job, request)
                    if taken is None:
                        taken = os.fork()
                        if taken == 0:
                            run_child(job, request, (*server_fds, spare.request_fd))
                    children[taken] = job
                elif command == "KILL":
                    for pid, owner in children.items():
                        if owner == job:
                            kill_tree(pid, job)
        _reap(children, send)
        if not spare.pid:  # after every request that arrived together has started
            spare.fork(server_fds)


def _reap(children: dict[int, str], send: Callable[[str], None]) -> None:
    """Report each child that ended, after killing what it left running; reap adopted orphans."""
    while True:
        try:
            # WNOWAIT: the ended child stays a zombie, so its pid cannot be reused while its tree is killed
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0:
            return
        pid = info.si_pid
        job = children.pop(pid, None)
        if job is not None:
            kill_tree(pid, job, ended=True)
        _, status = os.waitpid(pid, 0)
        if job is None:
            continue  # an orphan of a child's tree, adopted by this subreaper
        if os.WIFSIGNALED(status):
            send(f"EXIT {job} -1 {os.WTERMSIG(status)}")
        else:
            send(f"EXIT {job} {os.waitstatus_to_exitcode(status)} 0")


if __name__ == "__main__":
    serve()
