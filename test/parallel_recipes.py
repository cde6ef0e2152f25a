"""Recipes sharded with FSDP2 (`fully_shard`) and tensor parallelism (`parallelize_module`) on a CPU mesh.

`FSDPRecipe(fault=...)`: an embedding-like input layer, blocks sharded layer by layer, a head, and
the root sharded last, as torchtitan does; `root_unsharded` leaves the root out (its own layers keep
per-rank gradients that are never reduced), `divide_factor_1` sums the gradients where the full batch
takes a mean. The tensor-parallel recipe is the example `examples/tp_mlp.py`; `TwoDimRecipe` puts its
MLP on a 2x2 mesh.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from regression_recipe import RegressionRecipe
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainparity as tp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from tp_mlp import MLP, TensorParallelMLP, parallelize  # noqa: E402  (the example's directory goes first)

__all__ = ["FSDPRecipe", "MegatronRecipe", "TensorParallelMLP", "ThreeDimRecipe", "TwoDimRecipe", "WideDDPRecipe"]


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.arange(32), torch.randn(32, 6, generator=generator),
                         torch.randn(32, 2, generator=generator))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.blocks = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.tanh(self.blocks(self.embed(x))))
        return out


class ParallelRecipe(RegressionRecipe):
    def __init__(self, fault: str | None = None) -> None:
        self.fault = fault



class FSDPRecipe(ParallelRecipe):
    def setup(self) -> tp.State:
        world, rank = dist.get_world_size(), dist.get_rank()
        mesh = init_device_mesh("cpu", (world,))
        model = Net()
        for layer in model.blocks:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        if self.fault != "root_unsharded":
            fully_shard(model, mesh=mesh)
        if self.fault == "divide_factor_1":
            model.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        data = dataset()
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
        loader = DataLoader(data, batch_size=8 // world, sampler=sampler)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), loader=loader)


class TwoDimRecipe(ParallelRecipe):
    """A (world / tp) x tp mesh (2x2 at four ranks): tensor parallel within each row (`tp`), FSDP2 across rows
    (`dp`). The ranks of a tensor-parallel group read the same shard of the global batch; the groups split it.
    `tp_rank_in_sampler` shards the data by the global rank, so the peers of a group read different samples;
    `loss_divided_by_tp` averages the loss over the tp peers as well, who read the same samples. `clip` clips the
    gradients by the norm of the whole gradients ("global") or, a bug, of each rank's own shards ("local").
    `data_parallel="manual"` averages the gradients over `dp` by hand instead of FSDP2 (`reduced_over_tp`: over `tp`).
    `dropout` draws a mask per rank after the MLP (each rank's own stream, seeded alike)."""

    def __init__(self, fault: str | None = None, tp: int = 2, global_batch: int = 8, dropout: float = 0.0,
                 clip: str | None = None, data_parallel: str = "fsdp") -> None:
        super().__init__(fault)
        self.tp, self.global_batch, self.dropout, self.clip = tp, global_batch, dropout, clip
        self.data_parallel = data_parallel

    def setup(self) -> tp.State:
        world = dist.get_world_size()
        tp_size = self.tp_size = min(world, self.tp)
        mesh = init_device_mesh("cpu", (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
        model: nn.Module = MLP()
        parallelize(model, mesh["tp"])
        if self.data_parallel == "fsdp":
            fully_shard(model, mesh=mesh["dp"])
        self.mesh = mesh
        dp = mesh["dp"]
        replicas, rank = dp.size(), dp.get_local_rank()
        if self.fault == "tp_rank_in_sampler":
            replicas, rank = dist.get_world_size(), dist.get_rank()
        sampler = DistributedSampler(dataset(), num_replicas=replicas, rank=rank, shuffle=True, seed=3)
        loader = DataLoader(dataset(), batch_size=self.global_batch // replicas, sampler=sampler)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), loader=loader)

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        loss = nn.functional.mse_loss(nn.functional.dropout(state.model(x), self.dropout), y)
        if self.fault == "loss_divided_by_tp":  # a mean over the tp peers, who read the same samples
            loss = loss / self.tp_size
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if self.data_parallel == "manual":
            self._average_gradients(state.model)
        if self.clip is not None:
            self._clip([p for p in state.model.parameters() if p.grad is not None])
        state.optimizer.step()
        return loss.detach()

    def _average_gradients(self, model: nn.Module) -> None:
        """Data parallelism by hand: each gradient (a DTensor's local shard) averaged over the replicas, `dp`; the
        fault `reduced_over_tp` averages over the tensor-parallel peers instead."""
        group = self.mesh["tp" if self.fault == "reduced_over_tp" else "dp"]
        for parameter in model.parameters():
            grad: Any = parameter.grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            dist.all_reduce(local, group=group.get_group())
            local.div_(group.size())

    def _clip(self, parameters: list[nn.Parameter]) -> None:
        grads: list[Any] = [p.grad for p in parameters]  # DTensors
        if self.clip == "local":  # each rank's norm of its own shards
            norm = torch.nn.utils.get_total_norm([grad.to_local() for grad in grads])
        else:  # the whole gradients' norm, each DTensor gathered
            norm = torch.stack([grad.full_tensor().norm() for grad in grads]).norm()
        torch.nn.utils.clip_grads_with_norm_(parameters, 0.05, norm, foreach=False)


class ThreeDimRecipe(ParallelRecipe):
    """A (dp_replicate, dp_shard, tp) mesh, 2 x 2 x 2 at eight ranks: HSDP (FSDP2 on the 2-D data mesh: replicated
    across `dp_replicate`, sharded across `dp_shard`) around tensor parallel on `tp`. The data is split over both
    data dimensions; `tp_rank_in_sampler` splits it by the global rank."""

    def setup(self) -> tp.State:
        world = dist.get_world_size()
        replicate, tp_size = min(world, 2), min(max(world // 2, 1), 2)
        mesh = init_device_mesh("cpu", (replicate, world // (replicate * tp_size), tp_size),
                                mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
        model = MLP()
        parallelize(model, mesh["tp"])
        fully_shard(model, mesh=mesh["dp_replicate", "dp_shard"])
        shards = mesh["dp_replicate"].size() * mesh["dp_shard"].size()
        shard = mesh["dp_replicate"].get_local_rank() * mesh["dp_shard"].size() + mesh["dp_shard"].get_local_rank()
        if self.fault == "tp_rank_in_sampler":
            shards, shard = world, dist.get_rank()
        sampler = DistributedSampler(dataset(), num_replicas=shards, rank=shard, shuffle=True, seed=3)
        loader = DataLoader(dataset(), batch_size=8 // shards, sampler=sampler)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), loader=loader)


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's copy to the tensor-parallel region: the input as it is, its gradient all-reduced in backward
    (`reduce_backward=False`: the fault that forgets it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, reduce_backward: bool) -> torch.Tensor:
        ctx.reduce_backward = reduce_backward
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.reduce_backward:
            grad = grad.clone()
            dist.all_reduce(grad)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's reduce from the tensor-parallel region: the partial sums all-reduced, the gradient as it is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _GatherFromSequenceParallel(torch.autograd.Function):
    """Megatron's gather from the sequence-parallel region: every rank's rows, in rank order; in backward, the
    gradient summed over the ranks and cut back to this rank's rows (a reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad.chunk(dist.get_world_size())[dist.get_rank()].contiguous()


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Megatron's reduce-scatter to the sequence-parallel region: the partial sums summed over the ranks, each rank
    keeping its rows; in backward, every rank's rows of the gradient gathered."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x.chunk(dist.get_world_size())[dist.get_rank()].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad.contiguous())
        return torch.cat(parts)


class MegatronMLP(nn.Module):
    """The example's MLP sharded by hand as Megatron-LM does, in plain tensors: `up` split by rows (column parallel)
    and `down` by columns (row parallel) over every rank, each slice marked with Megatron's attributes."""

    def __init__(self, rank: int, tp: int, marked: bool = True, reduce_backward: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)  # every rank makes the whole model and keeps its slices
        whole = MLP()
        self.embed, self.head, self.reduce_backward = whole.embed, whole.head, reduce_backward
        self.up = nn.Linear(whole.up.in_features, whole.up.out_features // tp)
        self.down = nn.Linear(whole.down.in_features // tp, whole.down.out_features)
        with torch.no_grad():
            for slice_, source, dim in ((self.up.weight, whole.up.weight, 0), (self.up.bias, whole.up.bias, 0),
                                        (self.down.weight, whole.down.weight, 1)):
                slice_.copy_(source.chunk(tp, dim)[rank])
                if marked:
                    slice_.tensor_model_parallel, slice_.partition_dim, slice_.partition_stride = True, dim, 1
            self.down.bias.copy_(whole.down.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _CopyToTensorParallel.apply(torch.tanh(self.embed(x)), self.reduce_backward)
        h = torch.tanh(self.up(h))
        h = _ReduceFromTensorParallel.apply(nn.functional.linear(h, self.down.weight)) + self.down.bias
        out: torch.Tensor = self.head(torch.tanh(h))
        return out

    def sequence_parallel_forward(self, rows: torch.Tensor) -> torch.Tensor:
        """Sequence parallelism (the batch's rows standing for a sequence's tokens): this rank's rows outside the
        tensor-parallel layers, all rows inside them."""
        h = _GatherFromSequenceParallel.apply(torch.tanh(self.embed(rows)))
        h = torch.tanh(self.up(h))
        h = _ReduceScatterToSequenceParallel.apply(nn.functional.linear(h, self.down.weight)) + self.down.bias
        out: torch.Tensor = self.head(torch.tanh(h))
        return out


class MegatronRecipe(ParallelRecipe):
    """Every rank a tensor-parallel rank of `MegatronMLP`, all reading the whole batch. Faults: `unmarked` (the
    slices carry no attributes), `input_grad_not_reduced` (the copy to the parallel region forgets its backward
    all-reduce). `sequence_parallel`: Megatron's sequence parallelism, each rank's rows outside the tensor-parallel
    layers; the replicated parameters' gradients (partial over the rows) all-reduced as Megatron does for the
    parameters it marks `sequence_parallel` (`sp_grads_not_reduced`: they are not)."""

    def __init__(self, fault: str | None = None, sequence_parallel: bool = False) -> None:
        super().__init__(fault)
        self.sequence_parallel = sequence_parallel

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        if not self.sequence_parallel:
            return super().step(state, batch)
        _, x, y = batch
        world, rank = dist.get_world_size(), dist.get_rank()
        rows = [part.chunk(world)[rank] for part in (x, y)]
        # this rank's rows' mean, over the ranks: the whole batch's mean once the gradients are summed
        loss = nn.functional.mse_loss(state.model.sequence_parallel_forward(rows[0]), rows[1]) / world
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if self.fault != "sp_grads_not_reduced":
            for parameter in state.model.parameters():
                if not getattr(parameter, "tensor_model_parallel", False) and parameter.grad is not None:
                    dist.all_reduce(parameter.grad)
        state.optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total

    def setup(self) -> tp.State:
        model = MegatronMLP(dist.get_rank(), dist.get_world_size(), marked=self.fault != "unmarked",
                            reduce_backward=self.fault != "input_grad_not_reduced")
        loader = DataLoader(dataset(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3))
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), loader=loader)


class WideDDPRecipe(ParallelRecipe):
    """DDP over a layer of 128 KiB (its tensors travel as digests), resumed by the default save/load;
    `optimizer_not_loaded` restores the model alone, so AdamW's moments restart."""

    def setup(self) -> tp.State:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Linear(256, 128))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), step=0)

    def batches(self, state: tp.State) -> Iterator[Any]:
        data = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
        while True:
            ids = torch.arange(8) + 8 * (state.step % 8)
            shard = ids[self.rank::self.world]
            yield shard, data[shard], data[shard, :128]

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        state.step += 1
        return super().step(state, batch)

    def load(self, path: pathlib.Path) -> tp.State:
        state = super().load(path)
        if self.fault == "optimizer_not_loaded":
            state.optimizer = torch.optim.AdamW(state.model.parameters(), lr=1e-3)
        return state
