"""Helpers for tests that check that nothing is left running."""

from __future__ import annotations

import os
import pathlib
import time

from trainparity._process._tree import JOB_MARKER


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


#: set for this test process (conftest.py) and inherited by every child it starts: so that a check of another
#: test process (an xdist worker, a concurrent run) is never mistaken for one of ours left running
SESSION = "TRAINPARITY_TEST_SESSION"


def marked_processes(also: bytes | None = None) -> list[int]:
    """Running processes carrying a trainparity job marker: what a check started and has not killed.
    `also`: an environment entry (b"NAME=value") they must carry too, to tell one run's from another's; by
    default this test process's `SESSION` entry, where it is set."""
    if also is None and SESSION in os.environ:
        also = f"{SESSION}={os.environ[SESSION]}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(v.startswith(JOB_MARKER.encode() + b"=") for v in environ) \
                    and (also is None or also in environ) and running(int(entry.name)):
                found.append(int(entry.name))
    return found
