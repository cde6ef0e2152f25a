"""Audit what the ranks of a real torchrun job read, from inside the job.

    torchrun --nproc-per-node 2 examples/torchrun_coverage.py               # PASS, exit status 0
    torchrun --nproc-per-node 2 examples/torchrun_coverage.py --same-shard  # FAIL, exit status 1

Every rank records the sample IDs it trains on with `tp.CoverageRecorder`; after the last
epoch, `recorder.gather()` all-gathers the records (a collective: every rank calls it) and
rank 0 audits them with `tp.check_coverage`: each sample exactly once per epoch across the
ranks, and a new order every epoch. `--same-shard` plants the classic bug: every rank builds
its DistributedSampler as rank 0, so all ranks read the same half of the data.

Runs on CPU with the gloo backend; `main()` expects the default process group to be
initialized (torchrun's environment, or any launcher that calls init_process_group first).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainparity as tp

DATASET = 64
EPOCHS = 2


def main(same_shard: bool = False) -> tp.CoverageResult | None:
    """Train-loop skeleton that records what this rank reads; rank 0 returns the audit, other ranks None."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = TensorDataset(torch.arange(DATASET), torch.randn(DATASET, 4))
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=world_size, rank=0 if same_shard else rank, seed=3
    )
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    recorder = tp.CoverageRecorder(sample_ids=lambda batch: batch[0])
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        recorder.set_epoch(epoch)
        for batch in loader:
            recorder.record(batch)
            # ... forward, backward and optimizer step of the real job go here ...
    record = recorder.gather()
    if rank != 0:
        return None
    return tp.check_coverage(record, policy=[tp.ExactlyOnce(range(DATASET)), tp.DistinctEpochOrder()])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--same-shard", action="store_true", help="plant the bug: every rank reads rank 0's shard")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE
    try:
        result = main(same_shard=args.same_shard)
    finally:
        dist.destroy_process_group()
    if result is not None:
        print(result.report())
        sys.exit(0 if result.passed else 1)
