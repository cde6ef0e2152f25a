"""Digests: large tensors travel as digests, equal exactly when their bytes are, and reports still show values."""

from __future__ import annotations

import pathlib

import pytest
import torch
from wide_recipes import Wide

import trainparity as tp
from trainparity._recipe._reference import resolve_recipe
from trainparity._resume._trace import RunTrace, TrainPayload, train_run
from trainparity._state._compare import DIGESTS_DIFFER
from trainparity._state._digest import DIGEST_ABOVE_BYTES, Digest, digest

pytestmark = pytest.mark.numeric


def test_equal_bytes_give_equal_digests_whatever_the_layout_and_thread_count() -> None:
    tensor = torch.randn(300, 301)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = digest(tensor)
    finally:
        torch.set_num_threads(threads)
    assert digest(tensor) == one == digest(tensor.clone()) == digest(tensor.t().contiguous().t())
    assert digest(tensor.t()) != digest(tensor.t().contiguous().t())  # other shape, other digest


@pytest.mark.parametrize("change", ["one element", "swap in a row", "swap in a column", "sign of zero", "last byte",
                                    "dtype", "shape"])
def test_any_change_of_the_bytes_changes_the_digest(change: str) -> None:
    tensor = torch.randn(128, 64)
    tensor[5, 7] = 0.0
    other = tensor.clone()
    if change == "one element":
        other[100, 3] = torch.nextafter(other[100, 3], torch.tensor(10.0))
    elif change == "swap in a row":
        other[2, 1], other[2, 9] = tensor[2, 9], tensor[2, 1]
    elif change == "swap in a column":
        other[1, 4], other[90, 4] = tensor[90, 4], tensor[1, 4]
    elif change == "sign of zero":
        other[5, 7] = -0.0
    elif change == "last byte":
        other = torch.randn(1001)
        tensor = other.clone()
        other[-1] = -other[-1]
    elif change == "dtype":
        other = tensor.view(torch.int32)
    else:
        other = tensor.reshape(64, 128)
    assert digest(tensor) != digest(other)


def test_a_step_travels_as_digests_alone_and_the_save_keeps_its_small_tensors_whole(tmp_path: pathlib.Path) -> None:
    """What the parent holds per step is digests, whatever the tensors' sizes (its memory does not grow with the
    steps beyond them); the save, once per run, ships small tensors whole."""
    payload = TrainPayload(resolve_recipe(Wide()), 0, 1, 2, str(tmp_path / "checkpoint"), save=True, digests=True)
    trace = RunTrace.from_wire(train_run(payload, tmp_path))
    step = trace.steps[-1]
    tensors = [value for value in [*step.state.values(), *step.rng.values()]
               if not isinstance(value, (bool, int, float, str, type(None)))]
    assert tensors and all(isinstance(value, Digest) for value in tensors), step
    assert trace.saved is not None
    assert isinstance(trace.saved.state["model.0.weight"], Digest)  # 512 KiB
    assert isinstance(trace.saved.state["model.0.bias"], torch.Tensor)  # 2 KiB
    assert isinstance(trace.saved.rng["rng.torch"], torch.Tensor)
    assert torch.finfo(torch.float64).bits // 8 * 256 * 256 > DIGEST_ABOVE_BYTES


@pytest.mark.parametrize(("fault", "path", "step"), [("weight", "model.0.weight", 3),
                                                     ("moments", "optimizer.state.0.weight.exp_avg", 3),
                                                     ("data_skip", "data.sample_ids", 4)])
def test_a_failing_check_reports_the_values_of_the_first_divergent_tensors(fault: str, path: str, step: int) -> None:
    result = tp.check_resume(Wide(fault), steps=6, resume_at=3, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.step) == (path, step), result.report()
    shown = [v for v in result.violations if v.step == first.step]
    assert all(DIGESTS_DIFFER not in v.message for v in shown), result.report()
    assert any("Mismatched elements: " in v.message for v in shown if v.path.startswith("model.0.weight")
               or v.path.startswith("optimizer.state.0.weight")), result.report()
    assert any(DIGESTS_DIFFER in v.message for v in result.violations if v.step == 6)  # later ones stay digests


def test_a_passing_wide_check_passes() -> None:
    assert tp.check_resume(Wide(), steps=4, resume_at=2, timeout=120).outcome is tp.Outcome.PASS
