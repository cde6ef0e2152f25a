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
    is chosen before it exists, so the cleanup knows it whenever the signal arrives."""
    with _sigterm_cleans_up():
        while True:
            path = (_root or pathlib.Path(tempfile.gettempdir())) / f"{prefix}{secrets.token_hex(6)}"
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                continue
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            break
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


class Terminated(SystemExit):
    """SIGTERM arrived while a scratch directory existed: every cleanup on the way out runs (children killed,
    temporary files removed), then SIGTERM, sent again, ends the process (status 143 in a shell)."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def _sigterm_cleans_up() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` (main thread, where no handler was set: an enclosing one stays); on the way
    out, once the handler is undone, a SIGTERM that arrived ends the process, however the exception was handled."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    arrived = False

    def terminate(signum: int, frame: object) -> None:
        nonlocal arrived
        arrived = True
        raise Terminated

    try:
        signal.signal(signal.SIGTERM, terminate)  # inside the `try`: an interrupt right after still restores
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if arrived:
            os.kill(os.getpid(), signal.SIGTERM)
