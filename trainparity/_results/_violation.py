"""Outcomes, violations and errors: the small records a check yields and a report renders.

Shaped after torch.testing's mismatch records: small, flat, carrying a dotted path. Everything
here is JSON-friendly, so that rendering a result as JSON needs no special cases.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, TypeAlias

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
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return json_safe(item())
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return json_safe(tolist())
    return repr(value)


def format_number(value: bool | int | float) -> str:
    """A number as torch.testing prints it (`repr`), rounded to 6 significant digits.

    Where torch's number has at most 6 significant digits the text is the same as theirs; the
    rounding keeps reports stable where the last bits of a float depend on the machine.
    """
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return repr(value)
    return repr(float(f"{value:.6g}"))


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
        return cls("raised", phase, record["message"], record["exc_type"], record["traceback"], rank=rank)

    def to_dict(self) -> dict[str, JsonValue]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def headline(self) -> str:
        if self.kind == "raised":
            return f"{self.phase}: the recipe raised {self.exc_type}" + (f": {self.message}" if self.message else "")
        if self.kind in ("timeout", "abandoned", "corrupt"):
            return f"{self.phase}: {self.message}"
        return f"{self.phase}: the process died ({self.message})"
