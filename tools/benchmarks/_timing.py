"""What every benchmark shares: timing a call, the reference figures it is held against, and the machine's load.

Ratios are measured in the same run as their reference; timings of sub-second work are the median or the
fastest of several rounds, since one measurement mostly measures what else the machine was doing.
"""

from __future__ import annotations

import os
import pathlib
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
MB = 1e6


def seconds(action: Callable[[], object]) -> float:
    """Wall time of one call of `action`."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median_seconds(action: Callable[[], object], rounds: int) -> float:
    """The median wall time of `rounds` calls of `action`."""
    return statistics.median(seconds(action) for _ in range(rounds))


def fastest_seconds(action: Callable[[], object], rounds: int) -> float:
    """The fastest of `rounds` calls of `action`: the floor that a loaded machine's noise only adds to."""
    return min(seconds(action) for _ in range(rounds))


def in_fresh_interpreter(module: str, function: str, *arguments: object) -> dict[str, Any]:
    """`benchmarks.<module>.<function>(*arguments)` in a new interpreter whose sys.path holds tools/ (so that the
    checks' children, which take the parent's sys.path, import the benchmark's recipes by name); the JSON object it
    prints last. Its stderr passes through."""
    import json

    code = (f"import sys; sys.path.insert(0, {str(TOOLS)!r}); import benchmarks.{module} as probe; "
            f"probe.{function}(*{arguments!r})")
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{module}.{function}{arguments!r} exited with status {done.returncode}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def torch_import_seconds(repeats: int = 3) -> float:
    """Median wall time of `python -c "import torch"` in a new interpreter, measured now."""
    return median_seconds(lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True), repeats)


def machine() -> str:
    """`load average 1.2 on 2 cores`: printed beside every figure, since a busy machine changes them all."""
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def warm_up_torch() -> None:
    """What the fork server does before its first child: import torch and trainparity, step a small AdamW."""
    import torch

    import trainparity  # noqa: F401

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


def seed_like_the_checks(seed: int) -> None:
    """The seeding the checks do before each run's setup() or load()."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(recipe: Any, state: Any, steps: int) -> None:
    """`steps` calls of the recipe's step() on its batches, without any check."""
    batches = iter(recipe.batches(state))
    for _ in range(steps):
        recipe.step(state, next(batches))


def plain_resume_runs(recipe: Any, steps: int, resume_at: int) -> float:
    """Seconds of the resume check's four runs trained one after another in this (warm) process, without any
    check: interrupted 1..resume_at and save; baseline 1..steps; resumed from the checkpoint; baseline repeat."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        checkpoint = pathlib.Path(directory) / "checkpoint"
        start = time.perf_counter()
        seed_like_the_checks(0)
        state = recipe.setup()
        train(recipe, state, resume_at)
        recipe.save(state, checkpoint)
        for resumed in (False, True, False):
            del state
            seed_like_the_checks(0)
            state = recipe.load(checkpoint) if resumed else recipe.setup()
            train(recipe, state, steps - resume_at if resumed else steps)
        return time.perf_counter() - start


def plain_accumulation_runs(make: Callable[..., Any], microbatches: int, cycles: int, dtype: Any) -> None:
    """The accumulation check's two runs as plain training in `dtype`: `cycles` full-batch steps of
    `make(accumulation_steps=1)`, then `cycles` windows of `microbatches` micro-batches of
    `make(accumulation_steps=microbatches)`."""
    import trainparity as tp

    for accumulation_steps in (1, microbatches):
        seed_like_the_checks(0)
        trainer = make(accumulation_steps=accumulation_steps)
        state = trainer.setup()
        state.model.to(dtype)
        batches = iter(trainer.batches(state))
        for _ in range(cycles):
            batch = tuple(part.to(dtype) if part.is_floating_point() else part for part in next(batches))
            for micro in tp.split_batch(batch, microbatches) if accumulation_steps > 1 else [batch]:
                trainer.step(state, micro)


def plain_parallel_runs(make: Callable[[], Any], world_size: int, steps: int) -> None:
    """The parallel check's runs as plain training in float64 (its precision): the reference, a world of one rank,
    then the world of `world_size` ranks, each rank a thread of this process as `backend="threads"` runs them."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for size in (1, world_size):
            _plain_world(make, size, steps)
    finally:
        torch.set_default_dtype(previous)


def _plain_world(make: Callable[[], Any], size: int, steps: int) -> None:
    import torch.distributed as dist

    from trainparity._process._threads import ThreadedWorld

    def rank(number: int) -> None:
        world.join()
        recipe = make()
        seed_like_the_checks(0)
        train(recipe, recipe.setup(), steps)
        dist.destroy_process_group()

    world = ThreadedWorld(size, rank)
    world.run()


def fork_seconds(rounds: int = 20) -> float:
    """The median time of one process start from this (warm) interpreter: fork, the child's exit, the wait."""
    def start() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    return median_seconds(start, rounds)


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
