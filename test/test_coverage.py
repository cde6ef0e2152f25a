"""check_coverage / assertCoverage: policies, inputs, errors, and a snapshot of the report for each violation kind."""

# ruff: noqa: E501 - the report snapshots hold report lines verbatim

from __future__ import annotations

import contextlib
import gc
import io
import json
import multiprocessing
import os
import unittest
from unittest import mock

import numpy as np
import pytest
import torch
from process_helpers import still_running
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, SequentialSampler

import trainparity as tp
from trainparity.strategies import IndexDataset

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]


class Replayed(IterableDataset[int]):
    """The replica bug: an IterableDataset that does not shard by worker, so every worker yields everything."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.size))


class Sharded(Replayed):
    """The fix: each worker takes every num_workers-th sample."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, self.size, workers))


class FailingAt(torch.utils.data.Dataset[tuple[int, int]]):
    """Sample i is (i, the PID of the process that loaded it); loading sample `fail_at` raises."""

    def __init__(self, size: int, fail_at: int) -> None:
        self.size, self.fail_at = size, fail_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, int]:
        if index == self.fail_at:
            raise ValueError(f"sample {index} is corrupt")
        return index, os.getpid()


def sharded_loaders(size: int, world: int, *, rank_of=lambda r: r, drop_last: bool = False, shuffle: bool = False,
                    batch_size: int = 2, num_workers: int = 0) -> dict[int, DataLoader[int]]:
    dataset = IndexDataset(size)
    return {
        r: DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=tp.tag_workers(),
                      sampler=DistributedSampler(dataset, num_replicas=world, rank=rank_of(r), shuffle=shuffle,
                                                 drop_last=drop_last))
        for r in range(world)
    }


def observed(result: tp.Result) -> list[tuple[object, ...]]:
    return [(v.kind, v.epoch, v.rank, v.position, v.sample_id, v.worker) for v in result.violations]


class TestReports(tp.TestCase):
    """One snapshot per violation kind: the first-violation report users see."""

    def test_same_rank_duplicate_names_the_replaying_workers(self) -> None:
        loader = DataLoader(Replayed(4), batch_size=2, num_workers=2, collate_fn=tp.tag_workers())
        result = tp.check_coverage({0: loader}, policy=tp.ExactlyOnce(range(4)))
        self.assertEqual(result.outcome, tp.Outcome.FAIL)
        self.assertEqual(result.counts, {"same_rank_duplicate": 4})
        self.assertEqual({v.worker for v in result.violations}, {1})
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: FAIL at coverage.same_rank_duplicate (epoch 0, rank 0, sample 0)
config: epochs=[0], policy=['ExactlyOnce(range(0, 4))'], ranks=[0]

First violation: coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 2, sample 0, kind: same_rank_duplicate)
  Sample 0 was observed again by rank 0 at position 2 (batch 1, worker 1) of epoch 0; rank 0 first observed it at position 0 (batch 0, worker 0).
  Workers 0 and 1 of rank 0 both produced it: a DataLoader over an IterableDataset replays the data in every worker unless the dataset shards it with torch.utils.data.get_worker_info().

All violations (4):
  1. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 2, sample 0, kind: same_rank_duplicate)
  2. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 3, sample 1, kind: same_rank_duplicate)
  3. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 6, sample 2, kind: same_rank_duplicate)
  4. coverage.same_rank_duplicate (epoch 0, rank 0, worker 1, position 7, sample 3, kind: same_rank_duplicate)""")

    def test_cross_rank_duplicate_every_rank_built_with_rank_0(self) -> None:
        loaders = sharded_loaders(8, 2, rank_of=lambda r: 0)
        result = tp.check_coverage(loaders, policy=tp.ExactlyOnce(range(8)), sample_ids=lambda b: b)
        self.assertEqual(result.counts, {"cross_rank_duplicate": 4, "missing_id": 4})
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: FAIL at coverage.cross_rank_duplicate (epoch 0, rank 1, sample 0)
config: epochs=[0], policy=['ExactlyOnce(range(0, 8))'], ranks=[0, 1]

First violation: coverage.cross_rank_duplicate (epoch 0, rank 1, position 0, sample 0, kind: cross_rank_duplicate)
  Sample 0 was observed by rank 1 at position 0 (batch 0) of epoch 0, but rank 0 at position 0 (batch 0) observed it first.

All violations (8):
  1. coverage.cross_rank_duplicate (epoch 0, rank 1, position 0, sample 0, kind: cross_rank_duplicate)
  2. coverage.cross_rank_duplicate (epoch 0, rank 1, position 1, sample 2, kind: cross_rank_duplicate)
  3. coverage.cross_rank_duplicate (epoch 0, rank 1, position 2, sample 4, kind: cross_rank_duplicate)
  4. coverage.cross_rank_duplicate (epoch 0, rank 1, position 3, sample 6, kind: cross_rank_duplicate)
  5. coverage.missing_id (epoch 0, sample 1, kind: missing_id)
  6. coverage.missing_id (epoch 0, sample 3, kind: missing_id)
  7. coverage.missing_id (epoch 0, sample 5, kind: missing_id)
  8. coverage.missing_id (epoch 0, sample 7, kind: missing_id)

Notes:
  - epoch 0: ranks 0, 1 saw the same samples in the same order: were their samplers built with the same rank (for example DistributedSampler(rank=0), or num_replicas/rank left to a process group that was not set up)?""")

    def test_missing_id_drop_last_loses_the_tail(self) -> None:
        loaders = sharded_loaders(7, 3, drop_last=True)
        result = tp.check_coverage(loaders, policy=tp.ExactlyOnce(range(7)))
        self.assertEqual(observed(result), [("missing_id", 0, None, None, 6, None)])
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: FAIL at coverage.missing_id (epoch 0, sample 6)
config: epochs=[0], policy=['ExactlyOnce(range(0, 7))'], ranks=[0, 1, 2]

