"""Digests: large tensors travel as digests, equal exactly when their bytes are, and reports still show values."""

from __future__ import annotations

import pathlib

import pytest
import torch
from tensor_kinds import dtypes
from wide_recipes import Tabled, Wide

import trainparity as tp
from trainparity._recipe._reference import resolve_recipe
from trainparity._resume._trace import TrainPayload, train_run
from trainparity._state import _digest
from trainparity._state._compare import DIGESTS_DIFFER
from trainparity._state._digest import DIGEST_ABOVE_BYTES, Digest, digest
from trainparity._state._snapshot import STEP_WHOLE_BYTES, Digesting, snapshot_state

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


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


def _bytes_of(dtype: torch.dtype, count: int, seed: int) -> torch.Tensor:
    """`count` elements of `dtype` as random bytes (every bit pattern, NaNs included: the digest reads bytes)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count * dtype.itemsize,), dtype=torch.uint8, generator=generator)


def _changed_bytes(raw: torch.Tensor, change: str, dtype: torch.dtype) -> torch.Tensor:
    """A copy of `raw` (the bytes of 64x64 elements of `dtype`) with one structured change a linear digest misses."""
    other = raw.clone()
    if change == "negated":  # the sign bit of every element: -x for every float dtype
        other.view(-1, dtype.itemsize)[:, -1] ^= 0x80
    elif change == "word rectangle":  # +d, -d, -d, +d at the corners of a rectangle of 64-bit words
        words = other.view(torch.int64).view(-1, 64)
        words[0, 0] += 12345
        words[0, 9] -= 12345
        words[3, 0] -= 12345
        words[3, 9] += 12345
    elif change == "swapped blocks":
        rows = other.view(-1, 512)
        first = rows[0].clone()
        rows[0] = rows[-1]
        rows[-1] = first
    elif change == "transposed":
        elements = other.view(64, 64, dtype.itemsize)
        other = elements.transpose(0, 1).contiguous().view(-1)
    else:  # one flipped bit
        other[len(other) // 3] ^= 0x04
    return other


@pytest.mark.parametrize("change", ["negated", "word rectangle", "swapped blocks", "transposed", "one flipped bit"])
@pytest.mark.parametrize("dtype", sorted(dtypes().values(), key=str), ids=str)
def test_structured_changes_of_the_bytes_change_the_digest_for_every_dtype(dtype: torch.dtype, change: str) -> None:
    """The round-3 digest (sums of 64-bit words by row and column) was linear: each of these left it unchanged for
    some dtype (a negated float64 tensor for all of them). A hash of the bytes tells them all apart."""
    raw = _bytes_of(dtype, 64 * 64, seed=7)
    other = _changed_bytes(raw, change, dtype)
    assert not torch.equal(raw, other)
    tensor, changed = raw.view(dtype).view(64, 64), other.view(dtype).view(64, 64)
    assert digest(tensor) != digest(changed)
    assert digest(tensor) == digest(raw.clone().view(dtype).view(64, 64))


def test_a_large_tensor_is_hashed_in_chunks_on_threads_with_the_same_digest_as_on_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = _digest._THREADED_FROM_CHUNKS + 2
    tensor = _bytes_of(torch.float64, chunks * _digest._CHUNK_BYTES // 8 + 5, seed=3).view(torch.float64)
    threaded = digest(tensor)
    monkeypatch.setattr(_digest, "_threads", lambda: 1)
    assert digest(tensor) == threaded
    swapped = tensor.clone()
    block = _digest._CHUNK_BYTES // 8
    swapped[:block], swapped[block:2 * block] = tensor[block:2 * block].clone(), tensor[:block].clone()
    assert digest(swapped) != threaded  # two whole chunks swapped: their hashes are taken in order
    assert digest(-tensor) != threaded
    last = tensor.clone()
    last[-1] = torch.nextafter(last[-1], torch.tensor(float("inf"), dtype=torch.float64))
    assert digest(last) != threaded


@pytest.mark.parametrize("negate", [False, True])
def test_a_large_table_loaded_negated_is_not_restored_at_its_path(negate: bool) -> None:
    """A 512 KiB float64 table (digested) that `load()` returns negated: the round-3 digest passed it."""
    result = tp.check_resume(Tabled("table_negated" if negate else None), steps=4, resume_at=2, timeout=120)
    if not negate:
        assert result.outcome is tp.Outcome.PASS, result.report()
        return
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.cause) == ("table", "not_restored"), result.report()


def test_a_step_keeps_a_budget_of_small_tensors_whole_and_the_save_every_small_tensor(tmp_path: pathlib.Path) -> None:
    """What the parent holds per step is bounded: large tensors as digests, small ones whole up to STEP_WHOLE_BYTES
    (the report shows their values without training again); the save, once per run, ships every small tensor whole."""
    payload = TrainPayload(resolve_recipe(Wide()), 0, 1, 2, str(tmp_path / "checkpoint"), save=True, digests=True)
    trace = train_run(payload, tmp_path)
    step = trace.steps[-1]
    assert isinstance(step.state["model.0.weight"], Digest)  # 512 KiB
    assert isinstance(step.state["model.0.bias"], torch.Tensor)  # 2 KiB
    assert isinstance(step.rng["rng.torch"], torch.Tensor)
    assert trace.saved is not None
    assert isinstance(trace.saved.state["model.0.weight"], Digest)
    assert isinstance(trace.saved.state["model.0.bias"], torch.Tensor)
    assert torch.finfo(torch.float64).bits // 8 * 256 * 256 > DIGEST_ABOVE_BYTES


def test_the_budget_of_a_step_digests_small_tensors_past_it_in_the_walk_s_order() -> None:
    state = tp.State(**{f"t{i:03d}": torch.full((512,), float(i), dtype=torch.float64) for i in range(100)})  # 4 KiB
    step = snapshot_state(state, Digesting.at((), 1, every_step=True))
    whole = [path for path, value in step.items() if isinstance(value, torch.Tensor)]
    assert whole == [f"t{i:03d}" for i in range(STEP_WHOLE_BYTES // 4096)], whole
    assert all(isinstance(step[f"t{i:03d}"], Digest) for i in range(len(whole), 100))
    shipped = Digesting.at(((1, ("t099",)),), 1, every_step=True)  # a path asked for whole is whole, past the budget
    assert isinstance(snapshot_state(state, shipped)["t099"], torch.Tensor)
    saved = snapshot_state(state, Digesting.at((), 0, every_step=True))  # the load and the save: by size alone
    assert all(isinstance(value, torch.Tensor) for value in saved.values())


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
