"""What a test session gives every check, and what it learns from them.

A check's `isolation`, `timeout` and `precision` left at None take the session's defaults,
which the pytest plugin sets from `--trainparity-isolation`, `--trainparity-timeout` and
`--trainparity-precision` (and which are the documented built-in defaults otherwise). Every
check's result is offered to the session's listeners, which is how the plugin counts the
checks of a run by outcome.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Literal, ParamSpec, TypeAlias, TypeVar, cast

from trainparity._process._options import ISOLATIONS, Isolation
from trainparity._results._result import Result
from trainparity._validation import check_choice, check_timeout

Precision: TypeAlias = Literal["float64", "native"]

P = ParamSpec("P")
R = TypeVar("R", bound=Result)


@dataclasses.dataclass(frozen=True)
class Defaults:
    """The session's defaults for the checks' arguments left at None."""

    #: None: each check's own default ("process" for resume, "inprocess" for accumulation, ...)
    isolation: Isolation | None = None
    timeout: float = 120.0
    precision: Precision = "float64"


BUILTIN = Defaults()
_defaults = BUILTIN
_listeners: list[Callable[[Result], None]] = []
#: whether a check is running: a check that another runs (coverage inside data parallel) is part of it
_inside_check = contextvars.ContextVar("trainparity_inside_check", default=False)


def set_defaults(defaults: Defaults) -> None:
    global _defaults
    _defaults = defaults


def defaults() -> Defaults:
    return _defaults


def isolation(explicit: object, own_default: Isolation, *, runs: tuple[Isolation, ...] = ISOLATIONS) -> Isolation:
    """The isolation a check runs under, validated: the argument, else the session's default when it is one
    the check `runs`, else the check's own default."""
    chosen = explicit
    if chosen is None:
        session = _defaults.isolation
        chosen = session if session is not None and session in runs else own_default
    return cast(Isolation, check_choice("isolation", chosen, ISOLATIONS))


def timeout(explicit: object) -> float:
    """The timeout a check runs under, validated: the argument, else the session's default."""
    return check_timeout(_defaults.timeout if explicit is None else explicit)


def precision(explicit: object) -> Precision:
    """The precision a check runs in, validated: the argument, else the session's default."""
    from trainparity._state._precision import PRECISIONS

    return cast(Precision, check_choice("precision", _defaults.precision if explicit is None else explicit, PRECISIONS))


def add_listener(listener: Callable[[Result], None]) -> None:
    _listeners.append(listener)


def remove_listener(listener: Callable[[Result], None]) -> None:
    _listeners.remove(listener)


#: the module a check's run is importing to rebuild the recipe, while it does
_importing: contextvars.ContextVar[str | None] = contextvars.ContextVar("trainparity_importing", default=None)


@contextlib.contextmanager
def importing(module: str) -> Iterator[None]:
    """Mark the import of a recipe's module (see `refuse_processes_while_importing`)."""
    token = _importing.set(module)
    try:
        yield
    finally:
        _importing.reset(token)


def refuse_processes_while_importing() -> None:
    """A check that starts processes, called while a recipe's module is imported to rebuild the recipe, is a
    check at module level (a script without an `if __name__ == "__main__":` guard): each of its processes
    would import the module and start that check again."""
    module = _importing.get()
    if module is not None:
        raise RuntimeError(
            f"a check that starts processes was called while trainparity imported {module!r} to rebuild a "
            "recipe: at module level it runs again in every process that imports the module. Call it under "
            "`if __name__ == \"__main__\":` or from a test function.")


def recorded(check: Callable[P, R]) -> Callable[P, R]:
    """Offer every result of `check` to the session's listeners, unless another check runs it."""

    @functools.wraps(check)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if _inside_check.get():
            return check(*args, **kwargs)
        token = _inside_check.set(True)
        try:
            result = check(*args, **kwargs)
        finally:
            _inside_check.reset(token)
        for listener in tuple(_listeners):
            listener(result)
        return result

    return run