First violation: coverage.missing_id (epoch 0, sample 6, kind: missing_id)
  Sample 6 of the universe was observed by no rank in epoch 0.""")

    def test_unexpected_id(self) -> None:
        result = tp.check_coverage({0: [[0, 1]], 1: [[2, 10]]}, policy=tp.AtLeastOnce(range(3)))
        self.assertEqual(observed(result), [("unexpected_id", 0, 1, 1, 10, None)])
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: FAIL at coverage.unexpected_id (epoch 0, rank 1, sample 10)
config: epochs=[0], policy=['AtLeastOnce(range(0, 3))'], ranks=[0, 1]

First violation: coverage.unexpected_id (epoch 0, rank 1, position 1, sample 10, kind: unexpected_id)
  Sample 10 was observed by rank 1 at position 1 (batch 0) of epoch 0, but it is not in the universe range(0, 3).""")

    def test_padding_count(self) -> None:
        loaders = sharded_loaders(5, 4)  # pads 3 samples
        self.assertTrue(tp.check_coverage(loaders, policy=tp.ExpectedPadding(range(5), padding=3)).passed)
        result = tp.check_coverage(loaders, policy=tp.ExpectedPadding(range(5), padding=1))
        self.assertEqual([(v.kind, v.expected, v.actual) for v in result.violations], [("padding_count", 1, 3)])
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: FAIL at coverage.padding_count (epoch 0)
config: epochs=[0], policy=['ExpectedPadding(range(0, 5), padding=1)'], ranks=[0, 1, 2, 3]

First violation: coverage.padding_count (epoch 0, kind: padding_count)
  Epoch 0 has 3 observations beyond one per sample of the universe; ExpectedPadding declared padding=1.
  expected: 1
  actual:   3""")

    def test_repeated_epoch_order_set_epoch_forgotten(self) -> None:
        loaders = sharded_loaders(6, 2, shuffle=True)
        epochs = [{r: list(loader) for r, loader in loaders.items()} for _ in range(2)]  # no set_epoch
        result = tp.check_coverage(epochs, policy=[tp.ExactlyOnce(range(6)), tp.DistinctEpochOrder()])
        self.assertEqual(observed(result), [("repeated_epoch_order", 1, 0, None, None, None),
                                            ("repeated_epoch_order", 1, 1, None, None, None)])
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: FAIL at coverage.repeated_epoch_order (epoch 1, rank 0)
config: epochs=[0, 1], policy=['ExactlyOnce(range(0, 6))', 'DistinctEpochOrder()'], ranks=[0, 1]

First violation: coverage.repeated_epoch_order (epoch 1, rank 0, kind: repeated_epoch_order)
  Rank 0 observed the same 3 samples in the same order in epoch 1 as in epoch 0.
  Is sampler.set_epoch(epoch) called before each epoch? DistributedSampler shuffles with seed + epoch.

All violations (2):
  1. coverage.repeated_epoch_order (epoch 1, rank 0, kind: repeated_epoch_order)
  2. coverage.repeated_epoch_order (epoch 1, rank 1, kind: repeated_epoch_order)""")

    def test_abstain_without_universe(self) -> None:
        result = tp.check_coverage({0: [1, 2]}, policy=tp.ExactlyOnce(None))
        self.assertExpectedInline(result.report(), """\
trainparity coverage check: ABSTAIN
config: epochs=[0], policy=['ExactlyOnce(None)'], ranks=[0]
reason: ExactlyOnce: the universe is unknown (universe=None), so missing and unexpected IDs cannot be judged; declare it, e.g. tp.ExactlyOnce(range(len(dataset)))""")


