"""CoverageRecorder: recording inside a loop, pickling, merging, and all-gathering over a real 2-rank gloo group."""

from __future__ import annotations

import datetime
import pathlib
import pickle
import tempfile
import unittest
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

import trainparity as tp
from trainparity._process._engine import Job, run_jobs
from trainparity._process._options import Deadline
from trainparity.strategies import IndexDataset

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]

WORLD = 2
DATASET = 10


def train_and_gather(payload: dict[str, Any], workdir: pathlib.Path) -> dict[str, Any]:
    """One rank of a data-parallel job: record what this rank trains on, all-gather, audit on rank 0."""
    rank = payload["rank"]
    dist.init_process_group("gloo", init_method=payload["init_method"], rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=30))
    try:
        dataset = IndexDataset(DATASET)
        # sampler_rank=0 on every rank is the classic bug: both ranks train on the same shard.
        sampler = DistributedSampler(dataset, rank=payload["sampler_rank"] if payload["buggy"] else None,
                                     shuffle=True, seed=3)
        loader = DataLoader(dataset, batch_size=3, sampler=sampler, collate_fn=tp.tag_workers())
        recorder = tp.CoverageRecorder(sample_ids=lambda batch: batch)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            recorder.set_epoch(epoch)
            for batch in loader:
                recorder.record(batch)
        merged = recorder.gather()
        result = tp.check_coverage(merged, policy=tp.ExactlyOnce(range(DATASET)))
        return {"rank": rank, "ranks": merged.ranks, "epochs": merged.epochs, "ids": len(merged),
                "outcome": result.outcome.value, "counts": result.counts, "report": result.report()}
    finally:
        dist.destroy_process_group()


def run_world(buggy: bool) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="trainparity-gloo-") as tmp:
        init_method = f"file://{tmp}/rendezvous"
        jobs = [Job(f"{__name__}:train_and_gather",
                    {"rank": r, "init_method": init_method, "buggy": buggy, "sampler_rank": 0}, f"rank {r}", rank=r)
                for r in range(WORLD)]
        outcomes = run_jobs(jobs, deadline=Deadline.after(90), concurrency=WORLD, on_failure="all")
    errors = [o.error.headline() for o in outcomes if o.error is not None]
    if errors:
        raise AssertionError("; ".join(errors))
    return [o.output for o in outcomes if o.output is not None]


class TestGather(unittest.TestCase):
    def test_gather_over_a_real_gloo_group(self) -> None:
        outputs = run_world(buggy=False)
        self.assertEqual(len(outputs), WORLD)
        for output in outputs:
            self.assertEqual((output["ranks"], output["epochs"], output["ids"]), ([0, 1], [0, 1], 2 * DATASET))
            self.assertEqual(output["outcome"], "PASS")
        self.assertEqual(outputs[0]["report"], outputs[1]["report"])

    def test_gathered_record_shows_the_shared_shard(self) -> None:
        outputs = run_world(buggy=True)
        self.assertEqual(outputs[0]["outcome"], "FAIL")
        self.assertEqual(outputs[0]["counts"], {"cross_rank_duplicate": 10, "missing_id": 10})
        self.assertEqual(outputs[0]["report"], outputs[1]["report"])
        self.assertIn("epoch 1: ranks 0, 1 saw the same samples in the same order", outputs[0]["report"])


class TestRecorder(unittest.TestCase):
    def test_records_batches_per_epoch_with_workers(self) -> None:
        recorder = tp.CoverageRecorder(rank=3, sample_ids=lambda b: b["idx"])
        recorder.record({"idx": torch.tensor([0, 1])})
        recorder.record(tp.WorkerBatch({"idx": [2]}, 1))
        recorder.set_epoch(1)
        recorder.record({"idx": np.array([1, 0])}, worker=0)
        self.assertEqual((recorder.ranks, recorder.epochs, len(recorder)), ([3], [0, 1], 5))
        self.assertEqual(repr(recorder), "CoverageRecorder(ranks=[3], epochs=[0, 1], ids=5)")
        result = tp.check_coverage(recorder, policy=[tp.ExactlyOnce(range(3)), tp.DistinctEpochOrder()])
        self.assertEqual([(v.kind, v.epoch, v.rank, v.worker) for v in result.violations],
                         [("missing_id", 1, None, None)])

    def test_keeps_a_copy_of_reused_buffers(self) -> None:
        for buffer in (np.array([0, 1]), np.array([0, 1], dtype=np.int32), torch.tensor([0, 1])):
            with self.subTest(type(buffer).__name__, dtype=str(buffer.dtype)):
                recorder = tp.CoverageRecorder()
                recorder.record(buffer)
                buffer[:] = 5
                recorder.record(buffer)
                self.assertTrue(tp.check_coverage(recorder, policy=tp.AtLeastOnce([0, 1, 5])).passed)

    def test_pickles_small_without_sample_ids(self) -> None:
        recorder = tp.CoverageRecorder(rank=1, sample_ids=lambda b: b)
        for start in range(0, 1000, 10):
            recorder.record(list(range(start, start + 10)))
        data = pickle.dumps(recorder)
        self.assertLess(len(data), 8 * 1000 + 3000)  # the IDs as one int64 array, plus small tables
        restored = pickle.loads(data)
        self.assertEqual((restored.ranks, restored.epochs, len(restored)), ([1], [0], 1000))
        self.assertTrue(tp.check_coverage(restored, policy=tp.ExactlyOnce(range(1000))).passed)
        with self.assertRaisesRegex(ValueError, "merges several ranks"):
            tp.CoverageRecorder.merge([restored]).record([1])

    def test_merge(self) -> None:
        records = []
        for rank in range(3):
            recorder = tp.CoverageRecorder(rank=rank)
            if rank < 2:  # rank 2 recorded nothing: it appears with an empty stream
                recorder.record([rank, rank + 2])
            records.append(recorder)
        merged = tp.CoverageRecorder.merge(pickle.loads(pickle.dumps(r)) for r in records)
        self.assertEqual(merged.ranks, [0, 1, 2])
        result = tp.check_coverage(merged, policy=tp.ExactlyOnce(range(5)))
        self.assertEqual([(v.kind, v.sample_id) for v in result.violations], [("missing_id", 4)])
        self.assertEqual(result.config["ranks"], [0, 1, 2])
        with self.assertRaisesRegex(ValueError, "got the same record twice"):
            tp.CoverageRecorder.merge([records[0], records[0]])
        with self.assertRaisesRegex(ValueError, "got no records"):
            tp.CoverageRecorder.merge([])

    def test_misuse(self) -> None:
        with self.assertRaisesRegex(ValueError, "rank=...."):
            tp.CoverageRecorder(rank=-1)
        with self.assertRaisesRegex(ValueError, "set_epoch"):
            tp.CoverageRecorder().set_epoch(-1)
        with self.assertRaisesRegex(TypeError, "rank 0, epoch 0, batch 0: sample ID at position 1 is float"):
            tp.CoverageRecorder().record([1, 2.5])
        with self.assertRaisesRegex(RuntimeError, "initialized torch.distributed process group"):
            tp.CoverageRecorder().gather()
        with self.assertRaisesRegex(ValueError, "pass sample_ids= to CoverageRecorder"):
            tp.check_coverage(tp.CoverageRecorder(), policy=tp.NoCrossRankOverlap(), sample_ids=lambda b: b)


if __name__ == "__main__":
    unittest.main()
