"""Helpers for tests that check that nothing is left running."""

from __future__ import annotations

import pathlib
import time


def running(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed orphan waits for init to reap it)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def still_running(pids: list[int], grace: float = 2.0) -> list[int]:
    """PIDs still running after `grace` seconds (SIGKILL reaches a process tree asynchronously)."""
    deadline = time.monotonic() + grace
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if running(pid)]
