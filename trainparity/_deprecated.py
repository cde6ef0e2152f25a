"""Renamed public names that keep working: each old name warns once per process, naming the new one.

`RENAMED` maps the old names of the `trainparity` namespace to the new ones; the package's `__getattr__` serves
them (the new object itself, so `tp.check_data_parallel is tp.check_parallel`), outside `__all__` and `dir()`.
`renamed` makes a function under an old name that warns on its first call (the mixin's old method). `first_use`
is the one memory of what has warned, which the command line's old command names share.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

# Failures raised through `renamed` point at the user's line, not ours (unittest skips frames of modules that
# set this; pytest frames that set `__tracebackhide__`).
__unittest = True

P = ParamSpec("P")
R = TypeVar("R")

#: old name in `trainparity` -> the name it was renamed to (same object, same arguments)
RENAMED = {
    "check_data_parallel": "check_parallel",
    "assert_data_parallel_equivalent": "assert_parallel_equivalent",
    "DataParallelResult": "ParallelResult",
}

#: the old names that have warned in this process
_used: set[str] = set()
_lock = threading.Lock()


def first_use(old: str) -> bool:
    """True the first time `old` is used in this process, False ever after."""
    with _lock:
        if old in _used:
            return False
        _used.add(old)
        return True


def message(old: str, new: str, same: str = "same arguments") -> str:
    return f"{old} is deprecated: use {new} ({same})"


def warn_once(old: str, new: str, *, same: str = "same arguments", stacklevel: int = 1) -> None:
    """A DeprecationWarning naming `new`, the first time `old` is used in this process. `stacklevel` counts from
    the caller of `warn_once` (1: the caller's own line; 2: its caller's)."""
    if first_use(old):
        warnings.warn(message(old, new, same), DeprecationWarning, stacklevel=stacklevel + 1)


def renamed(function: Callable[P, R], old: str, new: str, *, stacklevel: int = 1) -> Callable[P, R]:
    """`function` under its old name `old`: the same signature, a DeprecationWarning naming `new` on its first call.
    `stacklevel` counts from the returned function's caller (1: the line that calls it)."""

    @functools.wraps(function)
    def alias(*args: P.args, **kwargs: P.kwargs) -> R:
        __tracebackhide__ = True
        warn_once(old, new, stacklevel=stacklevel + 1)
        return function(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old.rpartition(".")[2]
    alias.__doc__ = f"Deprecated: {message(old, new)}.\n\n{function.__doc__ or ''}".rstrip()
    return alias
