"""Comparing snapshots: declared comparisons and torch.testing-style mismatch messages.

A snapshot is a flat mapping from dotted path to a leaf (a CPU tensor or a Python
scalar/string/None). Comparison walks two snapshots in the expected one's order and
returns one `Mismatch` per differing path; callers turn them into Violations.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import torch

from trainparity._results._violation import JsonValue, format_number, json_safe
from trainparity._state._digest import Digest, digest
from trainparity._state._tensors import arithmetic_view, element_bits, flat_bits, opaque
from trainparity._validation import InvalidArgument, check_argument

#: a snapshot's value at one path; a large tensor may be known by its `Digest` only
Leaf: TypeAlias = torch.Tensor | Digest | bool | int | float | str | None
Snapshot: TypeAlias = dict[str, Leaf]


@dataclasses.dataclass(frozen=True)
class ExactComparison:
    """Values must be bitwise equal: the same dtype, shape and bytes.

    So -0.0 differs from 0.0, and a NaN equals a NaN with the same bits. The default of the
    resume check; bitwise equality is also what a digest decides on its own.
    """

    #: globs over paths not compared at all: a check's `ignore=`, set by `ignoring` (not a constructor argument)
    ignore: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False)

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
    #: globs over paths not compared at all: a check's `ignore=`, set by `ignoring` (not a constructor argument)
    ignore: tuple[str, ...] = dataclasses.field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            check_argument(not isinstance(value, bool) and isinstance(value, (int, float)),
                           f"ToleranceComparison({name}=...) must be a number, got {type(value).__name__}")
            check_argument(math.isfinite(value) and value >= 0,
                           f"ToleranceComparison({name}={value!r}) must be finite and >= 0")

    def allowed(self, dtype: torch.dtype | None) -> tuple[float, float]:
        if dtype is None or dtype.is_floating_point or dtype.is_complex:
            return float(self.rtol), float(self.atol)
        return 0.0, 0.0

    def describe(self) -> str:
        return f"tolerance(rtol={self.rtol:g}, atol={self.atol:g})"


Comparison: TypeAlias = ExactComparison | ToleranceComparison
C = TypeVar("C", bound=ExactComparison | ToleranceComparison)
EXACT = ExactComparison()


def ignoring(comparison: C, globs: Sequence[str]) -> C:
    """`comparison` passing over the paths `globs` match (`ignored`)."""
    copy = dataclasses.replace(comparison)
    object.__setattr__(copy, "ignore", tuple(globs))  # frozen, and not a constructor argument
    return copy


def exact_like(comparison: Comparison) -> ExactComparison:
    """Exact, passing over what `comparison` ignores: for what is compared exactly whatever was declared (RNG
    streams, the State two runs start from)."""
    return ignoring(EXACT, comparison.ignore) if comparison.ignore else EXACT


def resolve_comparison(comparison: object) -> Comparison:
    """Validate the user's `comparison=` argument (None means exact)."""
    if comparison is None:
        return EXACT
    if isinstance(comparison, (ExactComparison, ToleranceComparison)):
        return comparison
    raise InvalidArgument(
        "comparison= must be tp.ExactComparison() or tp.ToleranceComparison(rtol=..., atol=...), "
        f"got {type(comparison).__name__}; tolerances are declared, never inferred"
    )


def ignored(path: str, globs: Sequence[str]) -> bool:
    """`path` matches one of `globs`, or lies under a path that does (`ema` ignores `ema.fc.weight`)."""
    if not globs:
        return False
    parts = path.split(".")
    prefixes = [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(prefix, glob) for glob in globs for prefix in prefixes)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    path: str
    message: str
    expected: JsonValue = None
    actual: JsonValue = None


def mismatch_message(
    identifier: str,
    extra: str,
    abs_diff: float,
    abs_index: tuple[int, ...] | None,
    rel_diff: float,
    rel_index: tuple[int, ...] | None,
    rtol: float,
    atol: float,
) -> str:
    """The one message builder for numbers, in torch.testing's words (`_make_mismatch_msg`)."""
    equality = rtol == 0 and atol == 0

    def difference(kind: str, diff: float, index: tuple[int, ...] | None, tolerance: float) -> str:
        if index is None:
            line = f"{kind.title()} difference: {format_number(diff)}"
        else:
            line = f"Greatest {kind} difference: {format_number(diff)} at index {index}"
        return line if equality else f"{line} (up to {format_number(tolerance)} allowed)"

    return "\n".join([
        f"{identifier} are not {'equal' if equality else 'close'}!",
        "",
        extra,
        difference("absolute", abs_diff, abs_index, atol),
        difference("relative", rel_diff, rel_index, rtol),
    ])


