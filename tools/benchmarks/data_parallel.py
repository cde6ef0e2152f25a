"""A 3-step, world-size-2 parallel check of a small DDP MLP on gloo (3 processes: 2 ranks and the
reference), against one torch import.

Cold: the first check in a new interpreter that has imported trainparity and the recipe (it starts the
fork server). Warm: the median of the next 7 checks in that interpreter.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainparity as tp
from benchmarks._timing import in_fresh_interpreter, machine, median_seconds, seconds, torch_import_seconds


class DDPRegression(tp.Recipe):
    def setup(self) -> tp.State:
        data = TensorDataset(torch.arange(64), torch.randn(64, 16), torch.randn(64, 1))
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=8 // dist.get_world_size(), sampler=sampler)
        model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                            torch.nn.Linear(32, 1)))
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), loader=loader)

    def sample_ids(self, batch: Any) -> Any:
        return batch[0]

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        loss = torch.nn.functional.mse_loss(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        return loss


def probe() -> None:
    """The cold check, then the median of 7 warm ones, in this (fresh) interpreter, printed as JSON."""
    def check() -> None:
        result = tp.check_parallel(DDPRegression, world_size=2, steps=3,
                                   comparison=tp.ToleranceComparison(rtol=1e-4, atol=1e-6))
        assert result.outcome is tp.Outcome.PASS, result.report()

    print(json.dumps({"cold": seconds(check), "warm": median_seconds(check, 7)}))


def run(args: argparse.Namespace) -> None:
    reference = torch_import_seconds()
    figures = in_fresh_interpreter("data_parallel", "probe")
    print(f"parallel check of DDP, world size 2 (gloo, CPU), 3 steps; {machine()}")
    print(f"python -c 'import torch':  {reference:.3f} s (median of 3)")
    print(f"cold check (first, starts the fork server): {figures['cold']:.3f} s = "
          f"{figures['cold'] / reference:.2f}x torch import (target < 3x)")
    print(f"warm check (median of 7):   {figures['warm']:.3f} s = "
          f"{figures['warm'] / reference:.2f}x torch import (target < 3x)")
