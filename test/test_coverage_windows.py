"""An epoch observed in several windows: a job preempted mid-epoch on 4 ranks, resumed on 2.

Windows of one epoch are judged together: each sample exactly once per epoch across the change
of world size, each observation naming its rank and its position in that rank's stream over the
epoch's windows. The same holds for the CoverageRecorders of the two jobs, merged.
"""

from __future__ import annotations

import itertools
import pickle
import unittest
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

import trainparity as tp
from trainparity.strategies import IndexDataset

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]

SIZE, SEED, EPOCH, BATCH = 48, 7, 1, 3
BEFORE, AFTER = 4, 2  # world sizes before and after the preemption
STEPS_BEFORE = 2  # batches each rank trained before the preemption


class ResumedSampler(Sampler[int]):
    """DistributedSampler's epoch order (seed + epoch, shuffled), resumed mid-epoch on another world size.

    As a StatefulDataLoader-like resume does: skip the first `consumed` samples of the epoch's order
    (what the whole old world read: world size x steps x batch size), deal the rest over the new ranks.
    """

    def __init__(self, size: int, num_replicas: int, rank: int, *, seed: int, consumed: int) -> None:
        self.size, self.num_replicas, self.rank, self.seed, self.consumed = size, num_replicas, rank, seed, consumed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        return iter(order[self.consumed:][self.rank::self.num_replicas])


def epoch_order() -> list[int]:
    return torch.randperm(SIZE, generator=torch.Generator().manual_seed(SEED + EPOCH)).tolist()


def before_preemption() -> dict[int, list[torch.Tensor]]:
    """What each of the 4 ranks trained on in the epoch before the job was stopped."""
    dataset = IndexDataset(SIZE)
    ranks = {}
    for rank in range(BEFORE):
        sampler = DistributedSampler(dataset, num_replicas=BEFORE, rank=rank, shuffle=True, seed=SEED)
        sampler.set_epoch(EPOCH)
        ranks[rank] = list(itertools.islice(DataLoader(dataset, batch_size=BATCH, sampler=sampler), STEPS_BEFORE))
    return ranks


def after_resume(consumed: int) -> dict[int, DataLoader[int]]:
    """The 2 ranks of the resumed job, reading the rest of the epoch."""
    dataset = IndexDataset(SIZE)
    loaders = {}
    for rank in range(AFTER):
        sampler = ResumedSampler(SIZE, AFTER, rank, seed=SEED, consumed=consumed)
        sampler.set_epoch(EPOCH)
        loaders[rank] = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    return loaders


CONSUMED = BEFORE * STEPS_BEFORE * BATCH  # 24: what the 4 ranks read together


def observed(result: tp.Result) -> list[tuple[object, ...]]:
    return [(v.kind, v.epoch, v.rank, v.position, v.sample_id) for v in result.violations]


