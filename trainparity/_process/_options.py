"""The process options every check validates the same way: its isolation and its timeout, and the deadline
a timeout sets.

Below both the engine and the session, which take their validation from here.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal, TypeAlias

from trainparity._validation import check_timeout

Isolation: TypeAlias = Literal["process", "spawn", "inprocess"]
ISOLATIONS: tuple[Isolation, ...] = ("process", "spawn", "inprocess")


#: the longest timeout, in seconds (over three years): the interval timer that bounds an in-process run takes no
#: infinity, and overflows the platform's time_t at about 1e10
MAX_TIMEOUT = 1e8


@dataclasses.dataclass(frozen=True)
class Deadline:
    """When a check must have ended: `timeout` seconds after it began, on the machine-wide monotonic clock.

    One per check, shared by all its runs, reruns and process starts (the fork server's included), so that
    `timeout=3` means what pytest-timeout and `subprocess.run` mean by it: the check gives up after 3 s.
    """

    timeout: float
    #: `time.monotonic()` at which the check's time is up
    at: float

    @classmethod
    def after(cls, timeout: float) -> Deadline:
        """The deadline of a check that begins now with `timeout` seconds (validated)."""
        seconds = check_timeout(timeout)
        return cls(seconds, time.monotonic() + seconds)

    def remaining(self) -> float:
        """Seconds left (negative once the time is up)."""
        return self.at - time.monotonic()

    def describe(self) -> str:
        """`timeout=3 s`, as reports name the limit."""
        return f"timeout={self.timeout:g} s"
