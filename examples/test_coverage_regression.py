"""A user's coverage tests for a streaming dataset, with an expected-output snapshot of a first-violation report.

    python -m pytest examples/test_coverage_regression.py
    EXPECTTEST_ACCEPT=1 python -m pytest examples/test_coverage_regression.py   # rewrite the snapshot

`LogStream` is an IterableDataset read by 2 ranks with 2 DataLoader workers each. Sharding
it across ranks is easy to remember; sharding it across the workers of each rank is easy to
forget, and then every worker replays the rank's shard. The first test holds the fixed
pipeline to "every record exactly once"; the second pins the report of the unsharded
pipeline, so that a change in what the audit reports (or in the pipeline) shows up as a
diff in review. `tp.tag_workers()` tags each batch with the worker that produced it, so the
report names the workers that repeated a record.

After a deliberate change, run the accept command above: expecttest rewrites the
triple-quoted literal in this file in place; review the diff and commit it.
"""

# ruff: noqa: E501 - the snapshot holds report lines verbatim

from __future__ import annotations

import unittest
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import trainparity as tp

RECORDS = 12
WORLD_SIZE = 2


class LogStream(IterableDataset[dict[str, torch.Tensor]]):
    """Records 0..RECORDS-1, sharded by rank and, when `shard_workers`, by DataLoader worker."""

    def __init__(self, rank: int, *, shard_workers: bool) -> None:
        self.rank = rank
        self.shard_workers = shard_workers

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None and self.shard_workers else (0, 1)
        for index in range(self.rank * workers + worker, RECORDS, WORLD_SIZE * workers):
            yield {"record_id": torch.tensor(index), "features": torch.randn(4)}


def loaders(*, shard_workers: bool) -> dict[int, DataLoader[dict[str, torch.Tensor]]]:
    return {
        rank: DataLoader(LogStream(rank, shard_workers=shard_workers), batch_size=2, num_workers=2,
                         collate_fn=tp.tag_workers())
        for rank in range(WORLD_SIZE)
    }


def record_ids(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return batch["record_id"]


class TestLogStreamCoverage(tp.TestCase):
    def test_every_record_once_per_epoch(self) -> None:
        self.assertCoverage(loaders(shard_workers=True), policy=tp.ExactlyOnce(range(RECORDS)), sample_ids=record_ids)

    def test_report_when_workers_are_not_sharded(self) -> None:
        result = tp.check_coverage(loaders(shard_workers=False), policy=tp.ExactlyOnce(range(RECORDS)),
                                   sample_ids=record_ids)
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: FAIL at coverage.same_rank_duplicate (epoch 0, rank 0, sample 0)
config: epochs=[0], policy=['ExactlyOnce(range(0, 12))'], ranks=[0, 1]

First violation: coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 2, sample 0, kind: same_rank_duplicate)
  Sample 0 was observed again by rank 0 at position 2 (batch 1, worker 1) of epoch 0; rank 0 first observed it at position 0 (batch 0, worker 0).
  Workers 0 and 1 of rank 0 both produced it: a DataLoader over an IterableDataset replays the data in every worker unless the dataset shards it with torch.utils.data.get_worker_info().

All violations (12):
  1. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 2, sample 0, kind: same_rank_duplicate)
  2. coverage.same_rank_duplicate (epoch 0, rank 1, worker 1, position 2, sample 1, kind: same_rank_duplicate)
  3. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 3, sample 2, kind: same_rank_duplicate)
  4. coverage.same_rank_duplicate (epoch 0, rank 1, worker 1, position 3, sample 3, kind: same_rank_duplicate)
  5. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 6, sample 4, kind: same_rank_duplicate)
  6. coverage.same_rank_duplicate (epoch 0, rank 1, worker 1, position 6, sample 5, kind: same_rank_duplicate)
  7. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 7, sample 6, kind: same_rank_duplicate)
  8. coverage.same_rank_duplicate (epoch 0, rank 1, worker 1, position 7, sample 7, kind: same_rank_duplicate)
  9. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 10, sample 8, kind: same_rank_duplicate)
  10. coverage.same_rank_duplicate (epoch 0, rank 1, worker 1, position 10, sample 9, kind: same_rank_duplicate)
  ... and 2 more (result.violations has them all)""")


if __name__ == "__main__":
    unittest.main()
