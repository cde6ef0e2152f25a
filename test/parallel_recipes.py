"""Recipes sharded with FSDP2 (`fully_shard`) and tensor parallelism (`parallelize_module`) on a CPU mesh.

`FSDPRecipe(fault=...)`: an embedding-like input layer, blocks sharded layer by layer, a head, and
the root sharded last, as torchtitan does; `root_unsharded` leaves the root out (its own layers keep
per-rank gradients that are never reduced), `divide_factor_1` sums the gradients where the full batch
takes a mean. `TPRecipe(fault=...)`: a column-then-row parallel MLP whose ranks read the same batch;
`rank_seeded_shuffle` lets each rank shuffle with its own seed, so they do not.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from regression_recipe import RegressionRecipe
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainparity as tp


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


class TPRecipe(ParallelRecipe):
    def setup(self) -> tp.State:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        seed = 5 + (dist.get_rank() if self.fault == "rank_seeded_shuffle" else 0)
        loader = DataLoader(dataset(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(seed))
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), loader=loader)
