"""docs/api.md's reference says what the code does: the signatures it writes out and the command line's options."""

from __future__ import annotations

import argparse
import ast
import inspect
import pathlib
import re
from typing import Any

import pytest

import trainparity as tp

pytestmark = pytest.mark.exact

API = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
#: `tp.name(parameters) -> result`, in a code block or inline, possibly over several lines
SIGNATURE = re.compile(r"tp\.(\w+(?:\.\w+)?)\(((?:[^()]|\([^()]*\))*)\)\s*->", re.DOTALL)


def documented_signatures(text: str) -> list[tuple[str, ast.arguments]]:
    """(name, parameters) of every signature the text writes out; `tp.f(...) -> ...` (elided) is not one."""
    found = []
    for match in SIGNATURE.finditer(text):
        parameters = " ".join(match.group(2).replace("`", "").split())
        if parameters in ("", "..."):
            continue
        function = ast.parse(f"def f({parameters}): pass").body[0]
        assert isinstance(function, ast.FunctionDef)
        found.append((match.group(1), function.args))
    return found


def signature_differences(name: str, documented: ast.arguments, code: inspect.Signature) -> list[str]:
    """How a written-out signature differs from the code's: parameter names and kinds, then defaults."""
    doc_parameters = [(a.arg, "positional") for a in documented.posonlyargs + documented.args] + \
                     [(a.arg, "keyword-only") for a in documented.kwonlyargs]
    code_parameters = [(p.name, "keyword-only" if p.kind is p.KEYWORD_ONLY else "positional")
                       for p in code.parameters.values()]
    if doc_parameters != code_parameters:
        return [f"{name}: docs {doc_parameters} != code {code_parameters}"]
    positional = documented.posonlyargs + documented.args
    defaults: dict[str, Any] = {a.arg: ast.literal_eval(d) for a, d in
                                zip(positional[len(positional) - len(documented.defaults):], documented.defaults,
                                    strict=True)}
    defaults.update({a.arg: ast.literal_eval(d) for a, d in zip(documented.kwonlyargs, documented.kw_defaults,
                                                                strict=True) if d is not None})
    differences = []
    for parameter in code.parameters.values():
        has_default = parameter.default is not inspect.Parameter.empty
        if has_default != (parameter.name in defaults) or has_default and (
                type(parameter.default) is not type(defaults[parameter.name])
                or parameter.default != defaults[parameter.name]):
            shown = defaults.get(parameter.name, "no default")
            differences.append(f"{name}({parameter.name}=...): docs {shown!r}, code "
                               f"{'no default' if not has_default else repr(parameter.default)}")
    return differences


def test_every_signature_written_out_in_the_api_reference_is_the_code_s() -> None:
    signatures = documented_signatures(API)
    differences = []
    for name, documented in signatures:
        target: Any = tp
        for part in name.split("."):
            target = getattr(target, part)
        differences += signature_differences(name, documented, inspect.signature(target))
    assert differences == []
    functions = {name for name in tp.__all__ if inspect.isfunction(getattr(tp, name))}
    assert sorted(functions - {name for name, _ in signatures}) == [], "write these signatures out in docs/api.md"


def test_a_signature_that_lacks_a_parameter_or_has_another_default_is_found() -> None:
    def check(recipe: object, *, steps: int = 6, world_size: int = 1) -> None:
        del recipe, steps, world_size

    ((_, lacking),) = documented_signatures("`tp.check(recipe, *, steps=6) -> None`")
    assert signature_differences("check", lacking, inspect.signature(check)) == [
        "check: docs [('recipe', 'positional'), ('steps', 'keyword-only')] != code [('recipe', 'positional'), "
        "('steps', 'keyword-only'), ('world_size', 'keyword-only')]"]
    ((_, other),) = documented_signatures("tp.check(recipe, *, steps=6.0,\n   world_size=1) -> None")
    assert signature_differences("check", other, inspect.signature(check)) == [
        "check(steps=...): docs 6.0, code 6"]


def _synopsis() -> dict[str, str]:
    """The command line section's synopsis: command -> its lines."""
    block = API.split("## Command line", 1)[1].split("```", 2)[1]
    lines: dict[str, str] = {}
    command = ""
    for line in block.splitlines():
        head = re.match(r"python -m trainparity ([\w-]+)", line)
        if head:
            command = head.group(1)
        lines[command] = lines.get(command, "") + line + "\n"
    return lines


def test_the_command_line_synopsis_names_every_command_and_option(
        cli_commands: dict[str, argparse.ArgumentParser]) -> None:
    synopsis = _synopsis()
    missing = []
    for name, command in cli_commands.items():
        if name not in synopsis:
            missing.append(name)
            continue
        for action in command._actions:
            missing += [f"{name} {option}" for option in action.option_strings
                        if option.startswith("--") and option != "--help" and option not in synopsis[name]]
    assert missing == []