class TestPolicies(unittest.TestCase):
    def test_torch_sharding_passes_exactly_once(self) -> None:
        result = tp.check_coverage(sharded_loaders(12, 4, shuffle=True), policy=tp.ExactlyOnce(range(12)))
        self.assertEqual((result.outcome, result.violations), (tp.Outcome.PASS, []))

    def test_observation_order_is_epoch_position_rank(self) -> None:
        result = tp.check_coverage({1: [[5, 7]], 0: [[6], [5]]}, policy=tp.ExactlyOnce(range(5, 8)))
        # rank 1 position 0 sees 5 after rank 0 position 0 (6): 5 is first at (0, rank 1); rank 0 repeats it later.
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 0, 1, 5, None)])
        self.assertIn("but rank 1 at position 0 (batch 0) observed it first", result.violations[0].message)

    def test_same_rank_versus_cross_rank(self) -> None:
        result = tp.check_coverage({0: [[1, 2, 1]], 1: [[1, 1]]}, policy=tp.ExactlyOnce(range(1, 3)))
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 1, 0, 1, None),
                                            ("same_rank_duplicate", 0, 1, 1, 1, None),
                                            ("same_rank_duplicate", 0, 0, 2, 1, None)])
        self.assertIn("rank 0 first observed it at position 0", result.violations[2].message)

    def test_no_cross_rank_overlap_allows_same_rank_repeats(self) -> None:
        self.assertTrue(tp.check_coverage({0: [[1, 1]], 1: [[2]]}, policy=tp.NoCrossRankOverlap()).passed)
        result = tp.check_coverage({0: [["a", "b"]], 1: [["b", "b"]]}, policy=tp.NoCrossRankOverlap())
        # rank 1 saw "b" at position 0, before rank 0 at position 1; rank 1's own repeat is allowed.
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 0, 1, "b", None)])

    def test_at_least_once_allows_repeats_and_reports_missing_in_universe_order(self) -> None:
        result = tp.check_coverage({0: [[3, 3, 9]]}, policy=tp.AtLeastOnce([9, 4, 3, 0]))
        self.assertEqual([v.sample_id for v in result.violations], [4, 0])
        self.assertEqual(result.counts, {"missing_id": 2})

    def test_windows_are_judged_separately_and_missing_ids_close_each_epoch(self) -> None:
        result = tp.check_coverage([{0: [0]}, {0: [0, 1]}], policy=tp.ExactlyOnce(range(2)))
        self.assertEqual(observed(result), [("missing_id", 0, None, None, 1, None)])
        result = tp.check_coverage([{0: [0, 0]}, {0: [1]}], policy=tp.ExactlyOnce(range(2)))
        self.assertEqual(observed(result), [("same_rank_duplicate", 0, 0, 1, 0, None),
                                            ("missing_id", 0, None, None, 1, None),
                                            ("missing_id", 1, None, None, 0, None)])

    def test_distinct_epoch_order(self) -> None:
        epochs = [{0: [[0, 1]], 1: [[2]]}, {0: [[1, 0]], 1: [[2]]}, {0: [0, 1], 1: [2]}]
        result = tp.check_coverage(epochs, policy=tp.DistinctEpochOrder())
        # rank 1's one-sample stream has a single order and is not judged; batching does not matter.
        self.assertEqual(observed(result), [("repeated_epoch_order", 2, 0, None, None, None)])
        self.assertIn("in epoch 2 as in epoch 0", result.violations[0].message)

    def test_distinct_epoch_order_abstains_on_one_epoch(self) -> None:
        result = tp.check_coverage({0: [0, 1]}, policy=tp.DistinctEpochOrder())
        self.assertEqual(result.outcome, tp.Outcome.ABSTAIN)
        self.assertIn("one epoch was observed", result.reason or "")

    def test_a_violation_wins_over_an_abstaining_policy(self) -> None:
        result = tp.check_coverage({0: [1], 1: [1]}, policy=[tp.ExactlyOnce(None), tp.NoCrossRankOverlap()])
        self.assertEqual(result.outcome, tp.Outcome.FAIL)
        self.assertTrue(any(note.startswith("not judged: ExactlyOnce") for note in result.notes))

    def test_identical_rank_streams_are_diagnosed(self) -> None:
        result = tp.check_coverage(sharded_loaders(4, 2, rank_of=lambda r: 0), policy=tp.NoCrossRankOverlap())
        self.assertEqual(len(result.notes), 1)
        self.assertIn("ranks 0, 1 saw the same samples in the same order", result.notes[0])

    def test_distributed_sampler_padding_is_diagnosed(self) -> None:
        result = tp.check_coverage(sharded_loaders(10, 4, shuffle=True), policy=tp.ExactlyOnce(range(10)))
        self.assertEqual(result.counts, {"cross_rank_duplicate": 2})
        self.assertIn("declare it: tp.ExpectedPadding(universe, padding=2)", result.notes[0])
        result = tp.check_coverage({0: [[0, 1]], 1: [[1, 0]]}, policy=tp.ExactlyOnce(range(2)))  # every rank repeats
        self.assertEqual((result.counts, result.notes), ({"cross_rank_duplicate": 2}, []))

    def test_universe_forms(self) -> None:
        ids = {0: [[4, 2]], 1: [[0, 6]]}
        universes = (range(0, 8, 2), [0, 2, 4, 6], {6, 4, 2, 0}, np.array([0, 2, 4, 6]), torch.tensor([6, 4, 2, 0]),
                     (x for x in [0, 2, 4, 6]), [6, 2, 0, 4, 10**15])
        for universe in universes:
            with self.subTest(universe=type(universe).__name__):
                policy = tp.AtLeastOnce(universe)
                missing = [10**15] if isinstance(universe, list) and len(universe) == 5 else []
                result = tp.check_coverage(ids, policy=policy)
                self.assertEqual([v.sample_id for v in result.violations], missing)
                self.assertEqual(result.passed, not missing)
                # the same policy object judges again: a one-shot iterator universe was kept, not used up
                self.assertEqual(tp.check_coverage(ids, policy=policy).violations, result.violations)

    def test_large_sparse_ids(self) -> None:
        result = tp.check_coverage({0: [[2**62, -(2**62)]], 1: [[2**62]]}, policy=tp.NoCrossRankOverlap())
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 1, 0, 2**62, None)])
        result = tp.check_coverage({0: [[2**62, -(2**62)]]}, policy=tp.ExactlyOnce([-(2**62), 5, 2**62]))
        self.assertEqual(observed(result), [("missing_id", 0, None, None, 5, None)])

    def test_universes_spanning_2_to_the_63_or_more(self) -> None:
        top, bottom = 2**63 - 1, -(2**63)
        cases = [
            ({0: [[-(2**62), 2**62]]}, tp.AtLeastOnce([-(2**62), 2**62]), []),
            ({0: [[bottom, top]], 1: [[0]]}, tp.ExactlyOnce([top, bottom]), [("unexpected_id", 0, 1, 0, 0, None)]),
            ({0: [[2**62, -(2**62), 3]]}, tp.ExactlyOnce(range(-(2**62), 2**62 + 1, 2**62)),
             [("unexpected_id", 0, 0, 2, 3, None), ("missing_id", 0, None, None, 0, None)]),
            ({0: [[0, bottom]]}, tp.AtLeastOnce([top, 0, -top]),
             [("unexpected_id", 0, 0, 1, bottom, None), ("missing_id", 0, None, None, top, None),
              ("missing_id", 0, None, None, -top, None)]),
            ({0: [[top, bottom + 1]]}, tp.ExactlyOnce(range(top, bottom, -top)),
             [("missing_id", 0, None, None, 0, None)]),
            ({0: [[top, 5]], 1: [[bottom, top]]}, tp.NoCrossRankOverlap(), [("cross_rank_duplicate", 0, 1, 1, top, None)]),
        ]
        for ranks, policy, expected in cases:
            with self.subTest(policy=repr(policy)):
                self.assertEqual(observed(tp.check_coverage(ranks, policy=policy)), expected)
        with self.assertRaisesRegex(ValueError, "holds 18446744073709551615 IDs; a universe holds at most 2"):
            tp.check_coverage({0: [[0]]}, policy=tp.ExactlyOnce(range(bottom, top)))

    def test_string_ids(self) -> None:
        result = tp.check_coverage({0: [["b", "a"], "c"], 1: [np.array(["a", "z"])]},
                                   policy=tp.ExactlyOnce(["a", "b", "c", "d"]))
        # rank 1 saw "a" at position 0, before rank 0 at position 1.
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 0, 1, "a", None),
                                            ("unexpected_id", 0, 1, 1, "z", None),
                                            ("missing_id", 0, None, None, "d", None)])

    def test_to_json_is_deterministic_and_has_counts(self) -> None:
        result = tp.check_coverage({0: [[0, 0]]}, policy=tp.ExactlyOnce(range(2)))
        document = json.loads(result.to_json())
        self.assertEqual(document["counts"], {"missing_id": 1, "same_rank_duplicate": 1})
        self.assertEqual(document["first_violation"]["path"], "coverage.same_rank_duplicate")
        self.assertEqual(result.to_json(), tp.check_coverage({0: [[0, 0]]}, policy=tp.ExactlyOnce(range(2))).to_json())

    def test_max_violations_lists_the_first_and_counts_all(self) -> None:
        result = tp.check_coverage({0: [[0] * 5]}, policy=tp.ExactlyOnce(range(3)), max_violations=2)
        self.assertEqual([v.kind for v in result.violations], ["same_rank_duplicate"] * 2)
        self.assertIn("listed the first 2 of 6 violations", result.notes[-1])
        self.assertIn("missing_id=2, same_rank_duplicate=4", result.notes[-1])

    def test_a_universe_far_larger_than_the_observations(self) -> None:
        ranks = [{0: [[5, 3]], 1: [[3]]}, {0: [[0, 10**12 - 1]], 1: []}]
        result = tp.check_coverage(ranks, policy=tp.ExactlyOnce(range(10**12)), max_violations=4)
        self.assertEqual(result.outcome, tp.Outcome.FAIL)
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 0, 1, 3, None),
                                            ("missing_id", 0, None, None, 0, None),
                                            ("missing_id", 0, None, None, 1, None),
                                            ("missing_id", 0, None, None, 2, None)])
        self.assertIn("listed the first 4 of 1999999999997 violations (max_violations=4); all of them: "
                      "cross_rank_duplicate=1, missing_id=1999999999996", result.notes[-1])
        # the missing IDs come from the gaps between the observed ones, in universe order, in every epoch
        result = tp.check_coverage([{0: [[14, 5]]}, {0: [[]]}], policy=tp.AtLeastOnce(range(5, 3 * 10**12, 3)),
                                   max_violations=5)
        self.assertEqual([(v.epoch, v.sample_id) for v in result.violations],
                         [(0, 8), (0, 11), (0, 17), (0, 20), (0, 23)])
        self.assertIn("of 1999999999996 violations (max_violations=5); all of them: missing_id=1999999999996",
                      result.notes[-1])
        result = tp.check_coverage({0: [[7, 7, 8]]}, policy=tp.ExpectedPadding(range(10**12), padding=2),
                                   max_violations=1)
        self.assertEqual(result.counts, {"missing_id": 1})
        self.assertIn("missing_id=999999999998, padding_count=1", result.notes[-1])

    def test_at_most_a_million_violations_are_listed_by_default(self) -> None:
        self.assertEqual(tp._coverage._check.DEFAULT_MAX_VIOLATIONS, 1_000_000)
        with mock.patch.object(tp._coverage._check, "DEFAULT_MAX_VIOLATIONS", 3):
            result = tp.check_coverage({0: [[1, 1]]}, policy=tp.ExactlyOnce(range(10**12)))
        self.assertEqual(observed(result), [("same_rank_duplicate", 0, 0, 1, 1, None),
                                            ("missing_id", 0, None, None, 0, None),
                                            ("missing_id", 0, None, None, 2, None)])
        self.assertNotIn("max_violations", result.config)
        self.assertIn("listed the first 3 of 1000000000000 violations (at most 3 are listed when "
                      "max_violations=None); all of them: missing_id=999999999999, same_rank_duplicate=1",
                      result.notes[-1])


