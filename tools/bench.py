"""Benchmarks: `python tools/bench.py {resume,accumulation,coverage,data-parallel,wire,scale,preflight}`.

Speed goals live here, never in timed unit tests. Each benchmark prints its figures and,
where a goal is a ratio, the reference measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


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
    import statistics

    import torch

    import trainparity as tp
    from trainparity.quickstarts.accumulation import Regression

    def run() -> float:
        start = time.perf_counter()
        result = tp.check_accumulation(Regression, microbatches=4, cycles=2)
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

ROOT = pathlib.Path(__file__).resolve().parent.parent


def bench_script(args: argparse.Namespace) -> None:
    """check_resume_script on the nanoGPT-shaped test script against one plain run of it (target <= 2.5x).

    The check runs the script four times (two baselines and the interrupted run side by side, then the
    resumed run), each paying the script's start-up: imports, data, model.
    """
    import tempfile

    import trainparity as tp

    script = ROOT / "test" / "scripts" / "nanogpt_train.py"
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        subprocess.run([sys.executable, str(script), "--out_dir", directory, "--max_iters", "6"], check=True)
        plain = time.perf_counter() - start
    command = [sys.executable, str(script), "--out_dir", "{workdir}"]
    start = time.perf_counter()
    result = tp.check_resume_script(command, [*command, "--init_from", "resume"], steps=6, resume_at=3)
    checked = time.perf_counter() - start
    assert result.passed, result.report()
    print(f"resume-script check of test/scripts/nanogpt_train.py, 6 steps, resume at 3; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"one plain run of the script (6 steps):  {plain:.2f} s")
    print(f"check_resume_script:                     {checked:.2f} s = {checked / plain:.2f}x (target <= 2.5x)")


BENCHMARKS["script"] = bench_script


def bench_parallel(args: argparse.Namespace) -> None:
    """Wall times of a 2-rank FSDP2 data-parallel check (test/parallel_recipes.py) and of a resume check of the
    FSDP2 + DCP tiny GPT of examples/fsdp_gpt.py from 2 ranks to 1, each cold and warm, in one process."""
    sys.path[:0] = [str(ROOT / "test"), str(ROOT / "examples")]
    from fsdp_gpt import TinyGPT
    from parallel_recipes import FSDPRecipe

    import trainparity as tp

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; gloo on the CPU")
    checks: list[tuple[str, Callable[[], tp.Result]]] = [
        ("data-parallel check, FSDP2, 2 ranks and the reference, 3 steps",
         lambda: tp.check_data_parallel(FSDPRecipe(), world_size=2, steps=3)),
        ("resume check, FSDP2 + DCP tiny GPT, 6 steps, saved on 2 ranks at 3, resumed on 1 (7 processes)",
         lambda: tp.check_resume(TinyGPT(dropout=0.0), steps=6, resume_at=3, world_size=2, resume_world_size=1)),
    ]
    for name, check in checks:
        for which in ("first", "again"):
            start = time.perf_counter()
            result = check()
            assert result.passed, result.report()
            print(f"{name} ({which}): {time.perf_counter() - start:.2f} s")


BENCHMARKS["parallel"] = bench_parallel


def bench_wire(args: argparse.Namespace) -> None:
    """Reading a child's trace: the `_wire` format against `torch.load(weights_only=True)`.

    The trace is that of the resume benchmark's 6-step run (recorded in this process); each
    figure is the median of 20 writes and reads of the same file.
    """
    import pathlib
    import statistics
    import tempfile

    import torch

    from trainparity._process import _wire
    from trainparity._recipe._reference import resolve_recipe
    from trainparity._resume._trace import TrainPayload, train_run
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


#: the parts of `bench.py scale`, each runnable alone with --only
SCALE_PARTS = ("mlp", "gpt", "steps", "accumulation")
TOOLS = os.path.dirname(os.path.abspath(__file__))
MB = 1e6


class PeakRSS:
    """This process's peak resident set size over a `with` block, in bytes (`peak`; `before`: the RSS at entry).

    The kernel's high-water mark, VmHWM, reset at entry by writing 5 to /proc/self/clear_refs; where that
    file cannot be written, VmRSS sampled every 5 ms by a thread (which can miss a peak shorter than that).
    """

    def __init__(self) -> None:
        self.method = ""
        self.before = self.peak = 0
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"/proc/self/status has no {field}")

    def _sample(self) -> None:
        while not self._sampling.wait(0.005):
            self.peak = max(self.peak, self._status("VmRSS"))

    def __enter__(self) -> PeakRSS:
        self.before = self.peak = self._status("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
            self.method = "VmHWM after resetting it through /proc/self/clear_refs"
        except OSError:
            self.method = "VmRSS sampled every 5 ms"
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._sampler is None:
            self.peak = self._status("VmHWM")
        else:
            self._sampling.set()
            self._sampler.join()
            self.peak = max(self.peak, self._status("VmRSS"))


def _scale_recipe(part: str, **overrides: int) -> Any:
    import bench_recipes

    if part == "mlp":  # 16.8 M parameters: 1024 -> 4 x 2048 -> 1024
        return bench_recipes.MLP(inputs=1024, width=2048, hidden=4, outputs=1024, batch=64, **overrides)
    if part == "gpt":  # 124 M parameters: 12 layers of width 768, 50,304 tokens, 64 positions, batch 2
        return bench_recipes.GPT(**overrides)
    if part == "steps":  # 1.1 M parameters: 32 -> 2 x 1024 -> 1
        return bench_recipes.MLP(inputs=32, width=1024, hidden=2, outputs=1, batch=32, **overrides)
    assert part == "accumulation"  # 3.2 M parameters: 16 -> 4 x 1024 -> 16
    return bench_recipes.MLP(inputs=16, width=1024, hidden=4, outputs=16, batch=64, **overrides)


def _warm_up() -> None:
    """What the fork server does before its first child: import torch and trainparity, step a small AdamW."""
    import torch

    import trainparity  # noqa: F401

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


def _seed(seed: int) -> None:
    """The seeding the checks do before each run's setup() or load()."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _train(recipe: Any, state: Any, steps: int) -> None:
    batches = iter(recipe.batches(state))
    for _ in range(steps):
        recipe.step(state, next(batches))


