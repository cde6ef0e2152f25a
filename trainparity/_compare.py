"""Comparing snapshots: declared comparisons and torch.testing-style mismatch messages.

A snapshot is a flat mapping from dotted path to a leaf (a CPU tensor or a Python
scalar/string/None). Comparison walks two snapshots in the expected one's order and
returns one `Mismatch` per differing path; callers turn them into Violations.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import TypeAlias

import torch

from trainparity._result import JsonValue, json_safe

Leaf: TypeAlias = torch.Tensor | bool | int | float | str | None
Snapshot: TypeAlias = dict[str, Leaf]


@dataclasses.dataclass(frozen=True)
class ExactComparison:
    """Values must be bitwise equal (NaN equals NaN); the default everywhere."""

    def allowed(self, dtype: torch.dtype | None) -> tuple[float, float]:
        return 0.0, 0.0

    def describe(self) -> str:
        return "exact"


@dataclasses.dataclass(frozen=True)
class ToleranceComparison:
    """Floating-point values may differ by `atol + rtol * |expected|`, as declared by the user.

    Integer, boolean and string values, and RNG streams, are always compared exactly.
    """

    rtol: float
    atol: float

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"ToleranceComparison({name}=...) must be a number, got {type(value).__name__}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"ToleranceComparison({name}={value!r}) must be finite and >= 0")

    def allowed(self, dtype: torch.dtype | None) -> tuple[float, float]:
        if dtype is None or dtype.is_floating_point or dtype.is_complex:
            return float(self.rtol), float(self.atol)
        return 0.0, 0.0

    def describe(self) -> str:
        return f"tolerance(rtol={self.rtol:g}, atol={self.atol:g})"


Comparison: TypeAlias = ExactComparison | ToleranceComparison
EXACT = ExactComparison()


def resolve_comparison(comparison: object) -> Comparison:
    """Validate the user's `comparison=` argument (None means exact)."""
    if comparison is None:
        return EXACT
    if isinstance(comparison, (ExactComparison, ToleranceComparison)):
        return comparison
    raise TypeError(
        "comparison= must be tp.ExactComparison() or tp.ToleranceComparison(rtol=..., atol=...), "
        f"got {type(comparison).__name__}; tolerances are declared, never inferred"
    )


@dataclasses.dataclass(frozen=True)
class Mismatch:
    path: str
    message: str
    expected: JsonValue = None
    actual: JsonValue = None


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def compare_tensors(expected: torch.Tensor, actual: torch.Tensor, comparison: Comparison) -> Mismatch | None:
    """Compare two tensors; None when they agree under `comparison`. The path is left empty."""
    for attribute in ("shape", "dtype"):
        e, a = getattr(expected, attribute), getattr(actual, attribute)
        if e != a:
            return Mismatch(
                "", f"The values for attribute '{attribute}' do not match: {e} != {a}.", str(e), str(a)
            )
    rtol, atol = comparison.allowed(expected.dtype)
    if rtol == 0.0 and atol == 0.0 and torch.equal(expected, actual):
        return None  # the common case, without the float64 copies below
    if expected.dtype.is_floating_point or expected.dtype.is_complex:
        e64 = expected.detach().to(torch.complex128 if expected.dtype.is_complex else torch.float64)
        a64 = actual.detach().to(e64.dtype)
    else:
        e64 = expected.detach().to(torch.int64) if expected.dtype != torch.bool else expected.detach()
        a64 = actual.detach().to(e64.dtype)
    if e64.dtype == torch.bool:
        equal = e64 == a64
    elif rtol == 0.0 and atol == 0.0:
        equal = (e64 == a64) | (torch.isnan(e64) & torch.isnan(a64)) if e64.is_floating_point() else e64 == a64
    else:
        equal = torch.isclose(e64, a64, rtol=rtol, atol=atol, equal_nan=True)
    if bool(equal.all()):
        return None
    total = expected.numel()
    mismatched = int((~equal).sum())
    if e64.dtype == torch.bool:
        diff = (e64 != a64).to(torch.float64)
    else:
        diff = (e64 - a64).abs().to(torch.float64)
        diff = torch.where(equal, torch.zeros_like(diff), torch.nan_to_num(diff, nan=math.inf))
    flat_index = int(diff.reshape(-1).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), expected.shape))
    greatest = float(diff.reshape(-1)[flat_index])
    e_at = expected.reshape(-1)[flat_index].item() if total else None
    a_at = actual.reshape(-1)[flat_index].item() if total else None
    headline = "Tensor-likes are not equal!" if rtol == 0.0 and atol == 0.0 else "Tensor-likes are not close!"
    lines = [
        headline,
        "",
        f"Mismatched elements: {mismatched} / {total} ({100.0 * mismatched / total:.1f}%)",
        f"Greatest absolute difference: {_fmt(greatest)} at index {index} (up to {_fmt(atol)} allowed)",
    ]
    if rtol or e64.is_floating_point():
        denominator = abs(float(e64.reshape(-1)[flat_index].real if e64.is_complex() else e64.reshape(-1)[flat_index]))
        relative = greatest / denominator if denominator else math.inf
        lines.append(f"Greatest relative difference: {_fmt(relative)} at index {index} (up to {_fmt(rtol)} allowed)")
    return Mismatch("", "\n".join(lines), json_safe(e_at), json_safe(a_at))


