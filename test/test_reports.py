"""Reports and JSON: deterministic, ASCII, no trailing spaces, nothing machine-specific."""

from __future__ import annotations

import json

import torch
from resume_recipes import ResumeRecipe

import trainparity as tp
from trainparity._compare import compare_leaves, compare_tensors
from trainparity._report import ascii_text


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


def test_tensor_mismatch_message_follows_torch_testing() -> None:
    mismatch = compare_tensors(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.5, 3.0, 4.25]),
                               tp.ExactComparison())
    assert mismatch is not None
    assert mismatch.message == (
        "Tensor-likes are not equal!\n\n"
        "Mismatched elements: 2 / 4 (50.0%)\n"
        "Greatest absolute difference: 0.5 at index (1,) (up to 0 allowed)\n"
        "Greatest relative difference: 0.25 at index (1,) (up to 0 allowed)"
    )
    assert (mismatch.expected, mismatch.actual) == (2.0, 2.5)


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
    import pytest

    with pytest.raises(ValueError, match="must be finite and >= 0"):
        tp.ToleranceComparison(rtol=-1.0, atol=0.0)
    with pytest.raises(TypeError, match="must be a number"):
        tp.ToleranceComparison(rtol="0.1", atol=0.0)  # type: ignore[arg-type]
