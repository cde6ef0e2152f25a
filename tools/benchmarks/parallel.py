"""The parallel check at scale: a tiny GPT (examples/fsdp_tp_gpt.py: 2 layers, width 32) with FSDP2 x tensor parallel
on a (W/4, 4) mesh of ranks as threads (`backend="threads"`), 3 steps in float64, at W=8 and W=64, against the plain
threaded training of the same world and steps measured in the same run (the floor: the world itself has to run).
Targets: each check within 2x its plain world; the peak memory of the check's largest process at W=64 at most 4 GB.
The single-process reference (the world of size 1) is printed beside them.

The plain worlds run in fresh interpreters (timed from the world's start, imports excluded); the checks run in this
process, after one warm-up check that starts the fork server. The peak memory is the largest resident size among the
check's processes, spawned as this process's children (`isolation="spawn"`) in a fresh interpreter.

`--gloo` adds round 3's figures: a 2-rank FSDP2 check on gloo processes, and a resume check of the FSDP2 + DCP
tiny GPT of examples/fsdp_gpt.py from 2 ranks to 1.

Then the pipelines of examples/pipeline_mlp.py: 2 stages under 1F1B (4 micro-batches, a tied weight), and 8 ranks
as 4 pipelines of 2 stages (dp x pp), 3 steps each, on gloo processes and as threads, against the same runs as
plain training in the same run: on gloo the ranks and the reference (the whole model in a world of one), each a
process forked from this warm interpreter, started together, joining gloo through a file store; as threads, the
reference and the world in this process, as `backend="threads"` runs them; medians of 5 runs each. Target: each
check within 2x its plain runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks._timing import (
    ROOT,
    in_fresh_interpreter,
    machine,
    median_seconds,
    plain_parallel_runs,
    seconds,
    seed_like_the_checks,
    train,
)

TARGET = 2.0
MEMORY_TARGET_GB = 4.0
STEPS = 3
WORLDS = (8, 64)
#: the pipelines' figures are medians of this many runs (each well under a second)
ROUNDS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gloo", action="store_true", help="also the 2-rank gloo figures of round 3")


def plain_world(world: int) -> None:
    """Print the wall time of `world` threaded ranks training MeshGPT `STEPS` steps in float64, nothing observed."""
    sys.path[:0] = [str(ROOT / "examples")]
    import torch
    import torch.distributed as dist
    from fsdp_tp_gpt import MeshGPT

    from trainparity._process._threads import ThreadedWorld

    def rank(number: int) -> None:
        threads.join()
        recipe = MeshGPT()
        torch.manual_seed(0)
        state = recipe.setup()
        batches = iter(recipe.batches(state))
        for _ in range(STEPS):
            recipe.step(state, next(batches))
        dist.barrier()
        dist.destroy_process_group()

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    threads = ThreadedWorld(world, rank)
    start = time.perf_counter()
    threads.run()
    print(json.dumps({"seconds": time.perf_counter() - start}))


def check_memory(world: int) -> None:
    """Print the peak resident size (GB) of the largest process of one check of `world` ranks as threads."""
    sys.path[:0] = [str(ROOT / "examples")]
    from fsdp_tp_gpt import MeshGPT

    import trainparity as tp

    result = tp.check_parallel(MeshGPT(), world_size=world, backend="threads", steps=STEPS, isolation="spawn",
                               timeout=600)
    assert result.passed, result.report()
    print(json.dumps({"gb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9}))


def run(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(ROOT / "examples")]
    from fsdp_tp_gpt import MeshGPT

    import trainparity as tp

    print(f"{machine()}; ranks as threads of one process, float64, {STEPS} steps")
    reference = in_fresh_interpreter("parallel", "plain_world", 1)["seconds"]
    print(f"single-process reference (the world of size 1), plain: {reference:.2f} s")
    tp.check_parallel(MeshGPT(), world_size=8, backend="threads", steps=1)  # starts the fork server
    failed = False
    for world in WORLDS:
        plain = in_fresh_interpreter("parallel", "plain_world", world)["seconds"]
        results: list[tp.Result] = []
        start = time.perf_counter()
        results.append(tp.check_parallel(MeshGPT(), world_size=world, backend="threads", steps=STEPS, timeout=600))
        checked = time.perf_counter() - start
        assert results[0].passed, results[0].report()
        ratio = checked / plain
        failed |= ratio > TARGET
        print(f"W={world}: check {checked:.2f} s, plain threaded world {plain:.2f} s: {ratio:.2f}x "
              f"(target <= {TARGET:g}x) {'ok' if ratio <= TARGET else 'OVER'}")
    peak = in_fresh_interpreter("parallel", "check_memory", WORLDS[-1])["gb"]
    failed |= peak > MEMORY_TARGET_GB
    print(f"W={WORLDS[-1]}: peak memory of the check's largest process {peak:.2f} GB (target <= "
          f"{MEMORY_TARGET_GB:g} GB) {'ok' if peak <= MEMORY_TARGET_GB else 'OVER'}")
    if args.gloo:
        _gloo_figures()
    failed |= _pipeline_figures()
    if failed:
        raise SystemExit(1)


def _gloo_figures() -> None:
    sys.path[:0] = [str(ROOT / "test")]
    from fsdp_gpt import TinyGPT
    from parallel_recipes import FSDPRecipe

    import trainparity as tp

    checks: list[tuple[str, Callable[[], tp.Result]]] = [
        ("parallel check, FSDP2, 2 gloo ranks and the reference, 3 steps",
         lambda: tp.check_parallel(FSDPRecipe(), world_size=2, steps=3)),
        ("resume check, FSDP2 + DCP tiny GPT, 6 steps, saved on 2 ranks at 3, resumed on 1 (7 processes)",
         lambda: tp.check_resume(TinyGPT(dropout=0.0), steps=6, resume_at=3, world_size=2, resume_world_size=1)),
    ]
    for name, check in checks:
        for which in ("first", "again"):
            results: list[tp.Result] = []
            elapsed = seconds(lambda: results.append(check()))  # noqa: B023 - called at once
            assert results[0].passed, results[0].report()
            print(f"{name} ({which}): {elapsed:.2f} s")


def _pipeline_figures() -> bool:
    """Print each pipeline check's time against its plain runs; whether one is over the target."""
    from pipeline_mlp import Pipeline

    import trainparity as tp

    worlds = [("2 stages, 1F1B, 4 micro-batches, tied weight", 2, lambda: Pipeline("1f1b", 4, tied=True)),
              ("8 ranks: 4 pipelines x 2 stages, 1F1B, 3 micro-batches", 8, lambda: Pipeline("1f1b", 3, dp=4))]
    tp.check_parallel(worlds[0][2](), world_size=2, steps=1)  # starts the fork server
    failed = False
    for (name, world, make), backend in itertools.product(worlds, ("gloo", "threads")):
        plain = statistics.median(_plain_gloo(make, world) for _ in range(ROUNDS)) if backend == "gloo" else \
            median_seconds(lambda: plain_parallel_runs(make, world, STEPS), ROUNDS)  # noqa: B023 - called at once
        results: list[tp.Result] = []
        checked = median_seconds(lambda: results.append(tp.check_parallel(  # noqa: B023 - called at once
            make(), world_size=world, backend=backend, steps=STEPS, timeout=600)), ROUNDS)  # noqa: B023
        assert all(result.passed for result in results), results[0].report()
        ratio = checked / plain
        failed |= ratio > TARGET
        print(f"pipeline, {name} ({backend}): check {checked:.2f} s, plain runs {plain:.2f} s: {ratio:.2f}x "
              f"(target <= {TARGET:g}x) {'ok' if ratio <= TARGET else 'OVER'}")
    return failed


def _plain_gloo(make: Callable[[], Any], world: int) -> float:
    """The wall time of the parallel check's runs as plain training in float64 (its precision): `world` gloo ranks and
    the reference (a world of one rank), each a process forked from this interpreter, all started together."""
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh
    import torch.distributed.pipelining  # noqa: F401  (imported once here, as the check's fork server has them)

    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        children = []
        for size, rank in [*((world, rank) for rank in range(world)), (1, 0)]:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    torch.set_num_threads(1)
                    torch.set_default_dtype(torch.float64)
                    dist.init_process_group("gloo", init_method=f"file://{directory}/store.{size}", rank=rank,
                                            world_size=size)
                    recipe = make()
                    seed_like_the_checks(0)
                    train(recipe, recipe.setup(), STEPS)
                    dist.destroy_process_group()
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        statuses = [os.waitpid(pid, 0)[1] for pid in children]
        elapsed = time.perf_counter() - start
    assert statuses == [0] * len(children), f"a plain run failed: wait statuses {statuses}"
    return elapsed
