"""Outcomes and violations: the small records a check yields and a report renders.

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
