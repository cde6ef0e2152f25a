"""A recipe with tensors large enough to travel as digests (`trainparity._state._digest.DIGEST_ABOVE_BYTES`)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import torch
from regression_recipe import RegressionRecipe
from torch import nn

import trainparity as tp

WIDTH = 256  # a 256 x 256 float64 weight is 512 KiB


class Wide(RegressionRecipe):
    """AdamW on a float64 MLP of width 256; `fault` loses the model's first weight or Adam's moments on load."""

    def __init__(self, fault: str | None = None) -> None:
        if fault not in (None, "weight", "moments", "data_skip"):
            raise ValueError(f"unknown fault {fault!r}")
        self.fault = fault

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1)).double()
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), step=0)

    def batches(self, state: tp.State) -> Iterator[Any]:
        generator = torch.Generator().manual_seed(0)
        features = torch.randn(64, WIDTH, generator=generator, dtype=torch.float64)
        targets = torch.randn(64, 1, generator=generator, dtype=torch.float64)
        cursor = state.step + (1 if self.fault == "data_skip" and state.step else 0)
        while True:
            ids = torch.arange(8) + 8 * (cursor % 8)
            yield ids, features[ids], targets[ids]
            cursor += 1

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        loss = super().step(state, batch)
        state.step += 1
        return loss

    def load(self, path: pathlib.Path) -> tp.State:
        state = super().load(path)
        with torch.no_grad():
            if self.fault == "weight":
                state.model[0].weight.add_(1e-3)
            if self.fault == "moments":
                for moments in state.optimizer.state.values():
                    moments["exp_avg"].zero_()
        return state


class Tabled(Wide):
    """`Wide` beside a 256 x 256 float64 lookup table (512 KiB: a digest) that the training never changes;
    `fault="table_negated"` loads it negated (a sign convention flipped by a converter)."""

    def __init__(self, fault: str | None = None) -> None:
        if fault not in (None, "table_negated"):
            raise ValueError(f"unknown fault {fault!r}")
        super().__init__()
        self.table_fault = fault

    def setup(self) -> tp.State:
        state = super().setup()
        state.table = torch.randn(WIDTH, WIDTH, dtype=torch.float64)
        return state

    def load(self, path: pathlib.Path) -> tp.State:
        state = super().load(path)
        if self.table_fault == "table_negated":
            state.table = -state.table
        return state