class TestPreemptedEpoch(unittest.TestCase):
    def check(self, consumed: int) -> tp.CoverageResult:
        windows = [(EPOCH, before_preemption()), (EPOCH, after_resume(consumed))]
        return tp.check_coverage(windows, policy=tp.ExactlyOnce(range(SIZE)))

    def test_a_clean_resume_on_fewer_ranks_covers_the_epoch_once(self) -> None:
        result = self.check(CONSUMED)
        self.assertEqual(result.outcome, tp.Outcome.PASS, result.report())
        self.assertEqual(result.config["epochs"], [EPOCH])
        self.assertEqual(result.config["windows"], [{"epoch": EPOCH, "ranks": [0, 1, 2, 3]},
                                                    {"epoch": EPOCH, "ranks": [0, 1]}])
        # the two windows are one epoch: judged apart, each would miss what the other read
        apart = tp.check_coverage([before_preemption(), after_resume(CONSUMED)], policy=tp.ExactlyOnce(range(SIZE)))
        self.assertEqual(apart.counts, {"missing_id": SIZE})

    def test_a_resume_that_counts_one_ranks_samples_replays_the_rest(self) -> None:
        order = epoch_order()
        result = self.check(STEPS_BEFORE * BATCH)  # the bug: 6 (one rank's) instead of 24 (the world's)
        self.assertEqual(result.outcome, tp.Outcome.FAIL)
        self.assertEqual(sum(result.counts.values()), CONSUMED - STEPS_BEFORE * BATCH)  # 18 replayed, none missing
        self.assertNotIn("missing_id", result.counts)
        # rank 0 of the new job goes on at position 6 of its stream (batch 2): it reads order[6], which rank 2 of
        # the old job read at position 1; order[8] it read itself, at position 2
        self.assertEqual(observed(result)[:3], [("cross_rank_duplicate", EPOCH, 0, 6, order[6]),
                                                ("cross_rank_duplicate", EPOCH, 1, 6, order[7]),
                                                ("same_rank_duplicate", EPOCH, 0, 7, order[8])])
        self.assertIn(f"Sample {order[6]} was observed by rank 0 at position 6 (batch 2) of epoch {EPOCH}, but rank 2 "
                      "at position 1 (batch 0) observed it first.", result.violations[0].message)
        self.assertIn("rank 0 first observed it at position 2 (batch 0)", result.violations[2].message)

    def test_a_resume_that_skips_a_step_misses_its_samples(self) -> None:
        order = epoch_order()
        result = self.check(CONSUMED + BEFORE * BATCH)  # one step too many
        self.assertEqual(result.counts, {"missing_id": BEFORE * BATCH})
        self.assertEqual([v.sample_id for v in result.violations], sorted(order[CONSUMED:CONSUMED + BEFORE * BATCH]))

    def test_the_recorders_of_both_jobs_merge_into_one_epoch(self) -> None:
        def record(ranks: dict[int, list[torch.Tensor]] | dict[int, DataLoader[int]]) -> list[tp.CoverageRecorder]:
            records = []
            for rank, batches in ranks.items():
                recorder = tp.CoverageRecorder(rank=rank)
                recorder.set_epoch(EPOCH)
                for batch in batches:
                    recorder.record(batch)
                records.append(pickle.loads(pickle.dumps(recorder)))  # as all-gathered
            return records

        first_job = record(before_preemption())
        for consumed, counts in ((CONSUMED, {}), (CONSUMED + BEFORE * BATCH, {"missing_id": BEFORE * BATCH})):
            with self.subTest(consumed=consumed):
                merged = tp.CoverageRecorder.merge(first_job + record(after_resume(consumed)))
                self.assertEqual((merged.ranks, merged.epochs), ([0, 1, 2, 3], [EPOCH]))
                result = tp.check_coverage(merged, policy=tp.ExactlyOnce(range(SIZE)))
                self.assertEqual(result.counts, counts, result.report())
        replayed = tp.CoverageRecorder.merge(first_job + record(after_resume(STEPS_BEFORE * BATCH)))
        windows = [(EPOCH, before_preemption()), (EPOCH, after_resume(STEPS_BEFORE * BATCH))]
        self.assertEqual(tp.check_coverage(replayed, policy=tp.ExactlyOnce(range(SIZE))).violations,
                         tp.check_coverage(windows, policy=tp.ExactlyOnce(range(SIZE))).violations)