def bitwise_equal(expected: torch.Tensor, actual: torch.Tensor) -> bool:
    """Same dtype, shape and bytes."""
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return False
    return torch.equal(flat_bits(expected), flat_bits(actual))


def _unravel(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), shape)) if shape else ()


def _scalar(value: Any) -> bool | int | float:
    item = value.item() if isinstance(value, torch.Tensor) else value
    if isinstance(item, complex):
        return abs(item)
    return item


def _greatest(differences: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The greatest difference and the first index holding it, up to rounding.

    Differences equal up to float rounding tie: which of them is largest depends on the kernels torch
    picks for the CPU, so the first within a relative 1e-6 of the maximum is reported (NaN and inf
    exactly), which keeps reports the same on every machine.
    """
    greatest = differences.max()
    if bool(torch.isnan(greatest)):
        ties = torch.isnan(differences)
    elif bool(torch.isinf(greatest)) or differences.dtype == torch.int64:
        ties = differences == greatest
    else:
        ties = differences >= greatest * (1 - 1e-6)
    return greatest, int(ties.nonzero()[0, 0])


#: elements per pass of `_all_close`: few enough passes that starting each operation (on every thread) costs
#: little, small enough that the buffers (float64: 2 MiB each) stay in the last-level cache (2**17 to 2**19
#: measured alike within noise on 1 M-element float64 tensors, 2**20 several times slower)
_CLOSE_CHUNK = 1 << 18


def _all_close(expected: torch.Tensor, actual: torch.Tensor, rtol: float, atol: float) -> bool | None:
    """Whether `torch.isclose(expected, actual, rtol, atol, equal_nan=True)` holds for every element: True, False,
    or None where an element's error is NaN or infinite (isclose then decides: NaN and NaN, inf and inf are close).

    The same operations as isclose (`|expected - actual| <= atol + |actual * rtol|`, rounded alike), chunk by
    chunk into reused buffers: isclose makes about ten full-size temporaries, several times the cost of the
    training step whose state it compares; and it stops at the first chunk that differs. The allowed error is
    capped at the largest finite value, so an infinite error never passes.
    """
    e, a = expected.detach().reshape(-1), actual.detach().reshape(-1)
    size = min(_CLOSE_CHUNK, e.numel())
    allowed = torch.empty(size, dtype=e.dtype, device=e.device)
    error, within = torch.empty_like(allowed), torch.empty_like(allowed, dtype=torch.bool)
    largest = torch.finfo(e.dtype).max
    for start in range(0, e.numel(), size):
        e_part, a_part = e[start:start + size], a[start:start + size]
        n = e_part.numel()
        torch.sub(e_part, a_part, out=error[:n])
        low, high = torch.aminmax(error[:n])  # one pass, without writing |error| back
        if bool(high <= atol) and bool(low >= -atol):  # in the tensor's dtype, as isclose rounds atol
            continue  # every error within atol, which every element's allowance is at least (NaN fails this)
        error[:n].abs_()
        torch.mul(a_part, rtol, out=allowed[:n])
        allowed[:n].abs_().add_(atol).clamp_(max=largest)
        torch.le(error[:n], allowed[:n], out=within[:n])
        if not bool(within[:n].all()):
            return False if bool(torch.isfinite(error[:n][~within[:n]]).all()) else None
    return True


def tensors_agree(expected: torch.Tensor, actual: torch.Tensor, comparison: Comparison) -> bool:
    """Whether `compare_tensors` finds them in agreement, without describing how they differ where they do."""
    if expected is actual:
        return True  # a snapshot that shares another's leaf (`_snapshot.Sharing`)
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return False
    if bitwise_equal(expected, actual):
        return True  # the common case, without the float64 copies below
    if opaque(expected.dtype) or isinstance(comparison, ExactComparison):
        return False
    rtol, atol = comparison.allowed(expected.dtype)
    e_values, a_values = arithmetic_view(expected), arithmetic_view(actual)
    close = _all_close(e_values, a_values, rtol, atol) if e_values.dtype.is_floating_point else None
    if close is not None:
        return close
    return bool(torch.isclose(e_values, a_values, rtol=rtol, atol=atol, equal_nan=True).all())


def compare_tensors(expected: torch.Tensor, actual: torch.Tensor, comparison: Comparison) -> Mismatch | None:
    """Compare two tensors; None when they agree under `comparison` (`tensors_agree`). The path is left empty."""
    if tensors_agree(expected, actual, comparison):
        return None
    for attribute in ("shape", "dtype"):
        e, a = getattr(expected, attribute), getattr(actual, attribute)
        if e != a:
            return Mismatch(
                "", f"The values for attribute '{attribute}' do not match: {e} != {a}.", str(e), str(a)
            )
    if opaque(expected.dtype):
        return _opaque_mismatch(expected, actual)
    rtol, atol = comparison.allowed(expected.dtype)
    e_values, a_values = arithmetic_view(expected), arithmetic_view(actual)
    if isinstance(comparison, ExactComparison):
        matches = (element_bits(expected) == element_bits(actual)).all(dim=1).reshape(expected.shape)
    else:
        matches = torch.isclose(e_values, a_values, rtol=rtol, atol=atol, equal_nan=True)
    floating = expected.dtype.is_floating_point or expected.dtype.is_complex
    wide = (torch.complex128 if expected.dtype.is_complex
            else torch.float64 if floating or e_values.dtype.is_floating_point else torch.int64)
    e64 = e_values.detach().reshape(-1).to(wide)
    a64 = a_values.detach().reshape(-1).to(wide)
    matched = matches.reshape(-1)
    abs_diff = (a64 - e64).abs().to(torch.float64) if wide != torch.int64 else (a64 - e64).abs()
    abs_diff[matched] = 0
    rel_diff = abs_diff / e64.abs()
    rel_diff[matched] = 0
    greatest_abs, abs_at = _greatest(abs_diff)
    greatest_rel, rel_at = _greatest(rel_diff)
    total = expected.numel()
    mismatched = total - int(matched.sum())
    lines = [f"Mismatched elements: {mismatched} / {total} ({mismatched / total:.1%})"]
    if expected.ndim == 0:
        e_value, a_value = _scalar(expected), _scalar(actual)
        message = mismatch_message("Scalars", f"Expected {format_number(e_value)} but got {format_number(a_value)}.",
                                   float(greatest_abs), None, float(greatest_rel), None, rtol, atol)
    else:
        message = mismatch_message("Tensor-likes", lines[0], _scalar(greatest_abs),
                                   _unravel(abs_at, expected.shape), float(greatest_rel),
                                   _unravel(rel_at, expected.shape), rtol, atol)
    if not bool(greatest_abs) and floating:
        first = _unravel(int((~matched).nonzero()[0, 0]), expected.shape)
        message += (f"\nThe values are equal but their bits differ (e.g. -0.0 and 0.0, or NaNs) at index {first}: "
                    "exact comparison is bitwise.")
    return Mismatch("", message, json_safe(e_values.reshape(-1)[abs_at].item()),
                    json_safe(a_values.reshape(-1)[abs_at].item()))


def _opaque_mismatch(expected: torch.Tensor, actual: torch.Tensor) -> Mismatch:
    """Tensors of a dtype that is only bits to torch (`bits8`, `float4_e2m1fn_x2`): which elements differ."""
    matched = (element_bits(expected) == element_bits(actual)).all(dim=1)
    total = expected.numel()
    mismatched = total - int(matched.sum())
    first = _unravel(int((~matched).nonzero()[0, 0]), expected.shape)
    dtype = str(expected.dtype).removeprefix("torch.")
    return Mismatch("", f"Tensor-likes are not equal!\n\nMismatched elements: {mismatched} / {total} "
                        f"({mismatched / total:.1%})\nThe first at index {first}: {dtype} values are bits to torch, "
                        "compared bitwise whatever the comparison.")


def _float_bits(value: float) -> bytes:
    return struct.pack("<d", value)


#: what a mismatch between digests says until the values are fetched
DIGESTS_DIFFER = "Their digests differ (the values of a large tensor are fetched only where the report shows them)."


def _compare_digests(expected: Digest | torch.Tensor, actual: Digest | torch.Tensor) -> Mismatch | None:
    e = expected if isinstance(expected, Digest) else digest(expected)
    a = actual if isinstance(actual, Digest) else digest(actual)
    for attribute in ("shape", "dtype"):
        if getattr(e, attribute) != getattr(a, attribute):
            return Mismatch("", f"The values for attribute '{attribute}' do not match: "
                                f"{getattr(e, attribute)} != {getattr(a, attribute)}.")
    if e.hash == a.hash:
        return None
    return Mismatch("", f"Tensor-likes are not equal!\n\n{DIGESTS_DIFFER}")


def compare_leaves(expected: Leaf, actual: Leaf, comparison: Comparison) -> Mismatch | None:
    """Compare two snapshot leaves of any supported type.

    A digest decides equality; where digests differ the values are needed to say how (and,
    under a tolerance, whether it is allowed): the mismatch says so until they are fetched.
    """
    if isinstance(expected, Digest) or isinstance(actual, Digest):
        if isinstance(expected, (Digest, torch.Tensor)) and isinstance(actual, (Digest, torch.Tensor)):
            return _compare_digests(expected, actual)
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return compare_tensors(expected, actual, comparison)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (expected, actual))
    if not numbers and type(expected) is not type(actual):
        return Mismatch(
            "",
            f"The types do not match: {_type_name(expected)} != {_type_name(actual)}.",
            _summary(expected),
            _summary(actual),
        )
    if numbers and (isinstance(expected, float) or isinstance(actual, float)):
        assert isinstance(expected, (int, float)) and isinstance(actual, (int, float))
        e, a = float(expected), float(actual)
        rtol, atol = comparison.allowed(None)
        if isinstance(comparison, ExactComparison):
            # Bitwise, as for tensors; an int that became a float (or back) is compared by value.
            both_float = isinstance(expected, float) and isinstance(actual, float)
            if (_float_bits(e) == _float_bits(a)) if both_float else e == a:
                return None
        elif e == a or (math.isnan(e) and math.isnan(a)) or (math.isfinite(e - a)  # inf and -inf are not close
                                                              and abs(e - a) <= atol + rtol * abs(e)):
            return None
        difference = abs(e - a)
        relative = difference / abs(e) if e else math.inf
        message = mismatch_message("Scalars", f"Expected {format_number(expected)} but got {format_number(actual)}.",
                                   difference, None, relative, None, rtol, atol)
        return Mismatch("", message, json_safe(e), json_safe(a))
    if expected == actual:
        return None
    if numbers:
        assert isinstance(expected, int) and isinstance(actual, int)
        difference = abs(expected - actual)
        message = mismatch_message("Scalars", f"Expected {expected} but got {actual}.", difference, None,
                                   difference / abs(expected) if expected else math.inf, None, 0.0, 0.0)
        return Mismatch("", message, expected, actual)
    return Mismatch("", f"Values are not equal!\n\nExpected {expected!r} but got {actual!r}.", json_safe(expected),
                    json_safe(actual))


def _type_name(value: Leaf) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor[{str(value.dtype).removeprefix('torch.')}]"
    if isinstance(value, Digest):
        return f"Tensor[{value.dtype}]"
    return type(value).__name__


def _summary(value: Leaf) -> JsonValue:
    if isinstance(value, (torch.Tensor, Digest)):
        return f"{_type_name(value)} of shape {list(value.shape)}"
    return json_safe(value)


#: the leaves of empty containers (snapshots flatten containers into their elements' paths)
EMPTY_DICT, EMPTY_SEQUENCE = "<empty dict>", "<empty sequence>"


def _filled_elsewhere(path: str, value: Leaf, other: Mapping[str, Leaf]) -> bool:
    """An empty container at `path` whose counterpart has elements: those elements' paths say what differs."""
    if value not in (EMPTY_DICT, EMPTY_SEQUENCE):
        return False
    prefix = f"{path}."
    return any(p.startswith(prefix) for p in other)


def compare_snapshots(
    expected: Mapping[str, Leaf], actual: Mapping[str, Leaf], comparison: Comparison
) -> Iterator[Mismatch]:
    """Yield one Mismatch per differing path, in the expected snapshot's order, then extra paths; paths the
    comparison ignores are passed over."""
    for path, value in expected.items():
        if comparison.ignore and ignored(path, comparison.ignore):
            continue
        if path not in actual:
            if not _filled_elsewhere(path, value, actual):
                yield Mismatch(path, "The entry is missing.", _summary(value), None)
            continue
        mismatch = compare_leaves(value, actual[path], comparison)
        if mismatch is not None:
            yield dataclasses.replace(mismatch, path=path)
    for path, value in actual.items():
        if path not in expected and not _filled_elsewhere(path, value, expected) and not (
                comparison.ignore and ignored(path, comparison.ignore)):
            yield Mismatch(path, "The entry is unexpected.", None, _summary(value))
