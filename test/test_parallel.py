"""check_data_parallel on DTensor parallelism: FSDP2 and tensor parallel on a CPU mesh (gloo)."""

from __future__ import annotations

import pytest
from parallel_recipes import FSDPRecipe, TPRecipe

import trainparity as tp


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_trains_like_one_process(world_size: int) -> None:
    result = tp.check_data_parallel(FSDPRecipe(), world_size=world_size, steps=2, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.parametrize(("fault", "cause"), [("root_unsharded", "grads_not_synchronized"),
                                              ("divide_factor_1", "loss_not_averaged")])
def test_fsdp2_faults_are_named(fault: str, cause: str) -> None:
    result = tp.check_data_parallel(FSDPRecipe(fault), world_size=2, steps=2, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.cause, first.step) == (cause, 1), result.report()
    # gathered values under the unsharded model's paths
    assert first.path in {"gradients.embed.weight", "gradients.embed.bias", "gradients.head.weight",
                          "gradients.head.bias"}, result.report()


def test_tensor_parallel_ranks_reading_the_same_batch_train_like_one_process() -> None:
    result = tp.check_data_parallel(TPRecipe(), world_size=2, steps=2, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


def test_tensor_parallel_ranks_reading_different_batches_fail_on_the_data() -> None:
    result = tp.check_data_parallel(TPRecipe("rank_seeded_shuffle"), world_size=2, steps=2, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert first.path == "data.sample_ids", result.report()
