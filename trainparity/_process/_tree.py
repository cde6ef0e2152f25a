"""Killing a child's whole process tree, not only its process group.

A child runs in its own session, but what it starts may leave that session (`setsid`,
`start_new_session=True`) or outlive its parent and be re-parented. Every child carries an
environment marker naming its job, which processes it executes inherit; `kill_tree` kills
the child's process group, every descendant found through `/proc`, and every process whose
environment carries the marker, repeating until a pass finds nothing new.
"""

from __future__ import annotations

import os
import signal

#: environment variable naming the job a process belongs to, inherited by what it executes
JOB_MARKER = "TRAINPARITY_JOB"


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc (empty where there is no /proc)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue
        # the command name is in parentheses and may itself hold spaces or parentheses
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            parents[int(entry)] = int(fields[1])
    return parents


def _marked(pids: list[int], marker: bytes) -> set[int]:
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as file:
                if marker in file.read().split(b"\0"):
                    found.add(pid)
        except OSError:
            continue
    return found


def tree(pid: int, job: str) -> set[int]:
    """`pid` and every process that descends from it or carries `job`'s marker."""
    parents = _parents()
    members = {pid} | _marked(list(parents), f"{JOB_MARKER}={job}".encode())
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    stack = list(members)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in members:
                members.add(child)
                stack.append(child)
    members.discard(os.getpid())
    return members


def kill_tree(pid: int, job: str, *, ended: bool = False) -> None:
    """SIGKILL `pid`'s process group and tree (see the module docstring); `pid` may be gone already. `ended`: `pid`
    has exited and is not yet waited for (a zombie, which forks nothing), so a first look that finds nothing else
    running is the last (each look reads /proc: about a millisecond per hundred processes)."""
    killed: set[int] = set()
    for _ in range(5):  # a member may fork while we kill: look again until nothing new is found
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        found = tree(pid, job) - killed
        if not found - {pid} and (pid in killed or ended):
            return
        for member in found:
            try:
                os.kill(member, signal.SIGKILL)
            except OSError:
                pass
        killed |= found | {pid}
