"""Reports and JSON: deterministic, ASCII, no trailing spaces, nothing machine-specific."""

from __future__ import annotations

import json
import unittest.mock

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from resume_recipes import ResumeRecipe

import trainparity as tp
from trainparity._results._report import ascii_text
from trainparity._state import _compare
from trainparity._state._compare import compare_leaves, compare_tensors, tensors_agree

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def test_json_is_deterministic_and_complete() -> None:
    first = tp.check_resume(ResumeRecipe(fault="scheduler"), steps=4, resume_at=2, timeout=60)
    second = tp.check_resume(ResumeRecipe(fault="scheduler"), steps=4, resume_at=2, timeout=60)
    assert first.to_json() == second.to_json()
    assert first.report() == second.report()
    document = json.loads(first.to_json())
    assert document["schema_version"] == 1
    assert document["trainparity_version"] == tp.__version__
    assert document["outcome"] == "FAIL"
    assert document["first_violation"]["path"] == "scheduler.last_epoch"
    assert document["first_violation"]["cause"] == "not_restored"
    assert document["counts"] == first.counts
    assert list(document) == sorted(document)
    assert "environment" not in document
    assert "environment" in json.loads(first.to_json(include_environment=True))


def test_report_is_ascii_without_trailing_spaces() -> None:
    result = tp.check_resume(ResumeRecipe(fault="data_replay"), steps=4, resume_at=2, timeout=60)
    text = result.report()
    assert text.isascii()
    assert all(line == line.rstrip() for line in text.splitlines())
    assert ascii_text("caf\u00e9  \nx") == "caf\\xe9\nx"


def _torch_message(actual: torch.Tensor, expected: torch.Tensor, **tolerance: float) -> str:
    try:
        torch.testing.assert_close(actual, expected, **tolerance)  # type: ignore[arg-type]
    except AssertionError as error:
        return str(error)
    raise AssertionError("torch.testing found no mismatch")


# Inputs whose differences print with at most 6 significant digits, where our text must be torch's.
SAME_TEXT = [
    (torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.5, 3.0, 4.25]), {"rtol": 0.0, "atol": 0.0}),
    (torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.5, 3.0, 4.25]), {"rtol": 1.3e-6, "atol": 1e-5}),
    # the greatest absolute and relative differences lie at different indices
    (torch.tensor([[100.0, 1.0], [2.0, 8.0]]), torch.tensor([[104.0, 2.0], [2.0, 8.0]]), {"rtol": 0.01, "atol": 0.5}),
    (torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]), {"rtol": 0.0, "atol": 0.0}),
    (torch.tensor(2.0), torch.tensor(3.0), {"rtol": 0.0, "atol": 0.0}),
    (torch.tensor(2.0), torch.tensor(3.0), {"rtol": 1e-3, "atol": 1e-2}),
    (torch.tensor([0.0, 1.0]), torch.tensor([0.5, 1.0]), {"rtol": 0.0, "atol": 0.0}),
]


@pytest.mark.parametrize(("expected", "actual", "tolerance"), SAME_TEXT)
def test_mismatch_text_is_torch_testings(expected: torch.Tensor, actual: torch.Tensor,
                                         tolerance: dict[str, float]) -> None:
    comparison = (tp.ExactComparison() if not any(tolerance.values()) else
                  tp.ToleranceComparison(rtol=tolerance["rtol"], atol=tolerance["atol"]))
    mismatch = compare_tensors(expected, actual, comparison)
    assert mismatch is not None
    assert mismatch.message == _torch_message(actual, expected, **tolerance)


def test_scalar_text_is_torch_testings() -> None:
    mismatch = compare_leaves(2.0, 3.5, tp.ToleranceComparison(rtol=1e-3, atol=1e-2))
    assert mismatch is not None
    assert mismatch.message == _torch_message(torch.tensor(3.5), torch.tensor(2.0), rtol=1e-3, atol=1e-2)


def test_long_numbers_are_rounded_to_six_digits() -> None:
    mismatch = compare_tensors(torch.tensor([1.0]), torch.tensor([1.0 + 1 / 3]), tp.ExactComparison())
    assert mismatch is not None and "Greatest absolute difference: 0.333333 at index (0,)" in mismatch.message


