"""trainparity.strategies: torch's DistributedSampler against expected_policy for every generated config."""

from __future__ import annotations

import datetime
import sys
import unittest

import hypothesis
import pytest
import torch
from hypothesis import HealthCheck, example, find, given, settings

import trainparity as tp
from trainparity import strategies as tps
from trainparity.strategies import SamplerConfig

pytestmark = pytest.mark.exact


def config(n: int, world: int, *, drop_last: bool = False, shuffle: bool = False, batch_size: int = 1,
           epochs: int = 1, seed: int = 0, num_workers: int = 0) -> SamplerConfig:
    return SamplerConfig(n, world, batch_size, drop_last, shuffle, seed, epochs, num_workers)


@tps.torch_settings(max_examples=500)
@given(cfg=tps.sampler_configs(max_workers=0))
@example(cfg=config(3, 8))  # padded: the ranks see [0], [1], [2], [0], [1], [2], [0], [1]
@example(cfg=config(3, 8, drop_last=True))  # every rank empty
@example(cfg=config(0, 3))
@example(cfg=config(1, 1, batch_size=3))  # batch larger than the dataset
@example(cfg=config(7, 3, drop_last=True, shuffle=True, epochs=2))  # a shuffled lost tail
@example(cfg=config(40, 2, shuffle=True, epochs=3, seed=7))  # DistinctEpochOrder is expected
def test_distributed_sampler_satisfies_expected_policy(cfg: SamplerConfig) -> None:
    samplers = tps.distributed_samplers(cfg)
    windows = tps.epoch_windows(samplers, cfg.epochs)
    result = tp.check_coverage(windows, policy=tps.expected_policy(cfg))
    assert result.passed, result.report()
    for window in windows:
        assert [len(ids) for ids in window.values()] == [cfg.samples_per_rank] * cfg.world_size
        assert sum(map(len, window.values())) == cfg.dataset_size + cfg.padding - cfg.dropped
    assert all(len(s) == cfg.samples_per_rank for s in samplers.values())


@tps.torch_settings(max_examples=12)
@given(cfg=tps.sampler_configs(max_dataset_size=24, max_world_size=3, max_epochs=2, max_workers=2))
@example(cfg=config(5, 2, batch_size=2, num_workers=2, shuffle=True, epochs=2))
def test_data_loaders_with_workers_match_their_samplers(cfg: SamplerConfig) -> None:
    windows = tps.epoch_windows(tps.data_loaders(cfg), cfg.epochs)
    result = tp.check_coverage(windows, policy=tps.expected_policy(cfg))
    assert result.passed, result.report()
    sampled = tps.epoch_windows(tps.distributed_samplers(cfg), cfg.epochs)
    for loaded, expected in zip(windows, sampled, strict=True):
        for rank, batches in loaded.items():
            assert all(isinstance(b, tp.WorkerBatch) for b in batches)
            assert {b.worker for b in batches} <= ({None} if cfg.num_workers == 0 else set(range(cfg.num_workers)))
            flat = [int(i) for b in batches for i in b.batch]
            assert flat == expected[rank]


@tps.torch_settings(max_examples=30)
@given(cfg=tps.sampler_configs(min_dataset_size=2 * tps.ORDER_MIN_SAMPLES, max_dataset_size=80, max_world_size=2,
                               min_epochs=2, max_workers=0, shuffle=True))
def test_forgotten_set_epoch_repeats_every_ranks_order(cfg: SamplerConfig) -> None:
    windows = tps.epoch_windows(tps.distributed_samplers(cfg), cfg.epochs, set_epoch=False)
    result = tp.check_coverage(windows, policy=tps.expected_policy(cfg))
    assert tp.DistinctEpochOrder in {type(p) for p in tps.expected_policy(cfg)}
    assert result.counts == {"repeated_epoch_order": cfg.world_size * (cfg.epochs - 1)}, result.report()