class TestWindows(unittest.TestCase):
    def test_position_counts_on_across_the_windows_of_an_epoch(self) -> None:
        result = tp.check_coverage([(0, {0: [[0, 1]], 1: [[2, 3]]}), (0, {0: [[4], [0]]})],
                                   policy=tp.ExactlyOnce(range(5)))
        self.assertEqual(observed(result), [("same_rank_duplicate", 0, 0, 3, 0)])
        self.assertIn("rank 0 at position 3 (batch 2) of epoch 0; rank 0 first observed it at position 0 (batch 0)",
                      result.violations[0].message)

    def test_a_later_window_observes_after_the_earlier_windows_whatever_the_ranks(self) -> None:
        # rank 1 alone read sample 0, then the job resumed with rank 0 alone: rank 0's is the repeat
        result = tp.check_coverage([(0, {1: [[0]]}), (0, {0: [[0]]})], policy=tp.ExactlyOnce(range(1)))
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 0, 0, 0)])
        self.assertIn("but rank 1 at position 0 (batch 0) observed it first", result.violations[0].message)
        # a new rank starts its stream in the second window: its samples come after the first window's
        result = tp.check_coverage([(0, {0: [[0, 1, 2]]}), (0, {0: [[3]], 1: [[2]]})], policy=tp.ExactlyOnce(range(4)))
        self.assertEqual(observed(result), [("cross_rank_duplicate", 0, 1, 0, 2)])

    def test_epochs_of_several_windows_are_compared_whole(self) -> None:
        windows = [(0, {0: [[0, 1]]}), (0, {0: [[2]]}), (1, {0: [[0]]}), (1, {0: [[1, 2]]})]
        result = tp.check_coverage(windows, policy=[tp.ExactlyOnce(range(3)), tp.DistinctEpochOrder()])
        self.assertEqual(observed(result), [("repeated_epoch_order", 1, 0, None, None)])
        self.assertEqual(result.config["epochs"], [0, 1])

    def test_windows_with_one_epoch_each_are_the_sequence_of_mappings(self) -> None:
        mappings = [{0: [[0, 1]], 1: [[1]]}, {0: [[1]], 1: [[0, 0]]}]
        as_windows = tp.check_coverage([(5, m) for m in mappings[:1]] + [(9, mappings[1])],
                                       policy=tp.ExactlyOnce(range(2)))
        as_epochs = tp.check_coverage(mappings, policy=tp.ExactlyOnce(range(2)))
        self.assertEqual([(v.kind, v.rank, v.position, v.sample_id) for v in as_windows.violations],
                         [(v.kind, v.rank, v.position, v.sample_id) for v in as_epochs.violations])
        self.assertEqual([v.epoch for v in as_windows.violations], [5, 9])
        self.assertNotIn("windows", as_windows.config)

    def test_errors_name_the_window(self) -> None:
        def broken():  # type: ignore[no-untyped-def]
            yield [1]
            raise RuntimeError("preempted")

        result = tp.check_coverage([(0, {0: [[0]]}), (0, {0: broken()})], policy=tp.NoCrossRankOverlap())
        assert result.error is not None
        self.assertEqual(result.error.phase, "window 1 (epoch 0), rank 0, batch 1")

    def test_misuse(self) -> None:
        cases = [
            ([(0, {0: [1]}), {0: [2]}], TypeError, r"item 1 is a dict, but item 0 is an \(epoch, \{rank: iterable\}\)"),
            ([(-1, {0: [1]})], TypeError, "epoch int >= 0, got the epoch -1"),
            ([("a", {0: [1]})], TypeError, "got the epoch 'a'"),
            ([(0, {0: [1]}), (1, {0: [2]}), (0, {0: [3]})], ValueError,
             "window 2 is of epoch 0, but the window before it is of epoch 1: list the windows of one epoch one "
             "after the other"),
            ([(0, {0: [1]}), (0, {})], ValueError, r"window 1 \(epoch 0\) maps no rank"),
        ]
        for ranks, error, pattern in cases:
            with self.subTest(pattern), self.assertRaisesRegex(error, pattern):
                tp.check_coverage(ranks, policy=tp.NoCrossRankOverlap())


class TestMerge(unittest.TestCase):
    def test_records_of_one_rank_and_epoch_are_joined_in_the_order_given(self) -> None:
        earlier, later = tp.CoverageRecorder(rank=0), tp.CoverageRecorder(rank=0)
        earlier.record([0, 1])
        later.record(tp.WorkerBatch([2, 0], 1))
        merged = tp.CoverageRecorder.merge([earlier, later])
        self.assertEqual((merged.ranks, merged.epochs, len(merged)), ([0], [0], 4))
        result = tp.check_coverage(merged, policy=tp.ExactlyOnce(range(3)))
        self.assertEqual([(v.kind, v.position, v.worker, v.sample_id) for v in result.violations],
                         [("same_rank_duplicate", 3, 1, 0)])
        self.assertIn("at position 3 (batch 1, worker 1)", result.violations[0].message)
        self.assertEqual((len(earlier), len(later)), (2, 2))  # the records merged are left as they were
        reversed_order = tp.check_coverage(tp.CoverageRecorder.merge([later, earlier]), policy=tp.ExactlyOnce(range(3)))
        self.assertEqual([(v.position, v.sample_id) for v in reversed_order.violations], [(2, 0)])  # 2, 0, 0, 1

    def test_the_same_record_twice_is_refused(self) -> None:
        record = tp.CoverageRecorder(rank=0)
        record.record([0])
        with self.assertRaisesRegex(ValueError, "got the same record twice"):
            tp.CoverageRecorder.merge([record, record])


if __name__ == "__main__":
    unittest.main()
