"""Mid-epoch resume through torchdata's `StatefulDataLoader` (the optional extra `trainparity[torchdata]`).

A small regression MLP trained the nanoGPT way: AdamW, the learning rate computed each step from the
iteration counter (linear warmup, then cosine decay), gradient accumulation, and a checkpoint holding
the model, the optimizer, the iteration and `loader.state_dict()`, which lets a restarted job
continue in the middle of an epoch. The loader shuffles with its own generator and reads with 2
worker processes.

`RowRegression(fault=...)` and `resumed_epoch(fault=...)` carry one deliberate bug each (see
`FAULTS`); `tools/validate.py` checks that each is caught. Without torchdata, `TORCHDATA_MISSING`
says why and the example's tests skip.
"""

from __future__ import annotations

import math
import pathlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

import trainparity as tp

try:
    from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped,import-not-found,unused-ignore]
except ImportError:  # the optional extra is not installed
    StatefulDataLoader = None
    TORCHDATA_MISSING: str | None = (
        'torchdata is not installed: pip install "trainparity[torchdata]" to run the StatefulDataLoader example'
    )
else:
    TORCHDATA_MISSING = None
    # torchdata 0.11 calls a deprecated torch function on every iterator it creates.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

ROWS, FEATURES = 40, 6
BATCH_SIZE = 8
PEAK_LR, MIN_LR, WARMUP, DECAY = 3e-3, 3e-4, 3, 100

FAULTS = (
    # resume
    "loader_not_saved", "iteration_not_saved",
    # accumulation
    "loss_not_scaled",
    # coverage
    "loader_state_not_restored",
)


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(99)
    features = torch.randn(ROWS, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, 1, generator=generator)
    return features, features @ weights + 0.1 * torch.randn(ROWS, 1, generator=generator)


FEATURE_ROWS, TARGETS = _rows()


class Rows(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return index, FEATURE_ROWS[index], TARGETS[index]


def learning_rate(iteration: int) -> float:
    """nanoGPT's schedule: linear warmup, cosine decay to MIN_LR, then MIN_LR."""
    if iteration < WARMUP:
        return PEAK_LR * (iteration + 1) / WARMUP
    progress = min(1.0, (iteration - WARMUP) / (DECAY - WARMUP))
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (PEAK_LR - MIN_LR)


def make_loader(sampler: Any = None) -> Any:
    if StatefulDataLoader is None:
        raise RuntimeError(TORCHDATA_MISSING)
    if sampler is not None:  # the coverage pipeline: batches tagged with the worker that produced them
        return StatefulDataLoader(Rows(), batch_size=BATCH_SIZE, sampler=sampler, num_workers=2,
                                  collate_fn=tp.tag_workers())
    return StatefulDataLoader(Rows(), batch_size=BATCH_SIZE, shuffle=True, num_workers=2,
                              generator=torch.Generator().manual_seed(0))


class RowRegression(tp.Recipe):
    def __init__(self, accumulation_steps: int = 1, fault: str | None = None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.accumulation_steps, self.fault = accumulation_steps, fault

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(FEATURES, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
        return tp.State(model=model, optimizer=optimizer, loader=make_loader(), iteration=0, micro_step=0)

    def batches(self, state: tp.State) -> Iterator[Any]:
        while True:  # each pass is an epoch; after load_state_dict, the first pass resumes mid-epoch
            yield from state.loader

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, features, targets = batch
        for group in state.optimizer.param_groups:
            group["lr"] = learning_rate(state.iteration)
        loss = F.mse_loss(state.model(features), targets)
        (loss if self.fault == "loss_not_scaled" else loss / self.accumulation_steps).backward()  # type: ignore[no-untyped-call]
        state.micro_step += 1
        if state.micro_step % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad(set_to_none=True)
            state.iteration += 1
        return loss.detach()

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        checkpoint = {
            "model": state.model.state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "loader": state.loader.state_dict(),
            "iteration": state.iteration,
            "micro_step": state.micro_step,
        }
        lost = {"loader_not_saved": "loader", "iteration_not_saved": "iteration"}
        if self.fault in lost:
            del checkpoint[lost[self.fault]]
        torch.save(checkpoint, path)

    def load(self, path: pathlib.Path) -> tp.State:
        state = self.setup()
        checkpoint = torch.load(path, weights_only=True)
        state.model.load_state_dict(checkpoint["model"])
        state.optimizer.load_state_dict(checkpoint["optimizer"])
        # Keys are optional so that checkpoints of older versions still load: an omission is silent.
        if "loader" in checkpoint:
            state.loader.load_state_dict(checkpoint["loader"])
        state.iteration = checkpoint.get("iteration", 0)
        state.micro_step = checkpoint["micro_step"]
        return state


def resumed_epoch(world: int = 2, stop_after: int = 1, fault: str | None = None) -> tp.CoverageRecorder:
    """One epoch of a data-parallel job that is stopped after `stop_after` batches per rank and restarted.

    Each rank reads through a `DistributedSampler`, records what it trains on with a
    `tp.CoverageRecorder`, checkpoints `loader.state_dict()`, and a new loader (the restarted job)
    loads it and finishes the epoch. The returned record merges all ranks.
    """
    records = []
    for rank in range(world):
        recorder = tp.CoverageRecorder(rank, sample_ids=lambda batch: batch[0])
        sampler: DistributedSampler[int] = DistributedSampler(Rows(), num_replicas=world, rank=rank, shuffle=True,
                                                              seed=0)
        sampler.set_epoch(0)
        loader = make_loader(sampler)
        batches = iter(loader)
        for _ in range(stop_after):
            recorder.record(next(batches))
        checkpoint = loader.state_dict()
        del batches, loader  # the job stops: its workers exit
        restarted = make_loader(sampler)
        if fault != "loader_state_not_restored":
            restarted.load_state_dict(checkpoint)
        for batch in restarted:
            recorder.record(batch)
        records.append(recorder)
    return tp.CoverageRecorder.merge(records)
