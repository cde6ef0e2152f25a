"""Hypothesis strategies for sampler edge cases, and helpers that build torch's samplers and loaders for them.

    import trainparity as tp
    from hypothesis import given
    from trainparity import strategies as tps

    @tps.torch_settings(max_examples=50)
    @given(cfg=tps.sampler_configs())
    def test_my_sharding(cfg):
        windows = tps.epoch_windows(my_loaders(cfg), cfg.epochs)   # your own sampler, built from cfg
        tp.assert_coverage(windows, policy=tps.expected_policy(cfg))

`expected_policy(cfg)` is what torch's own `DistributedSampler` satisfies for that config, so
a sampler that should behave like it can be held to it; `distributed_samplers(cfg)` and
`data_loaders(cfg)` build torch's reference per rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import hypothesis
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainparity._coverage import (
    CoveragePolicy,
    DistinctEpochOrder,
    ExactlyOnce,
    ExpectedPadding,
    NoCrossRankOverlap,
    tag_workers,
)
from trainparity._recipe._recipe import set_sampler_epoch
from trainparity._validation import check_argument

__all__ = [
    "ORDER_MIN_SAMPLES",
    "IndexDataset",
    "SamplerConfig",
    "data_loaders",
    "distributed_samplers",
    "epoch_windows",
    "expected_policy",
    "sampler_configs",
    "torch_settings",
]

#: `expected_policy` includes DistinctEpochOrder only when each rank sees at least this many samples per
#: epoch: a shuffled order of 20 samples repeats by chance with probability below 1/20! (about 4e-19).
ORDER_MIN_SAMPLES = 20


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """One data-parallel sampling setup: a map-style dataset of `dataset_size` samples whose IDs are 0..n-1,
    sharded by `DistributedSampler` over `world_size` ranks and batched by a DataLoader."""

    dataset_size: int
    world_size: int
    batch_size: int
    #: DistributedSampler's drop_last: True drops the tail, False pads with repeated samples
    drop_last: bool
    shuffle: bool
    seed: int
    epochs: int
    num_workers: int
    #: the rank layout: `world_size` ranks on `nodes` nodes of `ranks_per_node` ranks each (rank =
    #: node * ranks_per_node + local_rank, as torchrun numbers them)
    nodes: int = 1

    def __post_init__(self) -> None:
        check_argument(self.nodes >= 1 and self.world_size % self.nodes == 0,
                       f"SamplerConfig(nodes={self.nodes}) must divide world_size={self.world_size}")

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes

    def local_rank(self, rank: int) -> int:
        """The rank's index on its node (torchrun's LOCAL_RANK): what a sampler must not shard by."""
        return rank % self.ranks_per_node

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    @property
    def universe(self) -> range:
        """The dataset's sample IDs."""
        return range(self.dataset_size)

    @property
    def samples_per_rank(self) -> int:
        """How many samples each rank sees per epoch (`len(DistributedSampler)`)."""
        if self.drop_last:
            return self.dataset_size // self.world_size
        return -(-self.dataset_size // self.world_size)

    @property
    def padding(self) -> int:
        """Repeated samples added per epoch so that every rank sees as many (drop_last=False)."""
        return 0 if self.drop_last else self.samples_per_rank * self.world_size - self.dataset_size

    @property
    def dropped(self) -> int:
        """Samples of the epoch's order that no rank sees (drop_last=True): the lost tail."""
        return self.dataset_size - self.samples_per_rank * self.world_size if self.drop_last else 0


@st.composite
def sampler_configs(
    draw: st.DrawFn,
    *,
    min_dataset_size: int = 0,
    max_dataset_size: int = 64,
    max_world_size: int = 8,
    min_epochs: int = 1,
    max_epochs: int = 3,
    max_workers: int = 2,
    drop_last: bool | None = None,
    shuffle: bool | None = None,
) -> SamplerConfig:
    """Sampling setups: dataset size 0..64 (0 and 1 included), world size 1..8 laid out on 1 or more
    nodes, batch size 1 to past the dataset size, drop_last, shuffle, seed, epochs 1..3, DataLoader
    workers 0..2.

    The keyword arguments bound the ranges; `drop_last=` and `shuffle=` fix those flags.
    Shrinks towards the smallest dataset, one rank, batch size 1, drop_last=False, no
    shuffle, seed 0, the fewest epochs, no workers and one node.
    """
    check_argument(0 <= min_dataset_size <= max_dataset_size, f"sampler_configs() needs 0 <= min_dataset_size <= "
                   f"max_dataset_size, got {min_dataset_size} and {max_dataset_size}")
    check_argument(1 <= min_epochs <= max_epochs,
                   f"sampler_configs() needs 1 <= min_epochs <= max_epochs, got {min_epochs} and {max_epochs}")
    check_argument(max_world_size >= 1 and max_workers >= 0, f"sampler_configs() needs max_world_size >= 1 and "
                   f"max_workers >= 0, got {max_world_size} and {max_workers}")
    dataset_size = draw(st.integers(min_dataset_size, max_dataset_size), label="dataset_size")
    world_size = draw(st.integers(1, max_world_size), label="world_size")
    return SamplerConfig(
        dataset_size=dataset_size,
        world_size=world_size,
        batch_size=draw(st.integers(1, dataset_size + 2), label="batch_size"),
        drop_last=draw(st.booleans(), label="drop_last") if drop_last is None else drop_last,
        shuffle=draw(st.booleans(), label="shuffle") if shuffle is None else shuffle,
        seed=draw(st.integers(0, 2**16), label="seed"),
        epochs=draw(st.integers(min_epochs, max_epochs), label="epochs"),
        num_workers=draw(st.integers(0, max_workers), label="num_workers"),
        nodes=draw(st.sampled_from([n for n in range(1, world_size + 1) if world_size % n == 0]), label="nodes"),
    )


class IndexDataset(Dataset[int]):
    """A map-style dataset whose sample `i` is the int `i`: its batches are their own sample IDs."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return index


def distributed_samplers(cfg: SamplerConfig) -> dict[int, DistributedSampler[int]]:
    """torch's DistributedSampler for every rank of `cfg`."""
    dataset = IndexDataset(cfg.dataset_size)
    return {
        rank: DistributedSampler(dataset, num_replicas=cfg.world_size, rank=rank, shuffle=cfg.shuffle, seed=cfg.seed,
                                 drop_last=cfg.drop_last)
        for rank in range(cfg.world_size)
    }


def data_loaders(cfg: SamplerConfig) -> dict[int, DataLoader[int]]:
    """A DataLoader per rank over `IndexDataset`, sharded by its DistributedSampler.

    Batches are `tp.WorkerBatch(ids_tensor, worker)` (collate_fn=`tp.tag_workers()`), so
    violations name the worker that produced each sample.
    """
    dataset = IndexDataset(cfg.dataset_size)
    return {
        rank: DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.num_workers,
                         collate_fn=tag_workers())
        for rank, sampler in distributed_samplers(cfg).items()
    }


