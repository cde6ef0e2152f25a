"""The preflight checks in-process, after import, on small MLPs: `check_optimizer_coverage` (the quickstart's,
setup and 1 step) and `check_mixed_precision` (4 steps under autocast with a CPU GradScaler), target <= 50 ms
each; `check_frozen` (2 steps) and `check_train_mode` (3 steps, an evaluation among them) on a fine-tuned MLP
with a frozen BatchNorm encoder and dropout (bench_recipes.FineTuneMLP), target <= 50 ms plus the training they
watch. Prints torch's one-time start-up, then the first check, the best of 9, the median of 20 with torch's
default intra-op threads and with one thread, and plain training of the same steps (setup() and step() calls,
no check) beside it, measured in the same run.

Then the cost of the autocast watch (`_observe/_autocast.py`: the dispatch mode pushed inside autocast regions,
the wrapped autocast class, the module hooks) on one `step()` call (target: the watched step <= 2x the plain
one): the median of 200 steps of the same State, plain and watched, on the quickstart's MLP and on the bfloat16
language model of `examples/autocast_lm.py` (whose recipe declares `autocast_dtype`, so its module forwards
are watched too).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from benchmarks._timing import ROOT, fastest_seconds, machine, median_seconds, seconds, train, warm_up_torch


def _step_seconds(recipe: Any, blocks: int = 10, steps: int = 20) -> tuple[float, float]:
    """The median time of one step() call on one State, plain and under the autocast watch, measured in alternating
    blocks of `steps` calls so that the machine's load drifts alike over both."""
    import statistics

    import torch

    from trainparity._observe._autocast import AutocastWatch, RegionRequests
    from trainparity._preflight._autocast import declared_dtype

    torch.manual_seed(0)
    state = recipe.setup()
    batch = next(iter(recipe.batches(state)))
    for _ in range(10):  # warm: the optimizer's state, autocast's caches
        recipe.step(state, batch)
    plain: list[float] = []
    watched: list[float] = []
    for _ in range(blocks):
        plain += [seconds(lambda: recipe.step(state, batch)) for _ in range(steps)]
        with RegionRequests() as requests, AutocastWatch(state, declared_dtype(type(recipe)), requests) as watch:
            for _ in range(steps):
                watched.append(seconds(lambda: recipe.step(state, batch)))
                watch.take()
    return statistics.median(plain), statistics.median(watched)


def autocast_overhead() -> None:
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from autocast_lm import AutocastLM

    from trainparity.quickstarts.mixed_precision import AmpRegression

    print(f"autocast observation of one step() (target: watched <= 2x plain); {machine()}")
    threads = torch.get_num_threads()
    for name, recipe in (("quickstart MLP, autocast + GradScaler", AmpRegression()),
                         ("examples/autocast_lm.py, bfloat16 transformer", AutocastLM())):
        for count in dict.fromkeys((threads, 1)):
            torch.set_num_threads(count)
            plain, watched = _step_seconds(recipe)
            ratio = watched / plain
            print(f"  {name}, torch threads={count}: plain {plain * 1e3:.3f} ms, watched {watched * 1e3:.3f} ms, "
                  f"{ratio:.2f}x ({'pass' if ratio <= 2 else 'FAIL'})")
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> None:
    import torch
    from bench_recipes import FineTuneMLP

    import trainparity as tp
    from trainparity.quickstarts.mixed_precision import AmpRegression
    from trainparity.quickstarts.optimizer_coverage import FineTune

    def plain(recipe: Any, steps: int) -> Callable[[], object]:
        def training() -> None:
            torch.manual_seed(0)
            train(recipe, recipe.setup(), steps)

        return training

    def checked(check: Callable[[], tp.Result]) -> Callable[[], object]:
        def checking() -> None:
            result = check()
            assert result.passed, result.report()

        return checking

    print(f"preflight checks, small MLPs, in-process; {machine()}")
    print(f"torch's one-time start-up (first AdamW step of an unrelated model, no check): "
          f"{seconds(warm_up_torch):.3f} s")
    # (name, check, recipe, steps, whether the 50 ms exclude the training the check watches)
    cases: list[tuple[str, Callable[[], tp.Result], Any, int, bool]] = [
        ("check_optimizer_coverage, 1 step", lambda: tp.check_optimizer_coverage(FineTune, steps=1), FineTune(), 1,
         False),
        ("check_mixed_precision, 4 steps", lambda: tp.check_mixed_precision(AmpRegression, steps=4),
         AmpRegression(), 4, False),
        ("check_frozen, 2 steps", lambda: tp.check_frozen(FineTuneMLP, steps=2), FineTuneMLP(), 2, True),
        ("check_train_mode, 3 steps", lambda: tp.check_train_mode(FineTuneMLP, steps=3, eval_modules="0"),
         FineTuneMLP(), 3, True),
    ]
    threads = torch.get_num_threads()
    for name, check, recipe, steps, plus_training in cases:
        target = "<= 50 ms plus the training" if plus_training else "<= 50 ms"
        print(f"{name}: first check {seconds(checked(check)) * 1e3:.1f} ms; best of 9 with torch's default threads "
              f"{fastest_seconds(checked(check), 9) * 1e3:.1f} ms (target {target})")
        for count in dict.fromkeys((threads, 1)):
            torch.set_num_threads(count)
            warm = median_seconds(checked(check), 20)
            training = median_seconds(plain(recipe, steps), 20)
            verdict = "pass" if warm <= 0.05 + (training if plus_training else 0.0) else "FAIL"
            print(f"  median of 20, torch threads={count}: {warm * 1e3:.1f} ms ({verdict}); plain training of the "
                  f"same steps: {training * 1e3:.1f} ms")
        torch.set_num_threads(threads)
    autocast_overhead()
