"""The process options every check validates the same way: its isolation and its timeout.

Below both the engine and the session, which take their validation from here.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

Isolation: TypeAlias = Literal["process", "spawn", "inprocess"]
ISOLATIONS: tuple[Isolation, ...] = ("process", "spawn", "inprocess")


def validate_isolation(isolation: object) -> str:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation= must be one of {', '.join(map(repr, ISOLATIONS))}, got {isolation!r}")
    return str(isolation)


def validate_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout= must be a positive number of seconds, got {timeout!r}")
    return float(timeout)
