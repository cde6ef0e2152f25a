"""Benchmarks: `python tools/bench.py {resume,accumulation,coverage,data-parallel,wire}`.

Speed goals live here, never in timed unit tests. Each benchmark prints its figures and,
where a goal is a ratio, the reference measured in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence


def torch_import_seconds(repeats: int = 3) -> float:
    """Median wall time of `python -c "import torch"` in a new interpreter, measured now."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


BENCHMARKS: dict[str, Callable[[argparse.Namespace], None]] = {}

RESUME_PROBE = """
import json, statistics, time
import trainparity as tp
from trainparity.quickstarts.resume import Regression
start = time.perf_counter()
first = tp.check_resume(Regression, steps=6, resume_at=3)
cold = time.perf_counter() - start
warm = []
for _ in range(7):
    start = time.perf_counter()
    result = tp.check_resume(Regression, steps=6, resume_at=3)
    warm.append(time.perf_counter() - start)
    assert result.outcome is tp.Outcome.PASS, result.report()
assert first.outcome is tp.Outcome.PASS, first.report()
print(json.dumps({"cold": cold, "warm": statistics.median(warm)}))
"""


def bench_resume(args: argparse.Namespace) -> None:
    """A 6-step resume check of a tiny model (4 fresh processes): cold and warm, against one torch import.

    Cold: the first check in a new interpreter that has imported trainparity and the recipe
    (it starts the fork server). Warm: the median of the next 7 checks in that interpreter.
    """
    import json

    reference = torch_import_seconds()
    done = subprocess.run([sys.executable, "-c", RESUME_PROBE], check=True, capture_output=True, text=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"python -c 'import torch':  {reference:.3f} s (median of 3)")
    print(f"cold check (first, starts the fork server): {figures['cold']:.3f} s = "
          f"{figures['cold'] / reference:.2f}x torch import (target <= 2x)")
    print(f"warm check (median of 7):   {figures['warm']:.3f} s = "
          f"{figures['warm'] / reference:.3f}x torch import (target <= 0.15x)")


BENCHMARKS["resume"] = bench_resume


def bench_accumulation(args: argparse.Namespace) -> None:
    """A 2-cycle, k=4 accumulation check of the quickstart's small MLP, in-process, after import.

    Prints torch's own one-time start-up (a first forward/backward/AdamW step/clip of an unrelated
    model), then the first check (whose remaining extra time is the recipe's first calls at new
    shapes), then the median of 10 more with torch's default intra-op threads and with one thread:
    on a busy machine, threads that wait for a core dominate a model this small.
    """
    import os
    import statistics

    import torch

    import trainparity as tp
    from trainparity.quickstarts.accumulation import FLOAT32, Regression

    def run() -> float:
        start = time.perf_counter()
        result = tp.check_accumulation(Regression, microbatches=4, cycles=2, comparison=FLOAT32)
        elapsed = time.perf_counter() - start
        assert result.passed, result.report()
        return elapsed

    print(f"accumulation check, small MLP, k=4, 2 cycles, in-process (target <= 0.1 s); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    start = time.perf_counter()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 2)).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    print(f"torch's one-time start-up (first step of an unrelated model, no trainparity): "
          f"{time.perf_counter() - start:.3f} s")
    print(f"first check: {run():.3f} s")
    threads = torch.get_num_threads()
    for count in dict.fromkeys((threads, 1)):
        torch.set_num_threads(count)
        warm = statistics.median(run() for _ in range(10))
        print(f"median of 10, torch threads={count}: {warm:.3f} s")
    torch.set_num_threads(threads)


BENCHMARKS["accumulation"] = bench_accumulation