def _plain_resume_runs(part: str, steps: int, resume_at: int) -> dict[str, float]:
    """The resume check's four runs trained one after another in this (warm) process, without any check."""
    import pathlib
    import tempfile

    recipe = _scale_recipe(part)
    _warm_up()
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = pathlib.Path(directory) / "checkpoint"
        start = time.perf_counter()
        _seed(0)  # interrupted: 1..resume_at, then save
        state = recipe.setup()
        _train(recipe, state, resume_at)
        recipe.save(state, checkpoint)
        for resumed in (False, True, False):  # baseline 1..steps; resumed from the checkpoint; baseline repeat
            del state
            _seed(0)
            state = recipe.load(checkpoint) if resumed else recipe.setup()
            _train(recipe, state, steps - resume_at if resumed else steps)
        seconds = time.perf_counter() - start
    return {"plain": seconds}


def _resume_check(recipe: Any, steps: int, resume_at: int, errors: list[str]) -> tuple[float, PeakRSS]:
    import trainparity as tp

    with PeakRSS() as rss:
        start = time.perf_counter()
        result = tp.check_resume(recipe, steps=steps, resume_at=resume_at, timeout=3600.0)
        seconds = time.perf_counter() - start
    if result.outcome is not tp.Outcome.PASS:  # a correct recipe: the figures would not be the check's cost
        errors.append(f"check_resume(steps={steps}, resume_at={resume_at}) is {result.outcome.name}:\n"
                      f"{result.report()[:3000]}")
    return seconds, rss


