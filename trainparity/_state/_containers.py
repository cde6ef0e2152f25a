"""The containers a State may hold, known in one place: their items, their kind and how they are rebuilt.

Beside `dict`, `list` and `tuple`, users keep recently seen IDs in a `set`, a rolling window of losses in a
`deque(maxlen=...)`, counts in a `Counter`, caches in an `OrderedDict` or a `defaultdict`, and configuration
in namedtuples and dataclass instances. The snapshot walks each one's items (a path per item) and records
its kind where it is not a plain dict, list or tuple (`<path>.<type>`: a deque's `maxlen`, a defaultdict's
factory, a class's name), so that a checkpoint that loses items or turns a deque into a list is named at
the path; the reference checkpoint stores each kind with what rebuilds it.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
from typing import Any

#: the path component under which a container's kind is recorded (no attribute or key text looks like it)
TYPE_COMPONENT = "<type>"


def is_dataclass_instance(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def is_namedtuple(value: object) -> bool:
    return isinstance(value, tuple) and isinstance(getattr(type(value), "_fields", None), tuple)


def is_container(value: object) -> bool:
    """Whether the walk goes into `value` item by item."""
    return isinstance(value, (dict, list, tuple, set, frozenset, collections.deque)) or is_dataclass_instance(value)


def container_values(value: Any) -> list[Any]:
    """A container's items (a dict's values, a dataclass's fields)."""
    if isinstance(value, dict):
        return list(value.values())
    if is_dataclass_instance(value):
        return [item for _, item in dataclass_fields(value)]
    return list(value)


def dataclass_fields(value: Any) -> list[tuple[str, Any]]:
    return [(field.name, getattr(value, field.name)) for field in dataclasses.fields(value)
            if hasattr(value, field.name)]


def reference(obj: Any) -> str | None:
    """`module:qualname` of a class or function that can be imported again, else None (a lambda, a local class)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    return f"{module}:{qualname}"


def resolve(ref: str | None, like: Any = None) -> Any:
    """The object `ref` names: taken from `like` (the fresh State's counterpart) where it names the same, so a
    class of the user's script needs no import; else imported. None when it cannot be found."""
    if ref is None:
        return None
    if like is not None and reference(like) == ref:
        return like
    module_name, _, qualname = ref.partition(":")
    try:  # not _recipe._modules.import_attribute: the State walk sits below the recipe machinery (an import circle)
        found: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


def shown_name(obj: Any) -> str:
    """A class's or function's name as reports show it (builtins and collections without their module)."""
    module, qualname = getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj))
    return qualname if module in ("builtins", "collections") else f"{module}.{qualname}"


def container_kind(value: Any) -> str | None:
    """What a container is beyond its items (None for a plain dict, list or tuple): its class, a deque's
    maxlen, a defaultdict's factory. Shown in reports, so it is stable across processes (no address)."""
    if type(value) in (dict, list, tuple) or not is_container(value):
        return None
    if isinstance(value, collections.deque):
        return f"deque(maxlen={value.maxlen})"
    if isinstance(value, collections.defaultdict):
        factory = value.default_factory
        return f"defaultdict({'None' if factory is None else shown_name(factory)})"
    if is_namedtuple(value):
        return f"namedtuple {shown_name(type(value))}"
    if is_dataclass_instance(value):
        return f"dataclass {shown_name(type(value))}"
    return shown_name(type(value))


def canonical_text(item: Any) -> str:
    """A hashable item as text that is the same in every process (a frozenset's repr follows string hashing,
    which differs between processes)."""
    if isinstance(item, (set, frozenset)):
        return f"{type(item).__name__}({{{', '.join(sorted(canonical_text(i) for i in item))}}})"
    if isinstance(item, tuple):
        inner = ", ".join(canonical_text(i) for i in item)
        return f"({inner},)" if len(item) == 1 else f"({inner})"
    text = repr(item)
    return text if " at 0x" not in text else f"<{type(item).__qualname__}>"


def set_items(value: set[Any] | frozenset[Any]) -> list[Any]:
    """A set's items in an order that is the same in every process: numbers by value, others by their text."""
    if all(isinstance(item, (bool, int, float)) for item in value):
        try:
            return sorted(value)
        except TypeError:
            pass
    return sorted(value, key=canonical_text)
