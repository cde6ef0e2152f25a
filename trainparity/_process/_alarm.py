"""Interrupting a run in this process (isolation="inprocess") when its check's deadline passes.

A run in a child is killed at its deadline; a run in this process can only be interrupted. On the
main thread an interval timer (SIGALRM) raises `DeadlinePassed` in the running code at the deadline:
Python code, `time.sleep` and blocking waits that retry on signals (queues, locks, DataLoader
workers) are interrupted; C code that holds the interpreter without returning (a hung kernel, a
blocking C call that ignores signals) is not, and is reported once it returns. A timer someone else
armed (pytest-timeout's signal method) is honoured: whichever is due first fires, and the other is
armed again afterwards. Off the main thread no signal can be delivered: the run is not interrupted,
and the engine reports the timeout once it returns.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from trainparity._process._options import Deadline


class DeadlinePassed(BaseException):
    """Raised into an in-process run at its check's deadline. A BaseException, so that the user's
    `except Exception:` does not swallow it."""

    def stack(self) -> str:
        """Where the run was when the deadline interrupted it: the user's frames, most recent call last."""
        from trainparity._process._child import format_user_traceback  # the frames' filter, not needed before

        frames = format_user_traceback(self).rstrip().splitlines()[1:-1]  # without the headline and the exception
        return "Stack when the timeout interrupted it (most recent call last):\n" + "\n".join(frames)


def can_interrupt() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interrupted_at(deadline: Deadline) -> Iterator[None]:
    """Raise `DeadlinePassed` in the code this block runs when `deadline` passes (see the module docstring)."""
    if not can_interrupt():
        yield
        return
    previous_handler = signal.getsignal(signal.SIGALRM)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, 0)
    #: when the timer someone else armed is due (inf: none, or it has fired)
    theirs = time.monotonic() + previous_delay if previous_delay > 0 else math.inf

    def arm() -> None:
        signal.setitimer(signal.ITIMER_REAL, max(min(deadline.at, theirs) - time.monotonic(), 1e-3))

    def alarm(signum: int, frame: FrameType | None) -> Any:
        nonlocal theirs
        if time.monotonic() < theirs:
            raise DeadlinePassed
        theirs = time.monotonic() + previous_interval if previous_interval > 0 else math.inf
        arm()  # ours stays due
        return previous_handler(signum, frame) if callable(previous_handler) else None

    try:
        signal.signal(signal.SIGALRM, alarm)
        arm()
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if theirs < math.inf:  # theirs again, for what is left of it (at once if it is overdue)
            signal.setitimer(signal.ITIMER_REAL, max(theirs - time.monotonic(), 1e-3), previous_interval)
