"""The comparator cases of a peer suite, asked of our comparison.

TrainParity 0.1.0's test suite (its `tests/test_comparison.py` and `tests/test_snapshot.py`) probes a
comparator with these cases; each is restated here against trainparity's State walk and comparison. Where
trainparity decides otherwise by design, the test pins trainparity's decision and says why:
- a list and a tuple of the same values are the same state (checkpoints and JSON turn tuples into lists);
- device and `requires_grad` are not compared: a snapshot holds values (a resume may load onto another
  device; `check_frozen` judges what may train);
- a tolerance always takes NaN as equal to NaN (torch.testing's `equal_nan=True`), and exact comparison
  is bitwise, so NaNs with other payloads differ;
- a sparse tensor is compared by its values, not set aside.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
import torch

import trainparity as tp
from trainparity._state._compare import EXACT, Comparison, Mismatch, bitwise_equal, compare_snapshots, compare_tensors
from trainparity._state._snapshot import snapshot_state

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def mismatches(expected: Any, actual: Any, comparison: Comparison = EXACT, **entries: Any) -> list[Mismatch]:
    """How the State entry `extra` (beside `entries`) holding `expected` differs from one holding `actual`."""
    return list(compare_snapshots(snapshot_state(tp.State(extra=expected, **entries)),
                                  snapshot_state(tp.State(extra=actual, **entries)), comparison))


def test_a_clean_nested_dict_list_tuple_has_no_false_positive() -> None:
    state = {"nested": {"items": [1, None, ("x", 0.0)]}}
    assert mismatches(state, state) == []


@pytest.mark.parametrize(("expected", "actual", "path", "says"), [
    ({"a": 1}, {}, "extra.a", "The entry is missing."),
    ({}, {"a": 1}, "extra.a", "The entry is unexpected."),
    (None, 0, "extra", "The types do not match: NoneType != int."),
    ([], [0], "extra", "The types do not match: str != Tensor[int64]."),
    (True, 1, "extra", "The types do not match: bool != int."),
])
def test_missing_none_empty_zero_and_structure_are_distinct(expected: Any, actual: Any, path: str, says: str) -> None:
    found = mismatches(expected, actual)
    assert [(m.path, m.message) for m in found] == [(path, says)]
    assert repr(found[0].expected) != repr(found[0].actual)


def test_a_list_and_a_tuple_of_the_same_values_are_the_same_state() -> None:
    assert mismatches([], ()) == []
    assert mismatches([1, "a"], (1, "a")) == []


def test_the_same_value_at_another_path_is_reported_at_the_first_path() -> None:
    assert [(m.path, m.message) for m in mismatches({"a": 1}, {"b": 1})] == [
        ("extra.a", "The entry is missing."), ("extra.b", "The entry is unexpected.")]


@pytest.mark.parametrize(("expected", "actual", "says"), [
    (torch.ones(2), torch.ones(3),
     "The values for attribute 'shape' do not match: torch.Size([2]) != torch.Size([3])."),
    (torch.ones(2), torch.ones(2, dtype=torch.float64),
     "The values for attribute 'dtype' do not match: torch.float32 != torch.float64."),
    (torch.tensor([1.0]), torch.tensor([2.0]), "Tensor-likes are not equal!"),
])
def test_tensor_shape_dtype_and_values_are_told_apart(expected: torch.Tensor, actual: torch.Tensor, says: str) -> None:
    found = mismatches(expected, actual)
    assert [m.path for m in found] == ["extra"] and found[0].message.startswith(says)


def test_requires_grad_is_not_state() -> None:
    assert mismatches(torch.tensor([1.0]), torch.tensor([1.0], requires_grad=True)) == []


def test_exact_tells_signed_zeros_apart_and_a_tolerance_does_not() -> None:
    assert [m.path for m in mismatches(0.0, -0.0)] == ["extra"]
    assert [m.path for m in mismatches(torch.tensor([0.0]), torch.tensor([-0.0]))] == ["extra"]
    zero_tolerance = tp.ToleranceComparison(rtol=0, atol=0)
    assert mismatches(0.0, -0.0, zero_tolerance) == []
    assert mismatches(torch.tensor([0.0]), torch.tensor([-0.0]), zero_tolerance) == []


def test_nan_and_infinities() -> None:
    assert mismatches(math.nan, math.nan) == []
    other_nan = struct.unpack(">d", bytes.fromhex("7ff8000000000001"))[0]
    assert [m.path for m in mismatches(math.nan, other_nan)] == ["extra"]  # exact is bitwise
    assert mismatches(math.nan, other_nan, tp.ToleranceComparison(rtol=0, atol=0)) == []
    assert [m.path for m in mismatches(math.inf, -math.inf)] == ["extra"]
    assert [m.path for m in mismatches(math.inf, -math.inf, tp.ToleranceComparison(rtol=1, atol=1))] == ["extra"]


def test_tensors_with_nan_inf_and_empty_under_exact_and_tolerance() -> None:
    expected = {"x": torch.tensor([math.nan, math.inf, 1.0]), "empty": torch.empty(0)}
    actual = {"x": torch.tensor([math.nan, math.inf, 1.00001]), "empty": torch.empty(0)}
    assert [m.path for m in mismatches(expected, actual)] == ["extra.x"]
    assert [m.path for m in mismatches(expected, actual, tp.ToleranceComparison(rtol=0, atol=0))] == ["extra.x"]
    assert mismatches(expected, actual, tp.ToleranceComparison(rtol=1e-4, atol=0)) == []


def test_a_tolerance_reports_the_numerical_error() -> None:
    tolerance = tp.ToleranceComparison(rtol=1e-4, atol=1e-6)
    (found,) = mismatches(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]), tolerance)
    assert "Greatest absolute difference: 1.0 at index (1,) (up to 1e-06 allowed)" in found.message
    assert "Greatest relative difference: 0.5 at index (1,) (up to 0.0001 allowed)" in found.message


def test_integer_tensors_stay_exact_under_a_tolerance() -> None:
    (found,) = mismatches(torch.tensor([1]), torch.tensor([2]), tp.ToleranceComparison(rtol=1, atol=1))
    assert found.path == "extra" and found.message.startswith("Tensor-likes are not equal!")


@pytest.mark.parametrize(("rtol", "atol"), [(-1.0, 0.0), (0.0, -1.0), (math.inf, 0), (math.nan, 0)])
def test_invalid_tolerances_are_refused(rtol: float, atol: float) -> None:
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        tp.ToleranceComparison(rtol=rtol, atol=atol)


def test_a_missing_entry_none_and_an_empty_one_are_distinct() -> None:
    model = torch.nn.Linear(2, 1)
    without = snapshot_state(tp.State(model=model))
    for extra in ({"scheduler": None}, {"extra": {}}, {"extra": []}):
        found = compare_snapshots(without, snapshot_state(tp.State(model=model, **extra)), EXACT)
        assert [(m.path, m.message) for m in found] == [(next(iter(extra)), "The entry is unexpected.")]


def test_a_sparse_tensor_is_compared_by_its_values() -> None:
    sparse = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (2,))
    assert mismatches(sparse, sparse.to_dense()) == []
    assert [m.path for m in mismatches(sparse, sparse * 2)] == ["extra"]


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float16, torch.float32, torch.float64,
                                   torch.complex128])
def test_a_strided_view_is_compared_by_its_values(dtype: torch.dtype) -> None:
    """A view with stride 2 (no flat view of its bytes exists; a 16-byte complex has no integer view at all)."""
    view = torch.arange(1, 13).to(dtype)[::2]
    assert bitwise_equal(view, view.clone()) and compare_tensors(view, view.clone(), EXACT) is None
    changed = view.clone()
    changed[1] = 0
    assert not bitwise_equal(view, changed)
    mismatch = compare_tensors(view, changed, EXACT)
    assert mismatch is not None and "Mismatched elements: 1 / 6" in mismatch.message, mismatch
