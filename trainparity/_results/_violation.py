"""Outcomes, violations and errors: the small records a check yields and a report renders.

Shaped after torch.testing's mismatch records: small, flat, carrying a dotted path. Everything
here is JSON-friendly, so that rendering a result as JSON needs no special cases.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from trainparity._records import fields_of, is_record, read

JsonValue: TypeAlias = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


class Outcome(enum.StrEnum):
    """The verdict of a check."""

    PASS = "PASS"
    FAIL = "FAIL"
    #: The evidence is missing or ambiguous (e.g. the baseline is not reproducible): never a guess.
    ABSTAIN = "ABSTAIN"
    #: The user's code raised, hung past the timeout, or its process died.
    ERROR = "ERROR"


@dataclasses.dataclass(frozen=True)
class Violation:
    """One observed divergence.

    `kind` says what was observed (snake_case), `path` where (dotted, rooted at a State
    entry, `rng.<stream>`, `data.sample_ids`, `loss`, a phase or `coverage.<kind>`),
    `message` the torch.testing-style detail. `cause` is a diagnosis code where one is
    known; it names the first observed divergence, not a proven root cause. Fields that
    do not apply are None, never 0 by default.
    """

    kind: str
    path: str
    message: str
    step: int | None = None
    expected: JsonValue = None
    actual: JsonValue = None
    cause: str | None = None
    sample_id: int | str | None = None
    rank: int | None = None
    epoch: int | None = None
    position: int | None = None
    worker: int | None = None

    def to_dict(self) -> dict[str, JsonValue]:
        # vars() rather than dataclasses.fields(): a failing coverage audit may hold millions.
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, JsonValue]) -> Violation:
        """The inverse of `to_dict()`: a violation as a result's JSON holds it (ValueError for what is not one)."""
        return read(cls, dict(data) if isinstance(data, Mapping) else data, "violation")


def json_safe(value: Any) -> JsonValue:
    """Coerce a small value into JSON: numbers, strings, lists and string-keyed dicts."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if is_record(value):
        return json_safe(fields_of(value))
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return json_safe(item())
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return json_safe(tolist())
    return repr(value)


def listed(items: Sequence[str], limit: int = 6) -> str:
    """The first `limit` items, comma-separated, and how many there are in all where some are left out: the one way
    every report lists names (`fc.weight, fc.bias, ... (9 in all)`)."""
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def format_number(value: bool | int | float | None, digits: int = 6, *, missing: str = "None") -> str:
    """A number rounded to `digits` significant digits, written as torch.testing writes floats (`repr`: 2.0, 1e-05,
    inf) but with an exponent from 10**digits on (1.032e+07, where `repr` would write 10320000.0 and claim digits
    that were rounded away); `missing` for None.

    Every number of every report is written by this function. Where torch's number has at most `digits`
    significant digits and is below 10**digits the text is the same as theirs; the rounding keeps reports stable
    where the last bits of a float depend on the machine (tables round to fewer digits, `_telemetry.TABLE_DIGITS`).
    """
    if value is None:
        return missing
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return repr(value)
    text = f"{value:.{digits}g}"
    return text if "." in text or "e" in text else f"{text}.0"


def format_scale(value: float | None, *, missing: str = "None") -> str:
    """A GradScaler's loss scale: a power of two, shown whole (65536, not 65536.0)."""
    whole = value is not None and value.is_integer() and abs(value) < 2.0**63
    return format_number(int(value) if whole and value is not None else value, missing=missing)


@dataclasses.dataclass(frozen=True)
class ChildError:
    """Why a check ended in ERROR: the user's exception, a timeout, or a dead process."""

    #: "raised", "timeout", "died", "corrupt" (its output could not be read), or "abandoned" (killed or
    #: never started because another run failed)
    kind: str
    #: which run of the check failed, e.g. "baseline", "interrupted", "resumed", "rank 1"
    phase: str
    message: str
    exc_type: str | None = None
    #: the child's traceback text, paths shown relative to the working directory
    traceback: str | None = None
    exitcode: int | None = None
    signal: str | None = None
    rank: int | None = None

    @classmethod
    def raised(cls, record: dict[str, Any], phase: str, rank: int | None = None) -> ChildError:
        """From `_child.error_record`: the recipe's exception as type name, message and traceback."""
        return cls("raised", phase, record["message"], record["exc_type"], record["traceback"],
                   rank=record.get("rank", rank))

    def to_dict(self) -> dict[str, JsonValue]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, JsonValue]) -> ChildError:
        """The inverse of `to_dict()`: the error as a result's JSON holds it (ValueError for what is not one)."""
        return read(cls, dict(data) if isinstance(data, Mapping) else data, "error")

    def headline(self) -> str:
        if self.kind == "raised":
            return f"{self.phase}: the recipe raised {self.exc_type}" + (f": {self.message}" if self.message else "")
        if self.kind in ("timeout", "abandoned", "corrupt"):
            return f"{self.phase}: {self.message}"
        return f"{self.phase}: the process died ({self.message})"
