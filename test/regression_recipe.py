"""The base of the small test recipes whose batches are (sample IDs, features, targets)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import trainparity as tp


class RegressionRecipe(tp.Recipe):
    """A step is one optimizer step of `state.model` on the mean squared error of a batch."""

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        loss = nn.functional.mse_loss(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        return loss.detach()
