"""Argument validation, shared by every check: misuse raises `InvalidArgument`, before anything runs.

The checks of one argument's type and range (`check_int`, `check_number`, `check_choice`, ...) write one
wording for every check; `check_argument` states a rule that relates arguments, or one only a check's own
domain knows, in the words of that rule (as hypothesis's `check_argument`).

As hypothesis's `InvalidArgument`, it is both a `TypeError` and a `ValueError`, so that code catching either
keeps working whichever a check raised before (a string for an int was a ValueError in one check and a
TypeError in another). The command line's exit status 4 means exactly this error (or a recipe spec that
cannot be used): any other exception out of trainparity's own code is a bug, shown with its traceback.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, TypeVar

import numpy as np

_T = TypeVar("_T")


class InvalidArgument(TypeError, ValueError):
    """A check (or a helper of the public API) was called with an argument it cannot use; the message names
    the argument, what it must be, and what it got."""


def check_argument(condition: object, message: str) -> None:
    """InvalidArgument with `message` (what is wrong and the fix) unless `condition` holds."""
    if not condition:
        raise InvalidArgument(message)


def check_type(value: object, kind: type[_T], message: str) -> _T:
    """`value`, which must be a `kind` (InvalidArgument with `message` otherwise)."""
    if not isinstance(value, kind):
        raise InvalidArgument(message)
    return value


def check_misuse(misuse: str | None) -> None:
    """The misuse a run found once the recipe's State was set up (`misuse`: its message; None: none), raised in the
    caller as if the check had seen it before running."""
    if misuse is not None:
        raise InvalidArgument(misuse)


def _int(value: object) -> int | None:
    """An int or a numpy integer (an ID or a rank read from an array) as an int; None for anything else: a bool is
    no int here (`steps=True` is a mistake)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


def check_int(name: str, value: object, minimum: int, meaning: str = "", maximum: int | None = None) -> int:
    """`value` as an int in [minimum, maximum]. `name` is the argument (`steps` reads `steps= must be ...`), or a
    call's argument written whole (`CoverageRecorder(rank=...)`)."""
    number = _int(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise InvalidArgument(f"{_named(name)} must be an int {bound}{f' ({meaning})' if meaning else ''}, "
                              f"got {value!r}")
    return number


def check_resume_at(value: object, steps: int) -> int:
    """The step after which a resume check saves and exits: 1..steps - 1."""
    return check_int("resume_at", value, 1, f"steps={steps}", maximum=steps - 1)


def check_optional_int(name: str, value: object, minimum: int, meaning: str) -> int | None:
    """None or an int >= minimum; `meaning` says what None means."""
    if value is None:
        return None
    number = _int(value)
    if number is None or number < minimum:
        raise InvalidArgument(f"{_named(name)} must be None ({meaning}) or an int >= {minimum}, got {value!r}")
    return number


def _named(name: str) -> str:
    """An argument's name as messages write it (`steps=`); a call or a phrase as it is (`CoverageRecorder(rank=...)`,
    `ranks= keys in epoch 0`)."""
    return f"{name}=" if name.isidentifier() else name


def check_number(name: str, value: object, example: str) -> float:
    """A finite real number (no bool), as a float; its range is the caller's rule (`check_argument`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(
            value):
        raise InvalidArgument(f"{_named(name)} must be a finite number such as {example}, got {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: Collection[Any]) -> Any:
    """One of `choices` (strings): `'a' or 'b'`, or `one of 'a', 'b', 'c'`."""
    if isinstance(value, bool) or value not in choices:
        listed = [repr(choice) for choice in choices]
        allowed = " or ".join(listed) if len(listed) == 2 else f"one of {', '.join(listed)}"
        raise InvalidArgument(f"{_named(name)} must be {allowed}, got {value!r}")
    return value


#: seeds torch, numpy (modulo 2**32) and Python's random all accept
SEED_LIMIT = 2**63
#: the longest timeout, in seconds (over three years): the interval timer that bounds an in-process run takes no
#: infinity, and overflows the platform's time_t at about 1e10
MAX_TIMEOUT = 1e8


def check_seed(seed: object) -> int:
    """The `seed=` of a check, refused at the call rather than blamed on the recipe in a child."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidArgument(f"seed= must be an int, got {type(seed).__name__}")
    check_argument(0 <= seed < SEED_LIMIT, f"seed= must be in [0, 2**63), got {seed}")
    return seed


def check_timeout(timeout: object) -> float:
    """A check's `timeout=`, in seconds."""
    check_argument(not isinstance(timeout, bool) and isinstance(timeout, (int, float)) and 0 < timeout <= MAX_TIMEOUT,
                   f"timeout= must be a positive number of seconds, at most {MAX_TIMEOUT:.0f} (about three years), "
                   f"got {timeout!r}")
    return float(timeout)  # type: ignore[arg-type]


def check_globs(value: object, argument: str, example: str) -> tuple[str, ...] | None:
    """A check's glob argument as a tuple: None, one glob, or a list of them."""
    if value is None:
        return None
    globs = (value,) if isinstance(value, str) else value
    if not isinstance(globs, (list, tuple)) or not all(isinstance(glob, str) for glob in globs):
        raise InvalidArgument(f"{argument}= must be a glob or a list of globs (strings such as {example!r}), "
                              f"got {type(value).__name__}"
                              + (f" {value!r}" if isinstance(value, (list, tuple)) else ""))
    check_argument(globs and all(globs),
                   f"{argument}= must hold at least one non-empty glob such as {example!r}, got {value!r}")
    return tuple(globs)


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{_named(name)} must be True or False, got {value!r}")
    return value


def check_callable(name: str, value: object, what: str) -> None:
    """A function (or any callable); `what` says which: `a function batch -> IDs`."""
    if not callable(value):
        raise InvalidArgument(f"{_named(name)} must be {what}, got {type(value).__name__}")
