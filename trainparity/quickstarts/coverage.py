"""Quickstart: sample coverage, one clean data-parallel setup and one where every rank reads the same shard.

Run it with `python -m trainparity.quickstarts.coverage`. Four ranks each build a DataLoader
over a dataset of 32 samples, sharded by torch's DistributedSampler, for two epochs. The
audit holds what the ranks read to the policy a data-parallel job needs: every sample
exactly once per epoch across the ranks, and a new order every epoch. The deliberate bug
builds every sampler with `rank=0`, as happens when the rank is hard-coded or taken from a
process group that was never set up. Exit status 0 when the clean setup passes and the
buggy one fails with cross-rank duplicates, 1 otherwise.

(With a dataset size that the world size does not divide, DistributedSampler repeats a few
samples; declare them with `tp.ExpectedPadding(range(n), padding=k)` instead of ExactlyOnce.)
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainparity as tp
from trainparity.quickstarts import shown

DATASET = 32
WORLD_SIZE = 4
EPOCHS = 2
POLICY = [tp.ExactlyOnce(range(DATASET)), tp.DistinctEpochOrder()]


def epochs_read(rank_of: Any) -> list[dict[int, list[Any]]]:
    """What each rank's loader yields, epoch by epoch; `rank_of(rank)` is the rank its sampler is built with."""
    dataset = TensorDataset(torch.arange(DATASET), torch.randn(DATASET, 3))
    samplers: dict[int, DistributedSampler[Any]] = {
        rank: DistributedSampler(dataset, num_replicas=WORLD_SIZE, rank=rank_of(rank), seed=0)
        for rank in range(WORLD_SIZE)
    }
    loaders = {rank: DataLoader(dataset, batch_size=4, sampler=sampler) for rank, sampler in samplers.items()}
    epochs = []
    for epoch in range(EPOCHS):
        for sampler in samplers.values():
            sampler.set_epoch(epoch)
        epochs.append({rank: list(loader) for rank, loader in loaders.items()})
    return epochs


def main() -> int:
    clean = tp.check_coverage(epochs_read(lambda rank: rank), policy=POLICY, sample_ids=lambda b: b[0])
    broken = tp.check_coverage(epochs_read(lambda rank: 0), policy=POLICY, sample_ids=lambda b: b[0])
    return shown(clean, broken, "cross_rank_duplicate")


if __name__ == "__main__":
    sys.exit(main())
