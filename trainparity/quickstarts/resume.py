"""Quickstart: resume equivalence, one clean recipe and one that forgets its scheduler.

Run it with `python -m trainparity.quickstarts.resume`. Each check trains in fresh processes:
two uninterrupted baselines, one run that saves at step 3 and exits, one that loads and
continues; the reports say whether resuming reproduced uninterrupted training.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import torch
from torch import nn

import trainparity as tp
from trainparity.quickstarts import shown


class Regression(tp.Recipe):
    """A small regression model: AdamW, a warmup schedule, dropout, a data cursor."""

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
        return tp.State(model=model, optimizer=optimizer, scheduler=scheduler, global_step=0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        # The data stream resumes where the checkpoint left it: batch number global_step.
        generator = torch.Generator().manual_seed(0)
        features, targets = torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator)
        cursor = state.global_step
        while True:
            ids = torch.arange(cursor * 8, cursor * 8 + 8) % 64
            yield ids, features[ids], targets[ids]
            cursor += 1

    def sample_ids(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return batch[0]

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        _, x, y = batch
        state.optimizer.zero_grad()
        loss = nn.functional.mse_loss(state.model(x), y)
        loss.backward()
        state.optimizer.step()
        state.scheduler.step()
        state.global_step += 1
        return loss


class ForgetsScheduler(Regression):
    """A common bug: the checkpoint holds the model, the optimizer and the step, not the scheduler."""

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        torch.save(
            {
                "model": state.model.state_dict(),
                "optimizer": state.optimizer.state_dict(),
                "global_step": state.global_step,
                "rng": torch.get_rng_state(),
            },
            path,
        )

    def load(self, path: pathlib.Path) -> tp.State:
        state = self.setup()
        checkpoint = torch.load(path, weights_only=True)
        state.model.load_state_dict(checkpoint["model"])
        state.optimizer.load_state_dict(checkpoint["optimizer"])
        state.global_step = checkpoint["global_step"]
        torch.set_rng_state(checkpoint["rng"])
        return state


def main() -> int:
    clean = tp.check_resume(Regression, steps=6, resume_at=3)
    broken = tp.check_resume(ForgetsScheduler, steps=6, resume_at=3)
    return shown(clean, broken)


if __name__ == "__main__":
    sys.exit(main())