def compare_leaves(expected: Leaf, actual: Leaf, comparison: Comparison) -> Mismatch | None:
    """Compare two snapshot leaves of any supported type."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return compare_tensors(expected, actual, comparison)
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor) or type(expected) is not type(actual):
        if isinstance(expected, (int, float)) and isinstance(actual, (int, float)) and not isinstance(
            expected, bool
        ) and not isinstance(actual, bool):
            pass  # an int that became a float (or back) is compared by value below
        else:
            return Mismatch(
                "",
                f"The types do not match: {_type_name(expected)} != {_type_name(actual)}.",
                _summary(expected),
                _summary(actual),
            )
    if isinstance(expected, float) or isinstance(actual, float):
        assert isinstance(expected, (int, float)) and isinstance(actual, (int, float))
        e, a = float(expected), float(actual)
        rtol, atol = comparison.allowed(None)
        if e == a or (math.isnan(e) and math.isnan(a)) or abs(e - a) <= atol + rtol * abs(e):
            return None
        difference = abs(e - a)
        relative = difference / abs(e) if e else math.inf
        headline = "Scalars are not equal!" if rtol == 0.0 and atol == 0.0 else "Scalars are not close!"
        message = (
            f"{headline}\n\nExpected {_fmt(e)} but got {_fmt(a)}.\n"
            f"Absolute difference: {_fmt(difference)} (up to {_fmt(atol)} allowed)\n"
            f"Relative difference: {_fmt(relative)} (up to {_fmt(rtol)} allowed)"
        )
        return Mismatch("", message, json_safe(e), json_safe(a))
    if expected == actual:
        return None
    return Mismatch("", f"Values are not equal!\n\nExpected {expected!r} but got {actual!r}.", json_safe(expected),
                    json_safe(actual))


def _type_name(value: Leaf) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor[{str(value.dtype).removeprefix('torch.')}]"
    return type(value).__name__


def _summary(value: Leaf) -> JsonValue:
    if isinstance(value, torch.Tensor):
        return f"{_type_name(value)} of shape {list(value.shape)}"
    return json_safe(value)


def compare_snapshots(
    expected: Mapping[str, Leaf], actual: Mapping[str, Leaf], comparison: Comparison
) -> Iterator[Mismatch]:
    """Yield one Mismatch per differing path, in the expected snapshot's order, then extra paths."""
    for path, value in expected.items():
        if path not in actual:
            yield Mismatch(path, "The entry is missing.", _summary(value), None)
            continue
        mismatch = compare_leaves(value, actual[path], comparison)
        if mismatch is not None:
            yield dataclasses.replace(mismatch, path=path)
    for path, value in actual.items():
        if path not in expected:
            yield Mismatch(path, "The entry is unexpected.", None, _summary(value))
