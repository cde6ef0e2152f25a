"""The preflight checks in-process, after import, on the quickstarts' small MLPs (target <= 50 ms each):
`check_optimizer_coverage` (setup and 1 step) and `check_mixed_precision` (4 steps under autocast with a
CPU GradScaler). Prints torch's one-time start-up, then the first check, the best of 9, the median of 20 with
torch's default intra-op threads and with one thread, and plain training of the same steps (setup() and step()
calls, no check) for reference.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from benchmarks._timing import fastest_seconds, machine, median_seconds, seconds, train, warm_up_torch


def run(args: argparse.Namespace) -> None:
    import torch

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

    print(f"preflight checks, small MLPs, in-process (target <= 50 ms each); {machine()}")
    print(f"torch's one-time start-up (first AdamW step of an unrelated model, no check): "
          f"{seconds(warm_up_torch):.3f} s")
    cases: list[tuple[str, Callable[[], tp.Result], Any, int]] = [
        ("check_optimizer_coverage, 1 step", lambda: tp.check_optimizer_coverage(FineTune, steps=1), FineTune(), 1),
        ("check_mixed_precision, 4 steps", lambda: tp.check_mixed_precision(AmpRegression, steps=4),
         AmpRegression(), 4),
    ]
    threads = torch.get_num_threads()
    for name, check, recipe, steps in cases:
        print(f"{name}: first check {seconds(checked(check)) * 1e3:.1f} ms; best of 9 with torch's default threads "
              f"{fastest_seconds(checked(check), 9) * 1e3:.1f} ms (target <= 50 ms)")
        for count in dict.fromkeys((threads, 1)):
            torch.set_num_threads(count)
            warm = median_seconds(checked(check), 20)
            training = median_seconds(plain(recipe, steps), 20)
            verdict = "pass" if warm <= 0.05 else "FAIL"
            print(f"  median of 20, torch threads={count}: {warm * 1e3:.1f} ms ({verdict}); plain training of the "
                  f"same steps: {training * 1e3:.1f} ms")
        torch.set_num_threads(threads)
