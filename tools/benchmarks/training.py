"""`check_training` in-process on a small MLP (bench_recipes.MLP: 784 -> 256 -> 256 -> 10, batches of 64, AdamW),
20 steps, against the plain training of the same steps (setup() and 20 step() calls, no check), target <= 1.2x.
Both run in this process with one torch thread, in pairs (plain, then checked), so that the machine's load falls on
both alike; the verdict is the median of the pairs' ratios of wall time. Prints it, the median and the fastest of
each, the median ratio of this thread's CPU time (which another process's load does not inflate), and the load.
The shape is MNIST's classic MLP: the check's cost grows with the parameters, the training's with the batch too, so
the ratio is larger for a narrower model on smaller batches.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from benchmarks._timing import machine, seconds, seed_like_the_checks, train, warm_up_torch

TARGET = 1.2
STEPS = 20
MLP_SHAPE = {"inputs": 784, "width": 256, "hidden": 2, "outputs": 10, "batch": 64}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=30, help="pairs of (plain, checked) runs timed (default: 30)")


def run(args: argparse.Namespace) -> None:
    import torch
    from bench_recipes import MLP

    import trainparity as tp

    def plain() -> None:
        seed_like_the_checks(0)  # as the check seeds before setup()
        recipe = MLP(**MLP_SHAPE)
        train(recipe, recipe.setup(), STEPS)

    def checked() -> None:
        result = tp.check_training(MLP(**MLP_SHAPE), steps=STEPS, max_grad_norm=1e3, update_ratio=(0.0, 1.0),
                                   max_skipped_steps=0)
        assert result.outcome is not tp.Outcome.ERROR, result.report()

    torch.set_num_threads(1)
    warm_up_torch()
    print(f"check_training, {STEPS} steps of a small MLP, in-process, torch threads=1; {machine()}")
    first = seconds(checked)
    timings: dict[str, list[float]] = {"plain": [], "checked": []}
    cpu: dict[str, list[float]] = {"plain": [], "checked": []}
    actions: dict[str, Callable[[], None]] = {"plain": plain, "checked": checked}
    for _ in range(args.rounds):
        for name, action in actions.items():
            start = time.thread_time()
            timings[name].append(seconds(action))
            cpu[name].append(time.thread_time() - start)
    ratio = statistics.median(c / p for p, c in zip(timings["plain"], timings["checked"], strict=True))
    cpu_ratio = statistics.median(c / p for p, c in zip(cpu["plain"], cpu["checked"], strict=True))
    median = {name: statistics.median(values) for name, values in timings.items()}
    fastest = {name: min(values) for name, values in timings.items()}
    print(f"  first check in this process: {first * 1e3:.1f} ms")
    print(f"  plain training: median {median['plain'] * 1e3:.1f} ms, fastest {fastest['plain'] * 1e3:.1f} ms")
    print(f"  check_training: median {median['checked'] * 1e3:.1f} ms, fastest {fastest['checked'] * 1e3:.1f} ms")
    print(f"  median ratio of {args.rounds} pairs {ratio:.2f} ({'pass' if ratio <= TARGET else 'FAIL'}: target <= "
          f"{TARGET}x); ratio of the fastest {fastest['checked'] / fastest['plain']:.2f}; of this thread's CPU time "
          f"{cpu_ratio:.2f}; {machine()}")
