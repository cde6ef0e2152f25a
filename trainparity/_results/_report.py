"""Rendering results: stable text for humans and snapshots, deterministic JSON for tools.

The text is ASCII with no trailing whitespace and nothing run-specific (PIDs, timings,
temporary paths, addresses), so that `assertExpectedInline(result.report(), ...)` holds
from run to run and expecttest 0.3.0 can accept it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections import Counter
from typing import Any, ClassVar, Protocol

from trainparity._records import read
from trainparity._results._violation import (
    ChildError,
    JsonValue,
    Outcome,
    Violation,
    format_number,
    json_safe,
)
from trainparity._version import __version__


class Result(Protocol):
    """What the report renders of a check's result (`_result.Result`), so that rendering needs no result type."""

    check: ClassVar[str]
    outcome: Outcome
    violations: list[Violation]
    notes: list[str]
    config: dict[str, JsonValue]
    reason: str | None
    error: ChildError | None
    recorded: Recorded | None

    @property
    def first_violation(self) -> Violation | None: ...

    @property
    def counts(self) -> dict[str, int]: ...


SCHEMA_VERSION = 1

#: how many violations the text report lists before summarizing the rest
LISTED_VIOLATIONS = 10


def kind_counts(violations: list[Violation]) -> dict[str, int]:
    """How many violations of each kind, by kind: `Result.counts`, which the JSON repeats."""
    return dict(sorted(Counter(v.kind for v in violations).items()))


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What the JSON a result was read from (`Result.from_json`) says of where it was made, which the result's
    `to_json()` writes again rather than this process's: the version that wrote it, and `environment` where the JSON
    has one (None where it has none)."""

    trainparity_version: str
    environment: dict[str, JsonValue] | None = None


#: control characters (terminal escape sequences among them) but newline and tab, shown escaped
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def ascii_text(text: str) -> str:
    """Make text safe for snapshots and terminals: ASCII only, control characters escaped, no trailing spaces."""
    text = text.replace("\r\n", "\n").encode("ascii", "backslashreplace").decode("ascii")
    text = _CONTROL.sub(lambda match: f"\\x{ord(match[0]):02x}", text)
    return "\n".join(line.rstrip() for line in text.split("\n"))


def relative_paths(text: str) -> str:
    """Replace machine-specific absolute paths (working directory, interpreter prefixes)."""
    replacements = [(os.getcwd() + os.sep, "")]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        replacements.append((prefix + os.sep, "<python>/"))
    for old, new in sorted(replacements, key=lambda r: -len(r[0])):
        text = text.replace(old, new)
    return text


def format_value(value: JsonValue) -> str:
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, list) and len(value) > 12:
        return "[" + ", ".join(format_value(v) for v in value[:12]) + f", ... ({len(value)} items)]"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def violation_location(v: Violation) -> str:
    """`path (step 3, rank 1, cause: not_restored)`: where and what kind of divergence."""
    where = []
    for name in ("epoch", "step", "rank", "worker", "position"):
        value = getattr(v, name)
        if value is not None:
            where.append(f"{name} {value}")
    if v.sample_id is not None:
        where.append(f"sample {v.sample_id!r}")
    where.append(f"kind: {v.kind}")
    if v.cause is not None:
        where.append(f"cause: {v.cause}")
    return f"{v.path} ({', '.join(where)})"


def brief_location(v: Violation) -> str:
    """`scheduler.last_epoch (not_restored, step 3)`: the path, the cause (or the kind the path does not
    already name) and where in the run, for a headline."""
    where = [v.cause] if v.cause is not None else [] if v.path.endswith(v.kind) else [v.kind]
    for name in ("epoch", "step", "rank"):
        value = getattr(v, name)
        if value is not None:
            where.append(f"{name} {value}")
    if v.sample_id is not None:
        where.append(f"sample {v.sample_id!r}")
    return f"{v.path} ({', '.join(where)})" if where else v.path


def headline(result: Result) -> str:
    """The report's first line; a FAIL names its first violation, which pytest's short summary then shows."""
    first = result.first_violation
    where = f" at {brief_location(first)}" if result.outcome is Outcome.FAIL and first is not None else ""
    return f"trainparity {result.check} check: {result.outcome.value}{where}"


def _config_line(config: dict[str, JsonValue]) -> str:
    return ", ".join(f"{key}={format_value(config[key])}" for key in sorted(config))


def render_text(result: Result) -> str:
    lines = [headline(result)]
    if result.config:
        lines.append(f"config: {_config_line(result.config)}")
    if result.reason is not None:
        lines.append(f"reason: {result.reason}")
    first = result.first_violation
    if first is not None:
        lines += ["", f"First violation: {violation_location(first)}"]
        lines += ["  " + line if line else "" for line in first.message.splitlines()]
        if first.expected is not None or first.actual is not None:
            lines.append(f"  expected: {format_value(first.expected)}")
            lines.append(f"  actual:   {format_value(first.actual)}")
    if len(result.violations) > 1:
        lines += ["", f"All violations ({len(result.violations)}):"]
        for index, v in enumerate(result.violations[:LISTED_VIOLATIONS], start=1):
            lines.append(f"  {index}. {violation_location(v)}")
        hidden = len(result.violations) - LISTED_VIOLATIONS
        if hidden > 0:
            lines.append(f"  ... and {hidden} more (result.violations has them all)")
    if result.error is not None:
        # compared as shown: the JSON holds the error's paths relative, so a result read back from it still matches
        if result.reason is None or relative_paths(result.error.headline()) != relative_paths(result.reason):
            lines += ["", f"Error: {result.error.headline()}"]
        if result.error.traceback:
            lines += ["", "Traceback from the recipe:"]
            lines += ["  " + line for line in result.error.traceback.rstrip().splitlines()]
    if result.notes:
        lines += ["", "Notes:"]
        lines += [f"  - {note}" for note in result.notes]
    return ascii_text(relative_paths("\n".join(lines)))


def render_json(result: Result, *, include_environment: bool = False,
                extra: dict[str, JsonValue] | None = None) -> str:
    """The result as JSON; `extra` adds a result type's own fields (a training result's telemetry)."""
    recorded = result.recorded
    error = None
    if result.error is not None:
        error = result.error.to_dict()
        if recorded is None:  # a result read from JSON holds paths made relative where it was written
            error = {k: (relative_paths(v) if isinstance(v, str) else v) for k, v in error.items()}
    document: dict[str, JsonValue] = {
        "schema_version": SCHEMA_VERSION,
        "trainparity_version": __version__ if recorded is None else recorded.trainparity_version,
        "check": result.check,
        "outcome": result.outcome.value,
        "config": json_safe(result.config),
        "reason": result.reason,
        "counts": json_safe(result.counts),
        "first_violation": None if result.first_violation is None else result.first_violation.to_dict(),
        "violations": [v.to_dict() for v in result.violations],
        "notes": list(result.notes),
        "error": json_safe(error),
        **(extra or {}),
    }
    if include_environment and recorded is not None:
        # where the check ran, as written; null where the JSON did not say (this process is not where it ran)
        document["environment"] = recorded.environment
    elif include_environment:
        import platform

        import torch

        document["environment"] = {
            "python": platform.python_version(),
            "torch": str(torch.__version__),
            "cwd": os.getcwd(),
            "pid": os.getpid(),
        }
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True)


#: the fields every result's JSON has, besides `schema_version` and a result type's own (`extra` above)
COMMON_FIELDS = ("trainparity_version", "check", "outcome", "config", "reason", "counts", "first_violation",
                 "violations", "notes", "error")


@dataclasses.dataclass
class Document:
    """A result's JSON, read and checked by `read_json`: the common fields as a result holds them, and the rest."""

    check: str
    outcome: Outcome
    violations: list[Violation]
    notes: list[str]
    config: dict[str, JsonValue]
    reason: str | None
    error: ChildError | None
    recorded: Recorded
    #: the fields besides the common ones and `environment`: a result type's own (a training result's telemetry)
    extra: dict[str, JsonValue]