def bench_coverage(args: argparse.Namespace) -> None:
    """`tp.check_coverage` on 4 ranks, 1 epoch, universe `range(10_000_000)`, `tp.ExactlyOnce`: each rank reads a
    shuffled shard, as DistributedSampler deals them, as 64-ID int64 tensor batches (what a DataLoader yields),
    then as int IDs already extracted (one int64 array per rank).

    Pinned to one core. Prints the throughput on the tensor batches (median of 5 after a warm-up: the per-batch
    cost is the floor there), the audit's throughput on the extracted IDs, its peak extra memory (tracemalloc,
    which sees numpy's buffers) relative to the ID arrays, the throughput on a failing input (rank 3 reads rank
    0's shard; `max_violations=1000`, so building Violation objects does not dominate), and for the same input a
    plain Python set/dict reference audit (same semantics, Python ints already extracted).
    """
    import os
    import statistics
    import tracemalloc

    import numpy as np
    import torch

    import trainparity as tp

    size, world = 10_000_000, 4
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    order = np.random.default_rng(0).permutation(size)
    ranks = {rank: [np.ascontiguousarray(order[rank::world])] for rank in range(world)}
    id_bytes = sum(batch.nbytes for batches in ranks.values() for batch in batches)
    policy = tp.ExactlyOnce(range(size))

    def audit(streams: Mapping[int, Sequence[object]], **kwargs: object) -> float:
        start = time.perf_counter()
        tp.check_coverage(streams, **{"policy": policy, **kwargs})
        return time.perf_counter() - start

    print(f"coverage audit: {world} ranks, 1 epoch, {size:,} int64 IDs, universe range({size}); one core; load "
          f"average {os.getloadavg()[0]:.1f}")
    batch = 64
    tensors = {rank: [ids.clone() for ids in torch.from_numpy(shard).split(batch)]  # each batch its own storage
               for rank, (shard,) in ranks.items()}
    assert tp.check_coverage(tensors, policy=policy).passed
    seconds_batches = statistics.median(audit(tensors) for _ in range(5))
    print(f"{batch}-ID tensor batches ({sum(map(len, tensors.values())):,} batches, PASS): {seconds_batches:.3f} s, "
          f"{size / seconds_batches / 1e6:.1f} million IDs/s (target >= 20)")
    del tensors
    assert tp.check_coverage(ranks, policy=policy).passed
    seconds = statistics.median(audit(ranks) for _ in range(5))
    print(f"IDs already extracted (PASS): {seconds:.3f} s, {size / seconds / 1e6:.1f} million IDs/s (target >= 10)")
    tracemalloc.start()
    tp.check_coverage(ranks, policy=policy)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"peak extra memory: {peak / 2**20:.0f} MiB = {peak / id_bytes:.2f}x the ID arrays ({id_bytes / 2**20:.0f} "
          "MiB) (target <= 3x)")
    shuffled = tp.ExactlyOnce(np.random.default_rng(1).permutation(size))
    assert tp.check_coverage(ranks, policy=shuffled).passed
    seconds_shuffled = statistics.median(audit(ranks, policy=shuffled) for _ in range(3))
    print(f"audit (PASS) with the universe as a shuffled int64 array (lookup-table path, includes building it): "
          f"{seconds_shuffled:.3f} s, {size / seconds_shuffled / 1e6:.1f} million IDs/s")
    failing = {**ranks, 3: ranks[0]}
    failed = tp.check_coverage(failing, policy=policy, max_violations=1000)
    assert failed.counts == {"cross_rank_duplicate": 1000}, failed.counts
    seconds_failing = statistics.median(audit(failing, max_violations=1000) for _ in range(3))
    print(f"audit (FAIL, {size // world:,} cross-rank duplicates and as many missing IDs): {seconds_failing:.3f} s, "
          f"{size / seconds_failing / 1e6:.1f} million IDs/s")

    streams = {rank: batches[0].tolist() for rank, batches in ranks.items()}
    start = time.perf_counter()
    found = _reference_coverage_audit(streams, size)
    reference = time.perf_counter() - start
    assert found == 0
    print(f"plain Python set/dict reference audit, same input: {reference:.2f} s, "
          f"{size / reference / 1e6:.2f} million IDs/s; the audit is {reference / seconds:.0f}x faster")


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


BENCHMARKS["coverage"] = bench_coverage


