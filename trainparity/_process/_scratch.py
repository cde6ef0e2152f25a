"""Scratch directories: removed on the way out, whatever ends the work that made them.

An exception or Ctrl-C runs the cleanup; SIGTERM is turned into `Terminated` while a directory exists (in the
main thread, where no handler was set), so it runs too, and then SIGTERM ends the process as it would have
without trainparity: test runners catch a test's SystemExit and go on (pytest and unittest both do), which would
turn a CI's cancellation into one failed test. SIGKILL runs nothing: the engine kills a child that
way (at the deadline, on a peer's failure), and a check the child was running (one called at module level in
the module it imported to rebuild a recipe) would leave its directories behind. A child therefore makes its
scratch directories in its job's workdir, which the parent removes once the child is gone.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator

#: where this process makes its scratch directories: None for the system's temporary directory; in a child of
#: the engine, its job's workdir (`make_scratch_directories_in`)
_root: pathlib.Path | None = None


def make_scratch_directories_in(directory: pathlib.Path) -> None:
    """Make this process's scratch directories in `directory` (a child's workdir, which its parent removes)."""
    global _root
    _root = directory


@contextlib.contextmanager
def scratch_directory(prefix: str) -> Iterator[pathlib.Path]:
    """A new directory, removed on the way out, even by a Ctrl-C or SIGTERM that comes as it is made: its name
    is chosen before it exists, so the cleanup knows it whenever the signal arrives. Only the process that made
    it removes it (a process forked meanwhile, unwinding a copy of this stack, leaves it to its maker)."""
    maker = os.getpid()
    with _sigterm_cleans_up():
        while True:
            path = (_root or pathlib.Path(tempfile.gettempdir())) / f"{prefix}{secrets.token_hex(6)}"
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                continue
            except BaseException:
                _remove(path)
                raise
            break
        try:
            yield path
        finally:
            if os.getpid() == maker:
                _remove(path)


def _remove(path: pathlib.Path) -> None:
    """`rmtree`, started again when a signal interrupts it (SIGTERM only once, see `_sigterm_cleans_up`; Ctrl-C
    each time it is pressed), then the interruption goes on."""
    interruption: BaseException | None = None
    while True:
        try:
            shutil.rmtree(path, ignore_errors=True)
            break
        except (KeyboardInterrupt, Terminated) as arrived:
            interruption = arrived
    if interruption is not None:
        raise interruption


class Terminated(SystemExit):
    """SIGTERM arrived while a scratch directory existed: every cleanup on the way out runs (children killed,
    temporary files removed), then SIGTERM, sent again, ends the process (status 143 in a shell)."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def _sigterm_cleans_up() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` (main thread, where no handler was set: an enclosing one stays); on the way
    out, once the handler is undone, a SIGTERM that arrived ends the process, however the exception was handled.

    Only the first SIGTERM raises: a second one must not cut the cleanup that the first started. A process
    forked meanwhile (a recipe's helper) inherits the handler but none of this: SIGTERM ends it at once.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    owner, arrived = os.getpid(), False

    def terminate(signum: int, frame: object) -> None:
        nonlocal arrived
        if os.getpid() != owner:
            _die_of_sigterm()
        if not arrived:
            arrived = True
            raise Terminated

    try:
        signal.signal(signal.SIGTERM, terminate)  # inside the `try`: an interrupt right after still restores
        yield
    finally:
        while True:  # a SIGTERM pending as the handler is undone runs it first (raising, if it is the first)
            try:
                if signal.getsignal(signal.SIGTERM) is terminate:  # not one installed meanwhile by the user's code
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                break
            except Terminated:
                continue
        if arrived:
            os.kill(os.getpid(), signal.SIGTERM)


def _die_of_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