class TestInputs(unittest.TestCase):
    def test_iterables(self) -> None:
        dataset = IndexDataset(6)
        samplers = {r: DistributedSampler(dataset, num_replicas=2, rank=r, shuffle=False) for r in range(2)}
        batch_samplers = {r: BatchSampler(s, batch_size=2, drop_last=False) for r, s in samplers.items()}
        loaders = sharded_loaders(6, 2, num_workers=2)
        for ranks in (samplers, batch_samplers, loaders, {0: [torch.tensor([0, 2]), np.array([4])], 1: [(1, 3, 5)]}):
            with self.subTest(type(ranks[0]).__name__):
                self.assertTrue(tp.check_coverage(ranks, policy=tp.ExactlyOnce(range(6))).passed)

    def test_positions_and_batches_count_within_each_rank_stream(self) -> None:
        loader = DataLoader(IndexDataset(5), batch_size=2, sampler=SequentialSampler(range(5)), num_workers=2,
                            collate_fn=tp.tag_workers())
        result = tp.check_coverage({3: loader}, policy=tp.ExactlyOnce(range(4)))
        self.assertEqual(observed(result), [("unexpected_id", 0, 3, 4, 4, 0)])
        self.assertIn("rank 3 at position 4 (batch 2, worker 0)", result.violations[0].message)

    def test_a_pipeline_that_refills_its_batch_buffer(self) -> None:
        def refilled():  # type: ignore[no-untyped-def]
            buffer = np.zeros(2, dtype=np.int64)
            for start in (0, 2, 4):
                buffer[:] = [start, start + 1]
                yield buffer

        self.assertTrue(tp.check_coverage({0: refilled()}, policy=tp.ExactlyOnce(range(6))).passed)
        result = tp.check_coverage({0: [["a"], np.array(["bbbbbb", "cc"])], 1: ["bbbbbb"]},
                                   policy=tp.NoCrossRankOverlap())
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 0, 1, "bbbbbb", None)])

    def test_batches_of_every_integer_form_are_read_whole_and_in_order(self) -> None:
        class Ids(torch.Tensor):
            pass

        def forms():  # type: ignore[no-untyped-def]
            refilled = torch.zeros(2, dtype=torch.int64)
            yield torch.tensor([0, 1])  # contiguous int64 on the CPU: copied by address
            yield torch.arange(2, 8)[::2]  # a strided view: 2, 4, 6
            yield torch.tensor([[3, 5], [7, 8]])
            yield torch.tensor(9)
            yield torch.tensor([10, 11], dtype=torch.int32)
            yield torch.tensor([12], dtype=torch.uint8)
            yield torch.tensor([], dtype=torch.int64)
            yield torch.tensor([13, 14]).as_subclass(Ids)
            yield torch.arange(40, dtype=torch.int64)[15:17]  # a view at an offset into a larger storage
            yield np.arange(17, 23, dtype=np.int32)[::2]  # 17, 19, 21
            yield np.array([18, 20, 22])
            for start in (23, 25):  # one tensor, refilled before it is yielded again
                refilled[:] = torch.tensor([start, start + 1])
                yield refilled

        expected = [0, 1, 2, 4, 6, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 21, 18, 20, 22, 23, 24, 25, 26]
        self.assertTrue(tp.check_coverage({0: forms()}, policy=tp.ExactlyOnce(range(27))).passed)
        result = tp.check_coverage({0: forms(), 1: forms()}, policy=tp.ExactlyOnce(range(27)))
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 1, position, sample, None)
                                            for position, sample in enumerate(expected)])

    def test_a_length_hint_that_raises_or_lies_changes_nothing(self) -> None:
        class Hinted:
            def __init__(self, hint: object) -> None:
                self.hint, self.batches = hint, iter([torch.tensor([0, 1]), torch.tensor([2])])

            def __iter__(self) -> Hinted:
                return self

            def __next__(self) -> torch.Tensor:
                return next(self.batches)

            def __length_hint__(self) -> int:
                if isinstance(self.hint, Exception):
                    raise self.hint
                return int(self.hint)  # type: ignore[call-overload]

        for hint in (ValueError("no hint"), 0, 1, 10**12):
            with self.subTest(hint=repr(hint)):
                self.assertTrue(tp.check_coverage({0: Hinted(hint)}, policy=tp.ExactlyOnce(range(3))).passed)

    def test_sample_ids_extracts_from_structured_batches(self) -> None:
        batches = [{"x": torch.zeros(2), "idx": torch.tensor([0, 1])}, {"x": torch.zeros(1), "idx": torch.tensor([2])}]
        self.assertTrue(tp.check_coverage({0: batches}, policy=tp.ExactlyOnce(range(3)),
                                          sample_ids=lambda b: b["idx"]).passed)

    def test_bad_ids_are_a_type_error_naming_the_batch_and_position(self) -> None:
        cases = [
            ([[0, 1], [2, 0.5]], "epoch 0, rank 0, batch 1: sample ID at position 1 is float 0.5"),
            ([[0, None]], "epoch 0, rank 0, batch 0: sample ID at position 1 is NoneType None"),
            ([[[0, 1]]], "epoch 0, rank 0, batch 0: sample ID at position 0 is list [0, 1]"),
            ([[True]], "batch 0: sample ID at position 0 is bool True"),
            ([torch.tensor([0.0])], "batch 0: sample IDs must be integers or strings, got a torch.float32 tensor"),
            ([[0], ["a"]], "batch 1 has str IDs but epoch 0, rank 0, batch 0 has int IDs"),
            ([["a"], torch.tensor([0, 1])], "batch 1 has int IDs but epoch 0, rank 0, batch 0 has str IDs"),
            ([["a"], np.array([0, 1])], "batch 1 has int IDs but epoch 0, rank 0, batch 0 has str IDs"),
            ([[], torch.tensor([], dtype=torch.int64), ["a"], torch.tensor([0])],
             "batch 3 has int IDs but epoch 0, rank 0, batch 2 has str IDs"),
            ([3.5], "batch 0: sample_ids() must return a sequence of IDs, got float"),
            # a batch of several fields, passed without sample_ids=: its keys or fields are not IDs
            ([{"idx": torch.tensor([0, 1]), "x": torch.zeros(2)}], "got a dict with keys ['idx', 'x']; extract the "
             "IDs from the batch with sample_ids, e.g. lambda batch: batch['idx']"),
            ([(torch.tensor([0, 1]), torch.zeros(2))], "IDs must be ints or strings; a batch of several fields? "
             "extract the IDs with sample_ids, e.g. lambda batch: batch[0]"),
        ]
        for batches, message in cases:
            with self.subTest(message), self.assertRaises(TypeError) as caught:
                tp.check_coverage({0: batches}, policy=tp.NoCrossRankOverlap())
            self.assertIn(message, str(caught.exception))

    def test_a_mapping_universe_is_its_keys(self) -> None:
        self.assertTrue(tp.check_coverage({0: [[0, 1]]}, policy=tp.ExactlyOnce({0: "a", 1: "b"})).passed)

    def test_universe_and_ids_of_different_kinds(self) -> None:
        with self.assertRaisesRegex(TypeError, "the universe holds int IDs but the observed IDs are strs"):
            tp.check_coverage({0: [["a"]]}, policy=tp.ExactlyOnce(range(3)))

    def test_misuse(self) -> None:
        cases = [
            (lambda: tp.check_coverage({0: [1]}, policy=tp.NoCrossRankOverlap), TypeError, "pass an instance"),
            (lambda: tp.check_coverage({0: [1]}, policy="exactly once"), TypeError, "policy= must be"),
            (lambda: tp.check_coverage({0: [1]}, policy=[]), ValueError, "empty list"),
            (lambda: tp.ExactlyOnce(10), TypeError, r"pass range\(10\)"),
            (lambda: tp.ExactlyOnce("abc"), TypeError, "collection of IDs"),
            (lambda: tp.ExpectedPadding(range(3), padding=-1), ValueError, "int >= 0"),
            (lambda: tp.check_coverage({0: [1]}, policy=tp.ExactlyOnce([1, 2, 1])), ValueError, "lists ID 1 more"),
            (lambda: tp.check_coverage({0: [1]}, policy=tp.ExactlyOnce(range(2**64))), ValueError, "beyond int64"),
            (lambda: tp.check_coverage({"a": [1]}, policy=tp.NoCrossRankOverlap()), TypeError,
             r"ranks= keys must be an int >= 0 \(ranks, in epoch 0\), got 'a'"),
            (lambda: tp.check_coverage({0: 5}, policy=tp.NoCrossRankOverlap()), TypeError, "iterable of batches"),
            (lambda: tp.check_coverage({}, policy=tp.NoCrossRankOverlap()), ValueError, "maps no rank"),
            (lambda: tp.check_coverage([], policy=tp.NoCrossRankOverlap()), ValueError, "empty sequence"),
            (lambda: tp.check_coverage([[1]], policy=tp.NoCrossRankOverlap()), TypeError, "must be a mapping"),
            (lambda: tp.check_coverage({0: [1]}, policy=[tp.ExactlyOnce(range(3)), tp.AtLeastOnce(range(4))]),
             ValueError, "different universes"),
            (lambda: tp.check_coverage({0: [1]}, policy=tp.NoCrossRankOverlap(), max_violations=0), ValueError,
             "max_violations"),
        ]
        for call, error, pattern in cases:
            with self.subTest(pattern), self.assertRaisesRegex(error, pattern):
                call()

    def test_user_code_errors_are_an_error_result(self) -> None:
        def broken():  # type: ignore[no-untyped-def]
            yield [0]
            raise RuntimeError("the loader broke")

        result = tp.check_coverage({0: [[0]], 1: broken()}, policy=tp.NoCrossRankOverlap())
        self.assertEqual(result.outcome, tp.Outcome.ERROR)
        assert result.error is not None
        self.assertEqual((result.error.phase, result.error.exc_type, result.error.rank),
                         ("epoch 0, rank 1, batch 1", "RuntimeError", 1))
        self.assertIsInstance(result.exception, RuntimeError)
        result = tp.check_coverage({0: [[0]]}, policy=tp.NoCrossRankOverlap(), sample_ids=lambda b: b["idx"])
        assert result.error is not None
        self.assertEqual((result.error.phase, result.error.exc_type), ("sample_ids() at epoch 0, rank 0, batch 0",
                                                                       "TypeError"))

    def test_an_error_result_does_not_keep_the_users_iterators_alive(self) -> None:
        closed = []

        def batches():  # type: ignore[no-untyped-def]
            try:
                yield from ([i] for i in range(10))
            finally:
                closed.append(True)

        def ids(batch):  # type: ignore[no-untyped-def]
            if int(batch[0]) == 2:
                raise RuntimeError("bad batch")
            return batch

        result = tp.check_coverage({0: batches()}, policy=tp.NoCrossRankOverlap(), sample_ids=ids)
        self.assertEqual(result.outcome, tp.Outcome.ERROR)
        self.assertEqual(closed, [True])  # the generator's cleanup ran, though the result keeps the traceback
        loader = DataLoader(IndexDataset(16), batch_size=2, num_workers=1)
        before = set(multiprocessing.active_children())
        result = tp.check_coverage({0: loader}, policy=tp.NoCrossRankOverlap(), sample_ids=ids)
        self.assertEqual(result.outcome, tp.Outcome.ERROR)
        self.assertEqual(set(multiprocessing.active_children()) - before, set())  # the DataLoader's worker stopped

    def test_ids_that_raise_while_they_are_read_are_an_error_result(self) -> None:
        def lookup_fails(batch):  # type: ignore[no-untyped-def]
            yield batch[0]
            raise LookupError("no such sample")

        class Unreadable:
            def __iter__(self):  # type: ignore[no-untyped-def]
                raise KeyError("shard")

        cases = [
            ({0: [[0, 1]]}, lookup_fails, "sample_ids() at epoch 0, rank 0, batch 0", "LookupError"),
            ({0: [[0]], 1: [[1], Unreadable()]}, None, "epoch 0, rank 1, batch 1", "KeyError"),
            ({0: [[0]]}, lambda batch: map(lambda i: 1 // (i - i), batch), "sample_ids() at epoch 0, rank 0, batch 0",
             "ZeroDivisionError"),
        ]
        for ranks, sample_ids, phase, exc_type in cases:
            with self.subTest(phase=phase, exc_type=exc_type):
                result = tp.check_coverage(ranks, policy=tp.NoCrossRankOverlap(), sample_ids=sample_ids)
                self.assertEqual(result.outcome, tp.Outcome.ERROR, result.report())
                assert result.error is not None
                self.assertEqual((result.error.phase, result.error.exc_type), (phase, exc_type))
                self.assertEqual(type(result.exception).__name__, exc_type)
        # IDs read from a generator are judged like any others; IDs of the wrong type stay a TypeError
        result = tp.check_coverage({0: [[0, 1]], 1: [[1]]}, policy=tp.NoCrossRankOverlap(),
                                   sample_ids=lambda batch: (i for i in batch))
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 0, 1, 1, None)])

        class BadRepr:
            def __repr__(self) -> str:
                raise RuntimeError("repr")

        for ids, message in (((i / 2 for i in range(2)), "batch 0: sample ID at position 0 is float 0.0"),
                             ([0, BadRepr()], "batch 0: sample ID at position 1 is BadRepr <BadRepr object>")):
            with self.subTest(message), self.assertRaises(TypeError) as caught:
                tp.check_coverage({0: [ids]}, policy=tp.NoCrossRankOverlap())
            self.assertIn(message, str(caught.exception))

    def test_nothing_is_read_when_no_policy_can_be_judged(self) -> None:
        read = []

        def endless():  # type: ignore[no-untyped-def]
            for i in range(1000):  # endless in spirit; bounded so that a regression fails instead of hanging
                read.append(i)
                yield [i]
            raise AssertionError("the stream ran out")

        result = tp.check_coverage({0: endless()}, policy=tp.ExactlyOnce(None))
        self.assertEqual((result.outcome, read), (tp.Outcome.ABSTAIN, []))
        self.assertIn("the universe is unknown", result.reason or "")
        result = tp.check_coverage({0: endless(), 1: endless()},
                                   policy=[tp.AtLeastOnce(None), tp.DistinctEpochOrder()])
        self.assertEqual((result.outcome, read), (tp.Outcome.ABSTAIN, []))
        self.assertIn("one epoch was observed", result.reason or "")
        self.assertEqual(result.config["ranks"], [0, 1])

    def test_an_error_result_lets_the_dataloader_workers_go(self) -> None:
        pids: set[int] = set()

        def ids(batch):  # type: ignore[no-untyped-def]
            pids.update(batch[1].tolist())
            return batch[0]

        loader = DataLoader(FailingAt(16, fail_at=12), batch_size=2, num_workers=2)
        result = tp.check_coverage({0: loader}, policy=tp.NoCrossRankOverlap(), sample_ids=ids)
        try:
            self.assertEqual(result.outcome, tp.Outcome.ERROR)
            assert result.error is not None and result.exception is not None
            self.assertEqual((result.error.phase, result.error.exc_type), ("epoch 0, rank 0, batch 6", "ValueError"))
            self.assertIn("sample 12 is corrupt", result.error.traceback)
            self.assertEqual(len(pids), 2)  # both workers loaded batches before the failure
            self.assertIsNotNone(result.exception.__traceback__)  # kept, with its lines, but not its locals
            self.assertEqual(still_running(sorted(pids), grace=10.0), [])
        finally:
            del result
            gc.collect()

    def test_an_iterable_that_is_its_own_iterator_is_not_closed_between_epochs(self) -> None:
        class Stream:
            """Restarts on iter(); close() ends it for good (as a streaming loader that owns a pool might)."""

            def __init__(self) -> None:
                self.position, self.closed = 0, False

            def __iter__(self):  # type: ignore[no-untyped-def]
                self.position = 0
                return self

            def __next__(self) -> list[int]:
                if self.closed:
                    raise RuntimeError("closed")
                if self.position == 2:
                    raise StopIteration
                self.position += 1
                return [self.position - 1]

            def close(self) -> None:
                self.closed = True

        stream = Stream()
        result = tp.check_coverage([{0: stream}, {0: stream}], policy=tp.ExactlyOnce(range(2)))
        self.assertTrue(result.passed, result.report())


