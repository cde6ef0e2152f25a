"""Quickstart: gradient accumulation, one clean recipe and one that forgets to scale its loss.

Run it with `python -m trainparity.quickstarts.accumulation`. Each check builds the recipe
twice from the same seed: once with `accumulation_steps=1`, stepping on whole batches of 32,
and once with `accumulation_steps=4`, fed the same batches cut into 4 micro-batches of 8.
The reports say whether the accumulation loop reproduces the full-batch step and, when it
does not, where the runs first diverge and why.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from torch import nn

import trainparity as tp
from trainparity.quickstarts import shown


class Regression(tp.Recipe):
    """A small MLP: AdamW, dropout, gradient clipping and a warmup schedule, stepped every
    `accumulation_steps` micro-batches."""

    def __init__(self, accumulation_steps: int = 1) -> None:
        self.accumulation_steps = accumulation_steps

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
        return tp.State(model=model, optimizer=optimizer, scheduler=scheduler, micro_step=0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(32, 16, generator=generator), torch.randn(32, 1, generator=generator)

    def loss(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The micro-batch's share of the full batch's mean loss."""
        x, y = batch
        return nn.functional.mse_loss(state.model(x), y) / self.accumulation_steps

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss = self.loss(state, batch)
        loss.backward()
        state.micro_step += 1
        if state.micro_step % self.accumulation_steps == 0:
            nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=10.0)
            state.optimizer.step()
            state.optimizer.zero_grad()
            state.scheduler.step()
        return loss


class ForgetsToScale(Regression):
    """A common bug: each micro-batch's mean loss is back-propagated as it is, not divided by k."""

    def loss(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(state.model(x), y)  # the bug: no "/ self.accumulation_steps"


def main() -> int:
    # Both runs compute in float64 (precision="float64", the default), where one fixed tolerance separates
    # rounding from bugs on any machine: no comparison needs declaring.
    clean = tp.check_accumulation(Regression, microbatches=4, cycles=2)
    broken = tp.check_accumulation(ForgetsToScale, microbatches=4, cycles=2)
    return shown(clean, broken, "loss_not_scaled")


if __name__ == "__main__":
    sys.exit(main())
