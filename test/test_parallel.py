"""check_parallel on DTensor parallelism: FSDP2 and tensor parallel on a CPU mesh (gloo), and the module
outputs the tensor-parallel diagnosis records."""

from __future__ import annotations

import pytest
import torch
from parallel_recipes import FSDPRecipe, TensorParallelMLP
from torch import nn
from torch.distributed.fsdp import FSDPModule

import trainparity as tp
from trainparity._parallel import _rank
from trainparity._parallel._rank import OutputRecorder

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_trains_like_one_process(world_size: int) -> None:
    result = tp.check_parallel(FSDPRecipe(), world_size=world_size, steps=2, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


#: torch 2.7's FSDP2 has only set_reduce_scatter_divide_factor, an NCCL premul-sum that gloo never applies
DIVIDE_FACTOR = pytest.mark.skipif(not hasattr(FSDPModule, "set_gradient_divide_factor"),
                                   reason="this torch's FSDP2 cannot set the gradient divide factor on CPU")


@pytest.mark.parametrize(("fault", "cause"), [("root_unsharded", "grads_not_synchronized"),
                                              pytest.param("divide_factor_1", "loss_not_averaged",
                                                           marks=DIVIDE_FACTOR)])
def test_fsdp2_faults_are_named(fault: str, cause: str) -> None:
    result = tp.check_parallel(FSDPRecipe(fault), world_size=2, steps=2, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.cause, first.step) == (cause, 1), result.report()
    # gathered values under the unsharded model's paths
    assert first.path in {"gradients.embed.weight", "gradients.embed.bias", "gradients.head.weight",
                          "gradients.head.bias"}, result.report()


def test_shards_read_by_equal_groups_of_peers_are_judged_once_per_group() -> None:
    from trainparity._parallel._shards import shard_violations

    batch = [1, 2, 3, 4]
    assert shard_violations(1, batch, [[1, 2], [1, 2], [3, 4], [3, 4]]) == []
    # every rank on the same half, or groups of unequal size: the shards are judged rank by rank
    assert [v.cause for v in shard_violations(1, batch, [[1, 2]] * 4)][:1] == ["rank_shard_overlap"]
    assert shard_violations(1, batch, [[1, 2], [1, 2], [3, 4], [4, 3]]) != []
    assert [v.cause for v in shard_violations(1, batch, [[1, 2], [1, 2], [2, 3], [2, 3]])][:1] == [
        "rank_shard_overlap"]


def test_tensor_parallel_ranks_reading_the_same_batch_train_like_one_process() -> None:
    result = tp.check_parallel(TensorParallelMLP(), world_size=2, steps=2, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


def test_tensor_parallel_ranks_reading_different_batches_fail_on_the_data() -> None:
    result = tp.check_parallel(TensorParallelMLP("rank_seeded_shuffle"), world_size=2, steps=2, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert first.path == "data.sample_ids", result.report()


def test_unreduced_row_parallel_output_is_named() -> None:
    result = tp.check_parallel(TensorParallelMLP("missing_reduction"), world_size=2, steps=2, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.kind, first.cause, first.step) == (
        "outputs.model.down", "output_mismatch", "tp_partial_not_reduced", 1), result.report()
    assert first.message.startswith("model.down (Linear) returned other values on rank 0 than in the reference, and "
                                    "the ranks' outputs sum to the reference's: its output on each rank is a partial "
                                    "sum that was never all-reduced"), result.report()
    # what follows from it in the same step carries the same cause
    assert {v.cause for v in result.violations if v.step == 1} == {"tp_partial_not_reduced"}


def test_unreduced_input_gradient_names_the_layer_with_partial_gradients() -> None:
    result = tp.check_parallel(TensorParallelMLP("missing_grad_reduction"), world_size=2, steps=1, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.rank, first.cause) == ("gradients.embed.weight", 1, "tp_partial_not_reduced")
    assert "the gradients of model.embed (Linear) on each rank are a partial sum" in first.message
    assert "model.up (Linear), the first sharded layer after it" in first.message
    assert not any(v.path.startswith("outputs.") for v in result.violations), result.report()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.fc(self.fc(x)), "ids": torch.arange(3)}


def test_outputs_are_recorded_in_the_order_modules_finish_and_hooks_are_removed() -> None:
    model = nn.Sequential(Block(), nn.Tanh())
    with OutputRecorder({"model": model}) as recorder:
        model[1](model[0](torch.randn(2, 3))["out"])
        first = recorder.take()
        model[0](torch.randn(2, 3))
        second = recorder.take()
    assert [(o.key, o.module, o.shape) for o in first] == [
        ("model.0.fc", "model.0.fc (Linear)", [2, 3]),
        ("model.0.fc#2", "model.0.fc (Linear)", [2, 3]),
        ("model.0.out", "model.0 (Block)", [2, 3]),  # integer outputs are not kept
        ("model.1", "model.1 (Tanh)", [2, 3]),
    ]
    assert [o.key for o in second] == ["model.0.fc", "model.0.fc#2", "model.0.out"]  # calls count per step
    assert all(not module._forward_hooks for module in model.modules())


def test_large_outputs_are_sampled_and_the_record_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rank, "OUTPUT_LIMIT", 3)
    layer = nn.Identity()
    with OutputRecorder({"layer": layer}) as recorder:
        for _ in range(5):
            layer(torch.arange(10_000.0).reshape(100, 100))
        outputs = recorder.take()
    assert len(outputs) == 3
    assert (outputs[0].stride, outputs[0].shape, outputs[0].values.dtype) == (3, [100, 100], torch.float64)
    assert torch.equal(outputs[0].values, torch.arange(0.0, 10_000.0, 3.0, dtype=torch.float64))
