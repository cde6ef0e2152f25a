"""Recipes for the data-parallel tests: one clean DDP training loop and its faults, written for this project.

`DDPRecipe(fault=...)` trains a small MLP wrapped in DistributedDataParallel with SGD and
momentum on a DistributedSampler that shuffles; each rank reads `global_batch // world_size`
samples a step, so the ranks together read the batch that the world of size 1 reads. Each
fault breaks one thing a real job can get wrong.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainparity as tp

DATASET = 32


class Net(nn.Module):
    def __init__(self, batchnorm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8) if batchnorm else nn.Identity()
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(torch.tanh(self.norm(self.fc1(x))))
        return out


class DDPRecipe(tp.Recipe):
    FAULTS = (None, "no_ddp", "grads_summed", "same_shard", "rank_drops_samples", "batchnorm", "raises", "hangs",
              "dies")

    def __init__(self, fault: str | None = None, global_batch: int = 4, pid_dir: str | None = None) -> None:
        if fault not in self.FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        self.fault = fault
        self.global_batch = global_batch
        self.pid_dir = pid_dir
        self.steps_taken = 0

    def setup(self) -> tp.State:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # code written for torchrun reads its environment
        assert (os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == (str(self.rank), str(self.world_size))
        if self.pid_dir is not None:
            (pathlib.Path(self.pid_dir) / f"{os.getpid()}").write_text(str(self.rank))
        generator = torch.Generator().manual_seed(1234)
        features, targets = torch.randn(DATASET, 6, generator=generator), torch.randn(DATASET, 2, generator=generator)
        dataset = TensorDataset(torch.arange(DATASET), features, targets)
        # fault "same_shard": every rank believes it is rank 0
        rank = 0 if self.fault == "same_shard" else self.rank
        sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=self.world_size, rank=rank, shuffle=True, seed=7
        )
        loader = DataLoader(dataset, batch_size=self.global_batch // self.world_size, sampler=sampler)
        model: nn.Module = Net(batchnorm=self.fault == "batchnorm")
        if self.fault not in ("no_ddp", "grads_summed"):
            model = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return tp.State(model=model, optimizer=optimizer, loader=loader)

    def batches(self, state: tp.State) -> Iterator[Any]:
        for ids, x, y in super().batches(state):
            if self.fault == "rank_drops_samples" and self.rank == 1:  # a filter that loses a sample on rank 1
                ids, x, y = ids[:-1], x[:-1], y[:-1]
            yield ids, x, y

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        self.steps_taken += 1
        if self.rank == 1 and self.steps_taken == 2:
            if self.fault == "raises":
                raise ValueError("rank 1 cannot go on")
            if self.fault == "hangs":
                time.sleep(3600)  # rank 0 then waits forever in DDP's all-reduce
            if self.fault == "dies":
                os._exit(3)
        loss = nn.functional.mse_loss(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if self.fault == "grads_summed":  # hand-made data parallelism that sums where DDP averages
            for parameter in state.model.parameters():
                dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
        state.optimizer.step()
        return loss.detach()


class UnobservedRecipe(DDPRecipe):
    """No sample IDs and no optimizer in the State (a hand-written SGD update): nothing to compare there."""

    def setup(self) -> tp.State:
        state = super().setup()
        return tp.State(model=state.model, loader=state.loader)

    def sample_ids(self, batch: Any) -> None:
        return None

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        loss = nn.functional.mse_loss(state.model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        with torch.no_grad():
            for parameter in state.model.parameters():
                parameter -= 0.1 * parameter.grad
                parameter.grad = None
        return loss.detach()


class NestedRecipe(DDPRecipe):
    """The model in a list entry and the optimizer in a dict entry of the State (`models.0`, `optimizers.main`)."""

    def setup(self) -> tp.State:
        state = super().setup()
        return tp.State(models=[state.model], optimizers={"main": state.optimizer}, loader=state.loader)

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        flat = tp.State(model=state.models[0], optimizer=state.optimizers["main"])
        return super().step(flat, batch)