def _checked_resume(part: str, steps: int, resume_at: int) -> dict[str, Any]:
    """A cold check_resume (it starts the fork server), then the warm one measured: wall time, parent RSS."""
    recipe = _scale_recipe(part)
    errors: list[str] = []
    cold, _ = _resume_check(recipe, steps, resume_at, errors)
    warm, rss = _resume_check(recipe, steps, resume_at, errors)
    return {"cold": cold, "warm": warm, "before": rss.before, "peak": rss.peak, "method": rss.method,
            "errors": errors}


def _checked_steps() -> dict[str, Any]:
    """Parent peak RSS of check_resume at 6 and at 50 steps (after a cold 6-step check)."""
    recipe = _scale_recipe("steps")
    errors: list[str] = []
    _resume_check(recipe, 6, 3, errors)
    figures: dict[str, Any] = {"errors": errors}
    for steps in (6, 50):
        seconds, rss = _resume_check(recipe, steps, steps // 2, errors)
        figures[f"seconds_{steps}"], figures[f"peak_{steps}"], figures["method"] = seconds, rss.peak, rss.method
    return figures


#: rounds of (warm check, plain float32, plain float64) in the accumulation part of `bench.py scale`
ACCUMULATION_ROUNDS = 5


def _accumulation() -> dict[str, Any]:
    """check_accumulation (k=4, cycles=2) against plain training of the same steps: the first (cold) check, then
    ACCUMULATION_ROUNDS rounds of a warm check and plain training in float32 and float64, each figure the fastest
    of its rounds (these runs take tenths of a second, so one measurement of each, taken at different moments,
    mostly measures what else the machine was doing)."""
    import torch

    import trainparity as tp

    recipe, k, cycles = _scale_recipe("accumulation"), 4, 2
    _warm_up()

    def plain(dtype: torch.dtype) -> float:
        """The check's two runs as training: `cycles` full-batch steps, then `cycles` windows of k micro-batches."""
        start = time.perf_counter()
        for accumulation_steps in (1, k):
            _seed(0)
            trainer = _scale_recipe("accumulation", accumulation_steps=accumulation_steps)
            state = trainer.setup()
            state.model.to(dtype)
            batches = iter(trainer.batches(state))
            for _ in range(cycles):
                batch = tuple(part.to(dtype) if part.is_floating_point() else part for part in next(batches))
                for micro in tp.split_batch(batch, k) if accumulation_steps > 1 else [batch]:
                    trainer.step(state, micro)
        return time.perf_counter() - start

    errors: list[str] = []

    def check() -> float:
        start = time.perf_counter()
        result = tp.check_accumulation(recipe, microbatches=k, cycles=cycles)
        seconds = time.perf_counter() - start
        if result.outcome is not tp.Outcome.PASS:
            errors.append(f"check_accumulation is {result.outcome.name}:\n{result.report()[:3000]}")
        return seconds

    cold = check()
    rounds = [(check(), plain(torch.float32), plain(torch.float64)) for _ in range(ACCUMULATION_ROUNDS)]
    warm, float32, float64 = (min(figures) for figures in zip(*rounds, strict=True))
    return {"plain": float32, "plain_float64": float64, "cold": cold, "warm": warm, "errors": errors}


def scale_probe(name: str) -> None:
    """Run one measurement of `bench.py scale` in this process (a fresh interpreter) and print it as JSON."""
    import json

    kind, _, part = name.partition(":")
    if kind == "plain":
        figures: dict[str, Any] = _plain_resume_runs(part, 6, 3)
    elif kind == "check":
        figures = _checked_resume(part, 6, 3)
    elif kind == "steps":
        figures = _checked_steps()
    else:
        assert kind == "accumulation"
        figures = _accumulation()
    print(json.dumps(figures))


def _run_probe(name: str) -> dict[str, Any]:
    """`scale_probe(name)` in a new interpreter whose sys.path holds tools/, so that the checks' children import
    bench_recipes by name; its stderr passes through."""
    import json

    code = f"import sys; sys.path.insert(0, {TOOLS!r}); import bench; bench.scale_probe({name!r})"
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} probe exited with status {done.returncode}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def bench_scale(args: argparse.Namespace) -> None:
    """Checks on models of 16.8 M and 124 M parameters: time against plain training, and the parent's memory.

    Each measurement runs in a fresh interpreter (`scale_probe`), so that no part inherits another's memory:
    - mlp, gpt: the resume check's four runs (interrupted 1..3 and save, baseline 1..6, resumed 4..6 from the
      checkpoint, baseline repeat 1..6) trained one after another in one warm process without any check;
      in another process a first check_resume(steps=6, resume_at=3), then the warm one timed, with the
      parent's peak RSS during it;
    - steps: the parent's peak RSS during check_resume of a 1.1 M-parameter MLP at 50 steps against 6;
    - accumulation: check_accumulation of a 3.2 M-parameter MLP (k=4, cycles=2) against plain training of the
      same forward/backward/optimizer steps in one process, each the fastest of 5 interleaved rounds.
    Targets are reported, not enforced; the exit status is non-zero when a probe fails or a check on these
    correct recipes does not PASS.
    """
    parts = args.only or list(SCALE_PARTS)
    rows: list[tuple[str, str, str, str]] = []  # part, figure, value, target (with pass/FAIL)
    errors: list[str] = []
    method = ""

    def target(value: float, limit: float, text: str) -> str:
        return f"{text} {'pass' if value <= limit else 'FAIL'}"

    print(f"scale benchmark: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; parts: {', '.join(parts)}",
          flush=True)
    for part in parts:
        try:
            if part in ("mlp", "gpt"):
                label = {"mlp": "MLP 16.8M", "gpt": "GPT 124M"}[part]
                plain = _run_probe(f"plain:{part}")["plain"]
                check = _run_probe(f"check:{part}")
                errors += check["errors"]
                method = check["method"]
                ratio = check["warm"] / plain
                limit = {"mlp": 1000 * MB, "gpt": 2000 * MB}[part]
                rows += [
                    (label, "plain training of the check's 4 runs (18 steps, save, load)", f"{plain:.2f} s", ""),
                    (label, "first check_resume(steps=6, resume_at=3), cold", f"{check['cold']:.2f} s", ""),
                    (label, "warm check_resume (second call)", f"{check['warm']:.2f} s", ""),
                    (label, "warm check / plain training", f"{ratio:.2f}x", target(ratio, 1.5, "<= 1.5x")),
                    (label, "parent RSS before the warm check", f"{check['before'] / MB:.0f} MB", ""),
                    (label, "parent peak RSS during the warm check", f"{check['peak'] / MB:.0f} MB",
                     target(check["peak"], limit, f"<= {limit / MB:.0f} MB")),
                ]
            elif part == "steps":
                steps = _run_probe("steps")
                errors += steps["errors"]
                method = steps["method"]
                growth = steps["peak_50"] / steps["peak_6"]
                rows += [
                    ("MLP 1.1M", "parent peak RSS, check_resume 6 steps", f"{steps['peak_6'] / MB:.0f} MB", ""),
                    ("MLP 1.1M", "parent peak RSS, check_resume 50 steps", f"{steps['peak_50'] / MB:.0f} MB", ""),
                    ("MLP 1.1M", "50 steps / 6 steps", f"{growth:.3f}x", target(growth, 1.1, "<= 1.10x")),
                ]
            else:
                accumulation = _run_probe("accumulation")
                errors += accumulation["errors"]
                ratio = accumulation["warm"] / accumulation["plain"]
                best = f"fastest of {ACCUMULATION_ROUNDS}"
                rows += [
                    ("MLP 3.2M", f"plain training, float32 (2 steps, 2 windows of 4; {best})",
                     f"{accumulation['plain']:.3f} s", ""),
                    ("MLP 3.2M", f"plain training, float64 (the check's default; {best})",
                     f"{accumulation['plain_float64']:.3f} s", ""),
                    ("MLP 3.2M", "first check_accumulation(k=4, cycles=2)", f"{accumulation['cold']:.3f} s", ""),
                    ("MLP 3.2M", f"warm check_accumulation ({best})", f"{accumulation['warm']:.3f} s", ""),
                    ("MLP 3.2M", "warm check / plain float32", f"{ratio:.2f}x", target(ratio, 2, "<= 2x")),
                    ("MLP 3.2M", "warm check / plain float64",
                     f"{accumulation['warm'] / accumulation['plain_float64']:.2f}x", ""),
                ]
        except (RuntimeError, ValueError, KeyError) as error:  # a probe that failed: reported, and the exit fails
            errors.append(f"{part}: {error}")
    if method:
        print(f"parent peak RSS: {method}")
    widths = [max(len(row[i]) for row in rows) for i in range(4)] if rows else []
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    sys.stdout.flush()
    for message in errors:
        print(f"ERROR: {message}", file=sys.stderr)
    if errors:
        raise SystemExit(1)