class TestStrategies(unittest.TestCase):
    def test_notes_edge_case_n3_world8(self) -> None:
        padded = tps.epoch_windows(tps.distributed_samplers(config(3, 8)), 1)[0]
        self.assertEqual([padded[r] for r in range(8)], [[0], [1], [2], [0], [1], [2], [0], [1]])
        self.assertEqual([p.describe() for p in tps.expected_policy(config(3, 8))],
                         ["ExpectedPadding(range(0, 3), padding=5)"])
        dropped = tps.epoch_windows(tps.distributed_samplers(config(3, 8, drop_last=True)), 1)[0]
        self.assertEqual(dropped, {r: [] for r in range(8)})
        self.assertEqual([p.describe() for p in tps.expected_policy(config(3, 8, drop_last=True))],
                         ["ExactlyOnce(range(0, 0))"])

    def test_expected_policy_per_config(self) -> None:
        cases = [
            (config(8, 4), ["ExactlyOnce(range(0, 8))"]),
            (config(10, 4, drop_last=True), ["ExactlyOnce(range(0, 8))"]),
            (config(10, 4, drop_last=True, shuffle=True), ["NoCrossRankOverlap()"]),
            (config(50, 2, shuffle=True, epochs=2), ["ExactlyOnce(range(0, 50))", "DistinctEpochOrder()"]),
            (config(50, 3, shuffle=True, epochs=1), ["ExpectedPadding(range(0, 50), padding=1)"]),
            (config(30, 2, shuffle=True, epochs=2), ["ExactlyOnce(range(0, 30))"]),  # 15 per rank: may repeat
        ]
        for cfg, expected in cases:
            with self.subTest(cfg=cfg):
                self.assertEqual([p.describe() for p in tps.expected_policy(cfg)], expected)

    def test_generates_the_edge_cases_and_shrinks_to_the_simplest(self) -> None:
        quick = settings(database=None, max_examples=2000)
        for condition in (lambda c: c.dataset_size == 0, lambda c: c.dataset_size == 1,
                          lambda c: c.batch_size > c.dataset_size > 0, lambda c: c.world_size == 8,
                          lambda c: c.num_workers == 2):
            find(tps.sampler_configs(), condition, settings=quick)
        self.assertEqual(find(tps.sampler_configs(), lambda c: c.padding > 0, settings=quick),
                         config(1, 2))
        self.assertEqual(find(tps.sampler_configs(), lambda c: c.dropped > 0, settings=quick),
                         config(1, 2, drop_last=True))

    def test_strategy_arguments_are_checked(self) -> None:
        with self.assertRaisesRegex(ValueError, "min_dataset_size <= max_dataset_size"):
            tps.sampler_configs(min_dataset_size=5, max_dataset_size=2).example()
        with self.assertRaisesRegex(ValueError, "min_epochs <= max_epochs"):
            tps.sampler_configs(min_epochs=0).example()

    def test_epoch_windows_sets_the_epoch_on_samplers_behind_loaders(self) -> None:
        cfg = config(40, 2, shuffle=True, epochs=2, batch_size=4)
        windows = tps.epoch_windows(tps.data_loaders(cfg), 2)
        first = [torch.cat([b.batch for b in windows[e][0]]).tolist() for e in range(2)]
        self.assertNotEqual(first[0], first[1])
        self.assertEqual(sorted(first[0] + [i for b in windows[0][1] for i in b.batch.tolist()]), list(range(40)))

    def test_torch_settings_keep_the_profiles_suppressed_health_checks(self) -> None:
        previous = hypothesis.settings.get_current_profile_name()
        hypothesis.settings.register_profile("trainparity-test-strict", deadline=300, max_examples=11,
                                             suppress_health_check=[HealthCheck.filter_too_much])
        hypothesis.settings.load_profile("trainparity-test-strict")
        try:
            merged = tps.torch_settings()
            self.assertEqual(set(merged.suppress_health_check), {HealthCheck.filter_too_much, HealthCheck.too_slow})
            self.assertEqual((merged.deadline, merged.max_examples), (None, 11))  # the rest from the profile
            extended = tps.torch_settings(suppress_health_check=[HealthCheck.data_too_large], deadline=1000)
            self.assertEqual(set(extended.suppress_health_check),
                             {HealthCheck.filter_too_much, HealthCheck.too_slow, HealthCheck.data_too_large})
            self.assertEqual(extended.deadline, datetime.timedelta(milliseconds=1000))
        finally:
            hypothesis.settings.load_profile(previous)
        parent = hypothesis.settings(suppress_health_check=[HealthCheck.large_base_example], max_examples=3)
        from_parent = tps.torch_settings(parent=parent)
        self.assertEqual(set(from_parent.suppress_health_check), {HealthCheck.large_base_example, HealthCheck.too_slow})
        self.assertEqual((from_parent.deadline, from_parent.max_examples), (None, 3))


if __name__ == "__main__":
    unittest.main()


def test_rank_layout_finds_a_sampler_sharded_by_local_rank() -> None:
    """A sampler built with LOCAL_RANK is right on one node and wrong on several: the layout draw finds it."""

    def shards_by_local_rank(cfg: SamplerConfig) -> dict[int, list[int]]:
        return {rank: list(range(cfg.local_rank(rank), cfg.dataset_size, cfg.world_size))
                for rank in range(cfg.world_size)}

    def fails(cfg: SamplerConfig) -> bool:
        return not tp.check_coverage({r: [ids] for r, ids in shards_by_local_rank(cfg).items()},
                                     policy=tp.ExactlyOnce(cfg.universe)).passed

    one_node = config(8, 4)
    assert not fails(one_node) and one_node.ranks_per_node == 4
    found = find(tps.sampler_configs(max_workers=0), fails, settings=settings(max_examples=500, database=None))
    assert found.nodes > 1 and found.world_size % found.nodes == 0
    assert [found.local_rank(r) for r in range(found.world_size)] == [
        r % found.ranks_per_node for r in range(found.world_size)
    ]


def test_rank_layout_must_divide_the_world() -> None:
    import pytest

    with pytest.raises(ValueError, match=r"SamplerConfig\(nodes=3\) must divide world_size=4"):
        SamplerConfig(8, 4, 1, False, False, 0, 1, 0, nodes=3)
    assert SamplerConfig(8, 4, 1, False, False, 0, 1, 0, nodes=2).node(3) == 1


def test_the_property_tests_of_coverage_run_without_a_deadline() -> None:
    """They run torch code (DataLoaders, samplers): under load one example may take past hypothesis' 200 ms."""
    import test_coverage_oracle

    tests = {name: test for module in (test_coverage_oracle, sys.modules[__name__])
             for name, test in vars(module).items() if callable(test) and getattr(test, "is_hypothesis_test", False)}
    assert {"test_audit_matches_the_oracle", "test_distributed_sampler_satisfies_expected_policy"} <= set(tests)
    with_deadline = {name: getattr(test, "_hypothesis_internal_use_settings", hypothesis.settings.default).deadline
                     for name, test in tests.items()}
    assert {name: deadline for name, deadline in with_deadline.items() if deadline is not None} == {}