def _malformed(problem: str) -> ValueError:
    return ValueError(f"not a trainparity result's JSON: {problem}")


def _field(document: dict[str, JsonValue], name: str, kinds: tuple[type, ...], expected: str) -> Any:
    """`document[name]`, refused unless it is one of `kinds` (a bool is not an int here)."""
    value = document[name]
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        raise _malformed(f"{name!r} must be {expected}, got {value!r}")
    return value


def read_json(text: str | bytes) -> Document:
    """The inverse of `render_json`: the JSON parsed and checked, with a ValueError naming what is wrong (a field
    missing, of another type, or that disagrees with the violations); a newer trainparity's schema is refused."""
    try:
        document = json.loads(text)
    except ValueError as invalid:  # json.JSONDecodeError, and UnicodeDecodeError for bytes
        raise _malformed(str(invalid)) from invalid
    if not isinstance(document, dict):
        raise _malformed(f"expected a JSON object, got {type(document).__name__}")
    if "schema_version" not in document:
        raise _malformed("it lacks 'schema_version'")
    schema: int = _field(document, "schema_version", (int,), "an integer")
    if schema > SCHEMA_VERSION:
        written = document.get("trainparity_version")
        raise ValueError(
            f"this result's JSON has schema_version {schema}"
            + (f" (written by trainparity {written})" if isinstance(written, str) else "")
            + f", newer than trainparity {__version__} reads (schema_version {SCHEMA_VERSION} and older): "
            "upgrade trainparity (pip install -U trainparity) to read it")
    if schema < 1:
        raise _malformed(f"schema_version {schema} (versions start at 1)")
    missing = [name for name in COMMON_FIELDS if name not in document]
    if missing:
        raise _malformed(f"it lacks {', '.join(map(repr, missing))}")
    outcome: str = _field(document, "outcome", (str,), "a string")
    if outcome not in Outcome.__members__:
        raise _malformed(f"'outcome' must be one of {', '.join(Outcome)}, got {outcome!r}")
    notes: list[JsonValue] = _field(document, "notes", (list,), "a list")
    if not all(isinstance(note, str) for note in notes):
        raise _malformed(f"'notes' must be a list of strings, got {notes!r}")
    error: dict[str, JsonValue] | None = _field(document, "error", (dict, type(None)), "an object or null")
    violations = [read(Violation, v, f"violations[{i}]")
                  for i, v in enumerate(_field(document, "violations", (list,), "a list"))]
    # counts and first_violation repeat what the violations say: where they disagree, the JSON is not ours
    derived = {"counts": kind_counts(violations), "first_violation": violations[0].to_dict() if violations else None}
    for name, value in derived.items():
        if json.dumps(value, sort_keys=True) != json.dumps(document[name], sort_keys=True):
            raise _malformed(f"{name!r} disagrees with 'violations': {document[name]!r}")
    environment = document.get("environment")
    if environment is not None and not isinstance(environment, dict):
        raise _malformed(f"'environment' must be an object, got {environment!r}")
    return Document(
        check=_field(document, "check", (str,), "a string"),
        outcome=Outcome(outcome),
        violations=violations,
        notes=[str(note) for note in notes],
        config=_field(document, "config", (dict,), "an object"),
        reason=_field(document, "reason", (str, type(None)), "a string or null"),
        error=None if error is None else read(ChildError, error, "'error'"),
        recorded=Recorded(_field(document, "trainparity_version", (str,), "a string"), environment),
        extra={k: v for k, v in document.items() if k not in (*COMMON_FIELDS, "schema_version", "environment")},
    )
