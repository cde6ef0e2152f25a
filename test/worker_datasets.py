"""Datasets and loader factories for the worker randomness check.

The realistic pipelines and their faults are `examples/augment.py`'s; the factories here build them for specs
(`worker_datasets:augmented(fault='...')`, what the command line takes) and add the cases a user's pipeline
rarely shows on purpose: a fetch that raises, one that hangs, a stream no fetch consumes, a worker_init_fn that
raises.
"""

from __future__ import annotations

import os
import pathlib
import random
import sys
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

import augment  # noqa: E402


def augmented(fault: str | None = None, num_workers: int = 2) -> DataLoader[Any]:
    """The augmentation pipeline's loader (the streaming one for `persistent_epoch_seed`)."""
    if fault == "persistent_epoch_seed":
        return augment.stream_loader(fault)
    return augment.loader(fault, num_workers)


def not_a_loader() -> list[int]:
    return [1, 2, 3]


def raises_building() -> DataLoader[Any]:
    raise RuntimeError("the data directory is missing")


class Numbers(Dataset[int]):
    """Item i is i plus a draw from the stream `kind` names ("numpy", "python", "unused": a generator nobody draws
    from, "none"); `broken_at` raises there; `hang_at` sleeps there, its process id written to `pids`."""

    def __init__(self, size: int = 16, kind: str = "numpy", broken_at: int | None = None, hang_at: int | None = None,
                 pids: str | None = None) -> None:
        self.size, self.kind, self.broken_at, self.hang_at, self.pids = size, kind, broken_at, hang_at, pids
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> float:
        if self.pids is not None:
            with open(os.path.join(self.pids, f"{os.getpid()}.pids"), "w") as file:
                file.write(str(os.getpid()))
        if index == self.broken_at:
            raise ValueError(f"sample {index} is corrupt")
        if index == self.hang_at:
            time.sleep(3600)
        draw = {"numpy": lambda: float(self.rng.random()), "python": random.random, "none": lambda: 0.0}
        return index + draw.get(self.kind, lambda: 0.0)()


class RaisingInit:
    def __call__(self, worker_id: int) -> None:
        raise OSError(f"worker {worker_id} cannot open its shard")


def numbers(num_workers: int = 2, **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(Numbers(**kwargs), batch_size=4, num_workers=num_workers)


def seeded_numpy_in_init(worker_id: int) -> None:
    np.random.seed(0)


def torch_seeded_in_init(worker_id: int) -> None:
    torch.manual_seed(0)


class EpochGenerator(Dataset[float]):
    """set_epoch builds the epoch's generator in this process, from a constant: the workers each get a copy."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def set_epoch(self, epoch: int) -> None:
        self.rng = np.random.default_rng(1000 + epoch)

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> float:
        return index + float(self.rng.random())