def epoch_windows(
    ranks: Mapping[int, Iterable[Any]], epochs: int, *, set_epoch: bool = True
) -> list[dict[int, list[Any]]]:
    """Iterate every rank's loader (or sampler) for `epochs` epochs: `check_coverage`'s per-epoch input.

    Before each epoch, `set_epoch(epoch)` is called on the first of the object, its `.sampler`,
    its `.batch_sampler` or its `.batch_sampler.sampler` that has one, as a training loop should;
    `set_epoch=False` reproduces the loop that forgets to.
    """
    windows: list[dict[int, list[Any]]] = []
    for epoch in range(epochs):
        window = {}
        for rank, source in ranks.items():
            if set_epoch:
                set_sampler_epoch(source, epoch)
            window[rank] = list(source)
        windows.append(window)
    return windows


def expected_policy(cfg: SamplerConfig) -> list[CoveragePolicy]:
    """The policies torch's DistributedSampler satisfies for `cfg`, in every epoch.

    - drop_last=False: `ExpectedPadding(universe, padding=cfg.padding)` (`ExactlyOnce` when nothing is padded);
    - drop_last=True: `ExactlyOnce` over the kept IDs without shuffle (the tail, `cfg.dropped` IDs,
      is lost); with shuffle the lost IDs change every epoch, so only `NoCrossRankOverlap()` is promised;
    - shuffle with several epochs and at least `ORDER_MIN_SAMPLES` samples per rank: `DistinctEpochOrder()`
      too (smaller shuffled streams may repeat by chance).
    """
    policies: list[CoveragePolicy]
    if cfg.dropped:
        kept = range(cfg.dataset_size - cfg.dropped)
        policies = [NoCrossRankOverlap()] if cfg.shuffle else [ExactlyOnce(kept)]
    elif cfg.padding:
        policies = [ExpectedPadding(cfg.universe, padding=cfg.padding)]
    else:
        policies = [ExactlyOnce(cfg.universe)]
    if cfg.shuffle and cfg.epochs > 1 and cfg.samples_per_rank >= ORDER_MIN_SAMPLES:
        policies.append(DistinctEpochOrder())
    return policies


def torch_settings(**overrides: Any) -> hypothesis.settings:
    """Hypothesis settings for tests that run torch code: no deadline (the first torch call in a process, or a
    DataLoader starting workers, takes far longer than hypothesis' 200 ms default) and no too_slow health check.
    Use it as a decorator, `@torch_settings(max_examples=50)`; other settings come from the active profile (or
    from `parent=`). The health checks suppressed there, and those in `suppress_health_check=`, stay suppressed;
    `deadline=` may still be given.
    """
    parent = overrides.pop("parent", None) or hypothesis.settings()
    suppressed = [*parent.suppress_health_check, hypothesis.HealthCheck.too_slow,
                  *overrides.pop("suppress_health_check", ())]
    overrides.setdefault("deadline", None)
    return hypothesis.settings(parent, suppress_health_check=list(dict.fromkeys(suppressed)), **overrides)
