"""Fail if any process a check started is still running (run last in `.ci/run`).

Every process a check starts carries the engine's job marker in its environment; one still running
after every step has ended was leaked. Each is printed with its command line and killed, so that
nothing outlives the CI run, and the exit status is 1.

    python tools/leftovers.py
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys

TEST_DIR = pathlib.Path(__file__).resolve().parent.parent / "test"
sys.path.insert(0, str(TEST_DIR))

from process_helpers import marked_processes  # noqa: E402


def command_line(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def main() -> int:
    leftovers = [pid for pid in marked_processes() if pid != os.getpid()]
    for pid in leftovers:
        print(f"still running: {pid} {command_line(pid)}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    print(f"{len(leftovers)} process(es) left running by checks")
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
