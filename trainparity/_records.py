"""Records that cross a boundary: one encoder and one reader for every dataclass a check hands on.

A child hands its trace to the parent in the `_wire` format, and a result is written to JSON and read back
(`Result.from_json`). Both write a dataclass as the plain dict of its fields (`fields_of`, shallow: tensors
are not copied) and read it back by its annotations (`read`): each field is checked against its type
(`int`, `float | None`, `list[Clip]`, `dict[str, Leaf]`, nested dataclasses, unions of them) and rebuilt, so a
record read back is the record that was written or a `RecordError` that names the field. Nothing of the data
chooses a class: the reader asks for a type and gets it, so that reading cannot execute anything.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

_Reader = Callable[[Any, str], Any]


class RecordError(ValueError):
    """Data that is not a record of the type asked for: the message names where, what it must be and what it got."""


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(field.name for field in dataclasses.fields(cls))
    return names


def is_record(value: object) -> bool:
    """Whether `value` is a dataclass instance (a record `fields_of` writes)."""
    return hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type)


def fields_of(record: Any) -> dict[str, Any]:
    """A dataclass instance as the dict of its fields, shallow (unlike `dataclasses.asdict`, which deep-copies
    every tensor): the writers (`_wire.dump`, `json_safe`) walk what it holds."""
    return {name: getattr(record, name) for name in _field_names(type(record))}


def read(kind: type[_T], value: object, where: str, *, json: bool = False) -> _T:
    """`value`, as `fields_of` and a writer left it, read back as a `kind` (a dataclass); `json`: floats may be the
    strings `json_safe` writes for infinities and NaN. RecordError, naming the place by `where`, for what a
    writer could not have written."""
    result: _T = _cached_reader(kind, json)(value, where)
    return result


def _fail(where: str, expected: object, value: object) -> typing.NoReturn:
    shown = repr(value) if len(repr(value)) <= 60 else f"a {type(value).__name__}"
    raise RecordError(f"{where} must be {_type_name(expected)}, got {shown}")


def _type_name(kind: object) -> str:
    """An annotation as a reader writes it: `int | None`, `list[Clip]`, `Tensor`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if kind is None or kind is type(None):
        return "None"
    if isinstance(origin, type):
        return f"{origin.__name__}[{', '.join('...' if arg is Ellipsis else _type_name(arg) for arg in args)}]"
    return kind.__name__ if isinstance(kind, type) else str(kind)


_READERS: dict[tuple[Any, bool], _Reader] = {}


def _cached_reader(kind: Any, json: bool) -> _Reader:
    reader = _READERS.get((kind, json))
    if reader is None:
        reader = _READERS[kind, json] = _reader(kind, json)
    return reader


def _reader(kind: Any, json: bool) -> _Reader:  # noqa: PLR0911 - one case per kind of annotation
    """The function that reads a value of the annotation `kind`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or kind is object or isinstance(kind, (str, typing.ForwardRef)):
        return lambda value, where: value  # a field of any value (JsonValue's recursion, Any): the writer checked it
    if origin is typing.Literal:
        return _literal(kind, args)
    if origin in (typing.Union, types.UnionType):
        return _union(kind, args, json)
    if origin is list:
        item = _reader(args[0], json)
        return lambda value, where: [item(v, f"{where}[{i}]") for i, v in enumerate(_of(value, list, where, kind))]
    if origin in (tuple, frozenset):
        return _sequence(kind, origin, args, json)
    if origin is dict:
        key, item = _reader(args[0], json), _reader(args[1], json)
        return lambda value, where: {key(k, f"{where} key {k!r}"): item(v, f"{where}[{k!r}]")
                                     for k, v in _of(value, dict, where, kind).items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _record(kind, json)
    if kind is float:
        return _float(json)
    if kind is type(None):
        return lambda value, where: value if value is None else _fail(where, None, value)
    return _instance(kind)


def _of(value: object, cls: type[_T], where: str, kind: object) -> _T:
    if not isinstance(value, cls):
        _fail(where, kind, value)
    return value


def _literal(kind: object, allowed: tuple[Any, ...]) -> _Reader:
    return lambda value, where: value if value in allowed and not isinstance(value, bool) else _fail(where, kind, value)


def _sequence(kind: object, origin: type, args: tuple[Any, ...], json: bool) -> _Reader:
    """tuple[T, ...], a fixed tuple[A, B] or frozenset[T]: written as a list."""
    fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
    readers = [_reader(arg, json) for arg in args] if fixed else [_reader(args[0], json)]

    def read_sequence(value: Any, where: str) -> Any:
        items: list[Any] | tuple[Any, ...] = _of(value, (list, tuple), where, kind)  # type: ignore[arg-type]
        if fixed and len(items) != len(readers):
            _fail(where, kind, value)
        read_items = [(readers[i] if fixed else readers[0])(v, f"{where}[{i}]") for i, v in enumerate(items)]
        return origin(read_items)

    return read_sequence


def _float(json: bool) -> _Reader:
    def read_float(value: Any, where: str) -> float:
        if json and value in ("inf", "-inf", "nan"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(where, float, value)
        return float(value)

    return read_float


def _instance(kind: type) -> _Reader:
    """A leaf type (int, str, bool, torch.Tensor, ...): the value as it is; bool is no int here."""
    def read_instance(value: Any, where: str) -> Any:
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            _fail(where, kind, value)
        return value

    return read_instance


def _accepts(kind: Any) -> Callable[[Any], bool]:
    """Whether a value could be of the union member `kind`, by its Python type: which member reads it."""
    origin = typing.get_origin(kind) or kind
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):
        names = set(_field_names(origin))
        required = {f.name for f in dataclasses.fields(origin)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        return lambda value: isinstance(value, dict) and required <= value.keys() <= names
    if origin is typing.Literal:
        return lambda value: value in typing.get_args(kind)
    python_type = {tuple: (list, tuple), frozenset: list, float: (int, float), type(None): type(None)}.get(
        origin, origin)
    if kind is Any or not isinstance(python_type, (type, tuple)):
        return lambda value: True
    return lambda value: isinstance(value, python_type) and (not isinstance(value, bool) or origin is bool)


def _union(kind: object, members: tuple[Any, ...], json: bool) -> _Reader:
    """`A | B | None`: the first member that could hold the value by its Python type reads it."""
    choices = [(_accepts(member), _reader(member, json)) for member in members]
    if json and float in members:  # the strings json_safe writes for non-finite floats
        choices.insert(0, (lambda value: value in ("inf", "-inf", "nan"), _float(json)))

    def read_union(value: Any, where: str) -> Any:
        for accepts, read_member in choices:
            if accepts(value):
                return read_member(value, where)
        _fail(where, kind, value)

    return read_union


def _record(cls: type, json: bool) -> _Reader:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    readers = {field.name: _reader(hints[field.name], json) for field in fields}
    required = [field.name for field in fields
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]

    def read_record(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(value).__name__}")
        missing = [name for name in required if name not in value]
        unknown = sorted(set(value) - readers.keys())
        if missing or unknown:
            problems = ([f"lacks {', '.join(map(repr, missing))}"] if missing else []) + (
                [f"has unknown fields {', '.join(map(repr, unknown))}"] if unknown else [])
            raise RecordError(f"{where} ({cls.__name__}) {' and '.join(problems)}")
        return cls(**{name: readers[name](item, f"{where} ({cls.__name__}): {name}") for name, item in value.items()})

    return read_record
