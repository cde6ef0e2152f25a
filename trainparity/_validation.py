"""Argument validation, shared by every check: misuse raises `InvalidArgument`, before anything runs.

As hypothesis's `InvalidArgument`, it is both a `TypeError` and a `ValueError`, so that code catching either
keeps working whichever a check raised before (a string for an int was a ValueError in one check and a
TypeError in another). The command line's exit status 4 means exactly this error (or a recipe spec that
cannot be used): any other exception out of trainparity's own code is a bug, shown with its traceback.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any


class InvalidArgument(TypeError, ValueError):
    """A check (or a helper of the public API) was called with an argument it cannot use; the message names
    the argument, what it must be, and what it got."""


def check_int(name: str, value: object, minimum: int, meaning: str = "", maximum: int | None = None) -> int:
    """`value` as an int in [minimum, maximum]; a bool is no int here (`steps=True` is a mistake)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise InvalidArgument(f"{name}= must be an int {bound}{f' ({meaning})' if meaning else ''}, got {value!r}")
    return value


def check_optional_int(name: str, value: object, minimum: int, meaning: str) -> int | None:
    """None or an int >= minimum; `meaning` says what None means."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name}= must be None ({meaning}) or an int >= {minimum}, got {value!r}")
    return value


def check_number(name: str, value: object, example: str, *, minimum: float | None = None,
                 positive: bool = False) -> float:
    """A finite real number (no bool), optionally >= minimum or > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            minimum is not None and value < minimum) or (positive and value <= 0):
        bound = " > 0" if positive else f" >= {minimum:g}" if minimum is not None else ""
        raise InvalidArgument(f"{name}= must be a finite number{bound} such as {example}, got {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: Collection[Any]) -> Any:
    if isinstance(value, bool) or value not in choices:
        raise InvalidArgument(f"{name}= must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}= must be True or False, got {value!r}")
    return value