DATA_PARALLEL_PROBE = """
import json, statistics, sys, time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainparity as tp


class DDPRegression(tp.Recipe):
    def setup(self):
        data = TensorDataset(torch.arange(64), torch.randn(64, 16), torch.randn(64, 1))
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=8 // dist.get_world_size(), sampler=sampler)
        model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                            torch.nn.Linear(32, 1)))
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), loader=loader)

    def sample_ids(self, batch):
        return batch[0]

    def step(self, state, batch):
        _, x, y = batch
        loss = torch.nn.functional.mse_loss(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        return loss


def check():
    start = time.perf_counter()
    result = tp.check_data_parallel(DDPRegression, world_size=2, steps=3,
                                    comparison=tp.ToleranceComparison(rtol=1e-4, atol=1e-6))
    assert result.outcome is tp.Outcome.PASS, result.report()
    return time.perf_counter() - start


if __name__ == "__main__":  # the children re-run this file to find the recipe
    cold = check()
    warm = [check() for _ in range(int(sys.argv[1]))]
    print(json.dumps({"cold": cold, "warm": statistics.median(warm)}))
"""


def bench_data_parallel(args: argparse.Namespace) -> None:
    """A 3-step, world-size-2 data-parallel check of a small DDP MLP on gloo (3 processes: 2 ranks and the
    reference), against one torch import.

    Cold: the first check in a new interpreter that has imported trainparity and the recipe (it starts the
    fork server). Warm: the median of the next 7 checks in that interpreter.
    """
    import json
    import os
    import tempfile

    reference = torch_import_seconds()
    with tempfile.TemporaryDirectory() as directory:
        probe = os.path.join(directory, "data_parallel_probe.py")  # a file: the recipe must be importable
        with open(probe, "w") as file:
            file.write(DATA_PARALLEL_PROBE)
        done = subprocess.run([sys.executable, probe, "7"], check=True, capture_output=True, text=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"data-parallel check, world size 2 (gloo, CPU), 3 steps; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"python -c 'import torch':  {reference:.3f} s (median of 3)")
    print(f"cold check (first, starts the fork server): {figures['cold']:.3f} s = "
          f"{figures['cold'] / reference:.2f}x torch import (target < 3x)")
    print(f"warm check (median of 7):   {figures['warm']:.3f} s = "
          f"{figures['warm'] / reference:.2f}x torch import (target < 3x)")


BENCHMARKS["data-parallel"] = bench_data_parallel


def bench_wire(args: argparse.Namespace) -> None:
    """Reading a child's trace: the `_wire` format against `torch.load(weights_only=True)`.

    The trace is that of the resume benchmark's 6-step run (recorded in this process); each
    figure is the median of 20 writes and reads of the same file.
    """
    import pathlib
    import statistics
    import tempfile

    import torch

    from trainparity import _wire
    from trainparity._recipe import resolve_recipe
    from trainparity._trace import TrainPayload, train_run
    from trainparity.quickstarts.resume import Regression

    def median_seconds(action: Callable[[], object]) -> float:
        times = []
        for _ in range(20):
            start = time.perf_counter()
            action()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    with tempfile.TemporaryDirectory() as folder:
        directory = pathlib.Path(folder)
        trace = train_run(TrainPayload(resolve_recipe(Regression), 0, 1, 6, str(directory / "ck")), directory)
        tensors = sum(len(step["state"]) + len(step["rng"]) for step in trace["steps"])
        wire, pt = directory / "trace.bin", directory / "trace.pt"
        write_wire = median_seconds(lambda: _wire.dump(trace, wire))
        write_pt = median_seconds(lambda: torch.save(trace, pt))
        read_wire = median_seconds(lambda: _wire.load(wire))
        read_pt = median_seconds(lambda: torch.load(pt, weights_only=True))
    print(f"a 6-step resume trace ({tensors} leaves), median of 20")
    print(f"write: _wire {write_wire * 1e3:.2f} ms, torch.save {write_pt * 1e3:.2f} ms ({write_pt / write_wire:.1f}x)")
    print(f"read:  _wire {read_wire * 1e3:.2f} ms, torch.load(weights_only=True) {read_pt * 1e3:.2f} ms "
          f"({read_pt / read_wire:.1f}x)")


BENCHMARKS["wire"] = bench_wire


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    args = parser.parse_args()
    BENCHMARKS[args.benchmark](args)


if __name__ == "__main__":
    main()
