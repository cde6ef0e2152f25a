"""Quickstart: mixed precision, one clean GradScaler loop and one that clips the still-scaled gradients.

Run it with `python -m trainparity.quickstarts.mixed_precision`. Both recipes train a small MLP
under `torch.autocast` (bfloat16 on CPU) with a `torch.amp.GradScaler("cpu")`, as on a GPU with
float16: scale the loss, back-propagate, unscale, clip, `scaler.step(optimizer)`,
`scaler.update()`. The deliberate bug clips before `scaler.unscale_(optimizer)`: the threshold
then applies to gradients 65536 times too large, so clipping does nothing useful, and nothing
crashes. The check observes four steps through the GradScaler and optimizer hooks. Exit status
0 when the clean recipe passes and the buggy one fails with `clip_before_unscale`, 1 otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from torch import nn
from torch.amp.grad_scaler import GradScaler  # torch 2.7's stubs do not export it from torch.amp

import trainparity as tp
from trainparity.quickstarts import shown


class AmpRegression(tp.Recipe):
    """A small MLP: AdamW, autocast, a GradScaler, gradient clipping on unscaled gradients."""

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return tp.State(model=model, optimizer=optimizer, scaler=GradScaler("cpu"))

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(32, 16, generator=generator), torch.randn(32, 1, generator=generator)

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            prediction = state.model(x)
        loss = nn.functional.mse_loss(prediction.float(), y)
        state.optimizer.zero_grad()
        state.scaler.scale(loss).backward()
        self.clip_and_step(state)
        return loss.detach()

    def clip_and_step(self, state: tp.State) -> None:
        state.scaler.unscale_(state.optimizer)
        nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=1.0)
        state.scaler.step(state.optimizer)
        state.scaler.update()


class ClipsScaledGradients(AmpRegression):
    """A common bug: clipping before scaler.unscale_(), on gradients still multiplied by the loss scale."""

    def clip_and_step(self, state: tp.State) -> None:
        nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=1.0)  # the bug: before unscale_
        state.scaler.step(state.optimizer)
        state.scaler.update()


def main() -> int:
    clean = tp.check_mixed_precision(AmpRegression, steps=4)
    broken = tp.check_mixed_precision(ClipsScaledGradients, steps=4)
    return shown(clean, broken, "clip_before_unscale")


if __name__ == "__main__":
    sys.exit(main())
