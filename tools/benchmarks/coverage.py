"""`tp.check_coverage` on 4 ranks, 1 epoch, `tp.ExactlyOnce`: each rank reads a shuffled shard, as
DistributedSampler deals them, as 64-ID int64 tensor batches (what a DataLoader yields), then as int IDs
already extracted (one int64 array per rank).

First, the first call as a user makes it (5 M IDs, in lists of tensor batches, no warm-up, no pinning: target >= 20 M
IDs/s). Then, pinned to one core, universe `range(10_000_000)`: prints the throughput on the tensor batches
(median of 5 after a warm-up: the per-batch cost is the floor there), the audit's throughput on the extracted
IDs, its peak extra memory (the growth of this process's peak resident set, `PeakRSS`, measured before any other
audit of that input so that no memory freed by one is reused unseen; tracemalloc would miss the ID buffer, which
torch allocates) relative to the ID arrays, the throughput
on a failing input (rank 3 reads rank 0's shard; `max_violations=1000`, so building Violation objects does not
dominate), and for the same input a plain Python set/dict reference audit (same semantics, Python ints already
extracted).
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable, Mapping, Sequence

from benchmarks._timing import PeakRSS, machine, median_seconds, seconds


def run(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    import trainparity as tp

    world, batch = 4, 64
    first_size = 5_000_000
    shuffled = np.random.default_rng(0).permutation(first_size)
    first_batches = {rank: [ids.clone() for ids in torch.from_numpy(np.ascontiguousarray(shuffled[rank::world]))
                            .split(batch)] for rank in range(world)}  # each batch its own storage
    passed: list[bool] = []
    policy_first = tp.ExactlyOnce(range(first_size))
    first = seconds(functools.partial(lambda batches: passed.append(
        tp.check_coverage(batches, policy=policy_first).passed), first_batches))
    assert passed == [True]
    print(f"first call as a user makes it: {world} ranks of {batch}-ID tensor batches, {first_size:,} IDs, no warm-up, "
          f"not pinned; {machine()}")
    print(f"  {first:.3f} s = {first_size / first / 1e6:.1f} million IDs/s "
          f"({'pass' if first_size / first >= 20e6 else 'FAIL'}: target >= 20)")
    del first_batches, shuffled
    size = 10_000_000
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    order = np.random.default_rng(0).permutation(size)
    ranks = {rank: [np.ascontiguousarray(order[rank::world])] for rank in range(world)}
    id_bytes = sum(batch.nbytes for batches in ranks.values() for batch in batches)
    policy = tp.ExactlyOnce(range(size))

    def audit(streams: Mapping[int, Sequence[object]], **kwargs: object) -> Callable[[], object]:
        return lambda: tp.check_coverage(streams, **{"policy": policy, **kwargs})

    print(f"coverage audit: {world} ranks, 1 epoch, {size:,} int64 IDs, universe range({size}); one core; "
          f"{machine()}")
    with PeakRSS() as memory:
        assert tp.check_coverage(ranks, policy=policy).passed
    peak = memory.peak - memory.before
    tensors = {rank: [ids.clone() for ids in torch.from_numpy(shard).split(batch)]  # each batch its own storage
               for rank, (shard,) in ranks.items()}
    assert tp.check_coverage(tensors, policy=policy).passed
    seconds_batches = median_seconds(audit(tensors), 5)
    print(f"{batch}-ID tensor batches ({sum(map(len, tensors.values())):,} batches, PASS): {seconds_batches:.3f} s, "
          f"{size / seconds_batches / 1e6:.1f} million IDs/s (target >= 20)")
    del tensors
    extracted = median_seconds(audit(ranks), 5)
    print(f"IDs already extracted (PASS): {extracted:.3f} s, {size / extracted / 1e6:.1f} million IDs/s (target >= 10)")
    print(f"peak extra memory ({memory.method}, the first audit of them): {peak / 2**20:.0f} MiB = "
          f"{peak / id_bytes:.2f}x the ID arrays ({id_bytes / 2**20:.0f} MiB) (target <= 3x)")
    shuffled = tp.ExactlyOnce(np.random.default_rng(1).permutation(size))
    assert tp.check_coverage(ranks, policy=shuffled).passed
    seconds_shuffled = median_seconds(audit(ranks, policy=shuffled), 3)
    print(f"audit (PASS) with the universe as a shuffled int64 array (lookup-table path, includes building it): "
          f"{seconds_shuffled:.3f} s, {size / seconds_shuffled / 1e6:.1f} million IDs/s")
    failing = {**ranks, 3: ranks[0]}
    failed = tp.check_coverage(failing, policy=policy, max_violations=1000)
    assert failed.counts == {"cross_rank_duplicate": 1000}, failed.counts
    seconds_failing = median_seconds(audit(failing, max_violations=1000), 3)
    print(f"audit (FAIL, {size // world:,} cross-rank duplicates and as many missing IDs): {seconds_failing:.3f} s, "
          f"{size / seconds_failing / 1e6:.1f} million IDs/s")

    streams = {rank: batches[0].tolist() for rank, batches in ranks.items()}
    found: list[int] = []
    reference = seconds(lambda: found.append(_reference_coverage_audit(streams, size)))
    assert found == [0]
    print(f"plain Python set/dict reference audit, same input: {reference:.2f} s, "
          f"{size / reference / 1e6:.2f} million IDs/s; the audit is {reference / extracted:.0f}x faster")


def _reference_coverage_audit(streams: dict[int, list[int]], universe_size: int) -> int:
    """ExactlyOnce(range(universe_size)) the obvious way: walk observation order with a dict; count violations."""
    first_rank: dict[int, int] = {}
    ranks_seen: dict[int, set[int]] = {}  # only for IDs seen more than once
    violations = 0
    duplicates = [0, 0]  # cross-rank, same-rank
    length = max(len(stream) for stream in streams.values())
    order = sorted(streams)
    for position in range(length):
        for rank in order:
            stream = streams[rank]
            if position >= len(stream):
                continue
            sample = stream[position]
            if not 0 <= sample < universe_size:
                violations += 1
            elif sample not in first_rank:
                first_rank[sample] = rank
            else:
                seen = ranks_seen.setdefault(sample, {first_rank[sample]})
                duplicates[rank in seen] += 1
                seen.add(rank)
    missing = {*range(universe_size)} - first_rank.keys()
    return violations + sum(duplicates) + len(missing)