class TestQuickstart(unittest.TestCase):
    def test_clean_setup_passes_and_same_shard_fails(self) -> None:
        from trainparity.quickstarts import coverage

        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(coverage.main(), 0)
        self.assertIn("trainparity coverage check: PASS", out.getvalue())
        self.assertIn("First violation: coverage.cross_rank_duplicate", out.getvalue())


class TestAssertCoverage(tp.TestCase):
    def test_pass_returns_the_result(self) -> None:
        result = self.assertCoverage({0: [0, 2], 1: [1]}, policy=tp.ExactlyOnce(range(3)))
        self.assertTrue(result.passed)

    def test_fail_raises_with_the_report(self) -> None:
        with self.assertRaises(AssertionError) as caught:
            self.assertCoverage({0: [0], 1: [0]}, policy=tp.ExactlyOnce(range(1)))
        self.assertIn("First violation: coverage.cross_rank_duplicate", str(caught.exception))
        with self.assertRaises(AssertionError) as caught:  # unittest's longMessage: msg= follows the report
            self.assertCoverage({0: [0], 1: [0]}, policy=tp.ExactlyOnce(range(1)), msg="my message")
        self.assertTrue(str(caught.exception).startswith("trainparity coverage check: FAIL at coverage."))
        self.assertTrue(str(caught.exception).endswith("\n\nmy message"))

    def test_error_reraises_the_users_exception(self) -> None:
        with self.assertRaisesRegex(KeyError, "idx"):
            self.assertCoverage({0: [{"id": 0}]}, policy=tp.NoCrossRankOverlap(), sample_ids=lambda b: b["idx"])


if __name__ == "__main__":
    unittest.main()