def test_exact_comparison_is_bitwise() -> None:
    zero = compare_tensors(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), tp.ExactComparison())
    assert zero is not None and "bits differ" in zero.message and "Mismatched elements: 1 / 2" in zero.message
    assert compare_leaves(0.0, -0.0, tp.ExactComparison()) is not None
    assert compare_leaves(0.0, -0.0, tp.ToleranceComparison(rtol=0.0, atol=0.0)) is None
    nan = torch.tensor([float("nan")])
    assert compare_tensors(nan, nan.clone(), tp.ExactComparison()) is None
    assert compare_tensors(torch.tensor([1.5]), torch.tensor([1.5]), tp.ExactComparison()) is None


def test_tolerance_applies_to_floats_only() -> None:
    loose = tp.ToleranceComparison(rtol=0.0, atol=1.0)
    assert compare_tensors(torch.tensor([1.0]), torch.tensor([1.5]), loose) is None
    assert compare_tensors(torch.tensor([1]), torch.tensor([2]), loose) is not None
    assert compare_leaves(1.0, 1.5, loose) is None
    assert compare_leaves(3, 4, loose) is not None
    nan = compare_tensors(torch.tensor([float("nan")]), torch.tensor([float("nan")]), tp.ExactComparison())
    assert nan is None
    shape = compare_tensors(torch.zeros(2), torch.zeros(3), tp.ExactComparison())
    assert shape is not None and "attribute 'shape' do not match" in shape.message


def test_tolerance_is_validated() -> None:
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        tp.ToleranceComparison(rtol=-1.0, atol=0.0)
    with pytest.raises(TypeError, match="must be a number"):
        tp.ToleranceComparison(rtol="0.1", atol=0.0)  # type: ignore[arg-type]


#: the chunk of `_all_close` in this test: the chunking is the same code at any size, and examples past the
#: second chunk stay small (at the real chunk, 2**18, they took 28 s of the suite)
CHUNK = 16

SPECIAL = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.0, 1.5, 2.0, 1e-7, 2e-7, 3e38, 1e300]


@settings(deadline=None, max_examples=300)
@given(
    dtype=st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16]),
    pairs=st.lists(st.tuples(st.sampled_from(SPECIAL) | st.floats(-4, 4), st.sampled_from(SPECIAL) | st.floats(-4, 4)),
                   min_size=1, max_size=6),
    tolerance=st.sampled_from([(0.0, 0.0), (1e-7, 1e-7), (0.5, 0.25), (0.0, 1.0), (2.0, 0.0)]),
    position=st.sampled_from([0, CHUNK - 3, 2 * CHUNK + 1]),
)
@example(dtype=torch.float64, pairs=[(1.0, 1.5)], tolerance=(0.0, 0.5), position=0)  # exactly at the bound
@example(dtype=torch.float64, pairs=[(1.0, float("inf"))], tolerance=(2.0, 0.0), position=0)  # infinite allowance
@example(dtype=torch.float64, pairs=[(float("nan"), float("nan"))], tolerance=(1e-7, 1e-7), position=0)
def test_tolerance_verdict_is_torch_isclose(dtype: torch.dtype, pairs: list[tuple[float, float]],
                                            tolerance: tuple[float, float], position: int) -> None:
    """The chunked short cut of compare_tensors (and of tensors_agree, which answers without describing the
    mismatch) agrees with torch.isclose(equal_nan=True) on every element, also past the first chunk."""
    filler = torch.linspace(-3, 3, position + len(pairs), dtype=torch.float64)
    expected, actual = filler.clone(), filler.clone()
    expected[position:] = torch.tensor([e for e, _ in pairs], dtype=torch.float64)
    actual[position:] = torch.tensor([a for _, a in pairs], dtype=torch.float64)
    expected, actual = expected.to(dtype), actual.to(dtype)
    rtol, atol = tolerance
    close = bool(torch.isclose(expected, actual, rtol=rtol, atol=atol, equal_nan=True).all())
    with unittest.mock.patch.object(_compare, "_CLOSE_CHUNK", CHUNK):
        mismatch = compare_tensors(expected, actual, tp.ToleranceComparison(rtol=rtol, atol=atol))
        agree = tensors_agree(expected, actual, tp.ToleranceComparison(rtol=rtol, atol=atol))
    assert (mismatch is None) == close, mismatch
    assert agree == close
