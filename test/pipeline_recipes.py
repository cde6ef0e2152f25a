"""A two-stage pipeline (torch.distributed.pipelining, GPipe), written for this project the torchtitan way: each rank
keeps the full model's module names for the layers it owns. The parallel check cannot judge pipelines yet; it
must say so rather than take the stages for replicas."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import trainparity as tp

LAYERS, WIDTH, BATCH, MICROBATCHES = 4, 8, 8, 2


class Stages(nn.Module):
    """The layers this rank owns, under the whole model's names (`layers.2.weight` on the second of two stages)."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__()
        per_stage = LAYERS // world_size
        owned = range(rank * per_stage, (rank + 1) * per_stage)
        self.layers = nn.ModuleDict({str(index): nn.Linear(WIDTH, WIDTH) for index in range(LAYERS)})
        for index in range(LAYERS):
            if index not in owned:
                del self.layers[str(index)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = torch.tanh(layer(x))
        return x


class GPipeMLP(tp.Recipe):
    """A 4-layer MLP in `world_size` stages under ScheduleGPipe, 2 micro-batches a step, the loss a mean."""

    def setup(self) -> tp.State:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        rank, world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # the same whole model on every rank, as one process builds it
        model = Stages(rank, world_size)
        stage = PipelineStage(model, rank, world_size, torch.device("cpu"))
        self.schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES,
                                      loss_fn=lambda output, target: ((output - target) ** 2).mean())
        self.first, self.last = rank == 0, rank == world_size - 1
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    def batches(self, state: tp.State) -> Iterator[Any]:
        generator = torch.Generator().manual_seed(1)
        for step in range(100):
            yield torch.arange(step * BATCH, (step + 1) * BATCH), torch.randn(BATCH, WIDTH, generator=generator), \
                torch.randn(BATCH, WIDTH, generator=generator)

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> float | None:
        _, x, y = batch
        state.optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        if self.first:
            self.schedule.step(x, target=y if self.last else None, losses=losses if self.last else None)
        else:
            self.schedule.step(target=y if self.last else None, losses=losses if self.last else None)
        state.optimizer.step()
        return float(torch.stack(losses).detach().mean()) if losses else None
