"""Specs: `package.module:Class`, `path/to/file.py:Class`, with literal constructor arguments `module:Class(k=1)`.

Parsed without executing anything but the module they name.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import pathlib
from typing import Any

from trainparity._recipe._modules import ALIAS_PREFIX, attribute, import_module, load_module, origin
from trainparity._validation import InvalidArgument


class SpecError(InvalidArgument):
    """A spec that cannot be parsed, or names a module, file or attribute that does not exist: a misuse of the
    check's recipe argument (so also a TypeError, where a ValueError alone was raised before)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """A parsed spec: where to find an object (a module name or a .py file), its name, literal call arguments."""

    text: str
    source: str
    qualname: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def called(self) -> bool:
        return bool(self.args or self.kwargs)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise SpecError(
            f"argument {ast.unparse(node)} in {text!r} is not a literal (numbers, strings, bytes, True, False, "
            "None, and tuples, lists, dicts and sets of them)"
        ) from None


def parse_spec(text: str, shape: str = "package.module:ClassName") -> Spec:
    """Parse `source:Name`, `source:Name(literal, key=literal, ...)`; nothing is evaluated but literals."""
    source, sep, target = text.partition(":")
    usage = f"a spec looks like '{shape}', 'path/to/file.py:{shape.partition(':')[2]}' or '{shape}(key=1, name=\"x\")'"
    if not sep or not source.strip() or not target.strip():
        raise SpecError(f"{usage}, got {text!r}")
    try:
        expression = ast.parse(target.strip(), mode="eval").body
    except SyntaxError:
        raise SpecError(f"{usage}, got {text!r}") from None
    call = expression if isinstance(expression, ast.Call) else None
    qualname = _dotted(call.func if call is not None else expression)
    if qualname is None:
        raise SpecError(f"{usage}, got {text!r}")
    if call is None:
        return Spec(text, source.strip(), qualname)
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        raise SpecError(f"*args and **kwargs are not literals: spell the arguments out in {text!r}")
    args = tuple(_literal(arg, text) for arg in call.args)
    kwargs = {kw.arg: _literal(kw.value, text) for kw in call.keywords if kw.arg is not None}
    return Spec(text, source.strip(), qualname, args, kwargs)


def _is_path(source: str) -> bool:
    return source.endswith(".py") or "/" in source


def load_spec(spec: Spec) -> Any:
    """The object a spec names. A module or file that cannot be found, or a missing name, is a SpecError;
    whatever the module raises while it is executed propagates."""
    if _is_path(spec.source):
        path = pathlib.Path(spec.source).resolve()
        if not path.is_file():
            raise SpecError(f"no such file {spec.source!r} for {spec.text!r}")
        name = path.stem
        if origin(name) != str(path):  # not importable by name: a name of its own, unique per file
            name = f"{ALIAS_PREFIX}file_{name}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        module = load_module(name, str(path))
    else:
        try:
            module = import_module(spec.source)
        except ModuleNotFoundError as error:
            if error.name is None or not (spec.source + ".").startswith(error.name + "."):
                raise  # the module itself imports something missing: its own error
            raise SpecError(f"cannot import module {spec.source!r} for {spec.text!r}: {error}") from error
    try:
        return attribute(module, spec.qualname)
    except AttributeError:
        raise SpecError(f"module {spec.source!r} has no attribute {spec.qualname!r}") from None