BENCHMARKS["scale"] = bench_scale


def bench_preflight(args: argparse.Namespace) -> None:
    """The preflight checks in-process, after import, on the quickstarts' small MLPs (target <= 50 ms each):
    `check_optimizer_coverage` (setup and 1 step) and `check_mixed_precision` (4 steps under autocast with a
    CPU GradScaler). Prints torch's one-time start-up, then the first check, the median of 20 with torch's
    default intra-op threads and with one thread, and plain training of the same steps (setup() and step()
    calls, no check) for reference.
    """
    import statistics

    import torch

    import trainparity as tp
    from trainparity.quickstarts.mixed_precision import AmpRegression
    from trainparity.quickstarts.optimizer_coverage import FineTune

    def plain(recipe: Any, steps: int) -> float:
        start = time.perf_counter()
        torch.manual_seed(0)
        state = recipe.setup()
        batches = iter(recipe.batches(state))
        for _ in range(steps):
            recipe.step(state, next(batches))
        return time.perf_counter() - start

    def checked(check: Callable[[], tp.Result]) -> float:
        start = time.perf_counter()
        result = check()
        elapsed = time.perf_counter() - start
        assert result.passed, result.report()
        return elapsed

    print(f"preflight checks, small MLPs, in-process (target <= 50 ms each); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    start = time.perf_counter()
    _warm_up()
    print(f"torch's one-time start-up (first AdamW step of an unrelated model, no check): "
          f"{time.perf_counter() - start:.3f} s")
    cases: list[tuple[str, Callable[[], tp.Result], Any, int]] = [
        ("check_optimizer_coverage, 1 step", lambda: tp.check_optimizer_coverage(FineTune, steps=1), FineTune(), 1),
        ("check_mixed_precision, 4 steps", lambda: tp.check_mixed_precision(AmpRegression, steps=4),
         AmpRegression(), 4),
    ]
    threads = torch.get_num_threads()
    for name, check, recipe, steps in cases:
        print(f"{name}: first check {checked(check) * 1e3:.1f} ms")
        for count in dict.fromkeys((threads, 1)):
            torch.set_num_threads(count)
            warm = statistics.median(checked(check) for _ in range(20))
            training = statistics.median(plain(recipe, steps) for _ in range(20))
            verdict = "pass" if warm <= 0.05 else "FAIL"
            print(f"  median of 20, torch threads={count}: {warm * 1e3:.1f} ms ({verdict}); plain training of the "
                  f"same steps: {training * 1e3:.1f} ms")
        torch.set_num_threads(threads)


BENCHMARKS["preflight"] = bench_preflight

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    parser.add_argument("--only", action="append", choices=SCALE_PARTS,
                        help="scale: run only this part (repeatable)")
    args = parser.parse_args()
    if args.only and args.benchmark != "scale":
        parser.error("--only applies to the scale benchmark")
    BENCHMARKS[args.benchmark](args)


if __name__ == "__main__":
    main()
