"""Each check's fixed cost on a tiny model: its wall time against plain training of the same runs, in one run.

In one fresh interpreter: each check once cold (the first call: the fork server starts, first imports), then 9
warm calls alternated with 9 plain trainings of the runs the check makes (setup(), step() calls, save() and load(),
no check), each side's median. The tiny model: an MLP 16 -> 2 x 96 -> 1 (11 k parameters),
AdamW, batches of 16, 6 steps; the preflight checks take their default number of steps, train_mode and frozen
on bench_recipes.FineTuneMLP (a frozen BatchNorm encoder, dropout, an evaluation every 2 steps) and
mixed_precision on the quickstart's AmpRegression.

Bounds (issue 38): the warm resume check within 3x its four plain runs plus one process start (fork, exit, wait,
measured here); accumulation (its two runs in float64, the precision it judges in), parallel (the same MLP in DDP,
its reference and a world of 2 ranks as threads, in float64) and each preflight check within 2x their plain runs.
The exit status is non-zero when a check does not PASS (its figures would not be the check's cost); a bound that
does not hold is printed as FAIL.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

from benchmarks._timing import (
    fork_seconds,
    machine,
    plain_accumulation_runs,
    plain_parallel_runs,
    plain_resume_runs,
    seconds,
    seed_like_the_checks,
    train,
    warm_up_torch,
)

ROUNDS = 9
STEPS = 6
#: the parallel check's world: its ranks as threads
WORLD_SIZE = 2


def _tiny(**overrides: int) -> Any:
    from bench_recipes import MLP

    return MLP(inputs=16, width=96, hidden=2, outputs=1, batch=16, **overrides)


def _tiny_sharded() -> Any:
    from bench_recipes import ShardedMLP

    return ShardedMLP(inputs=16, width=96, hidden=2, outputs=1, batch=16)


def _default_steps(check: Callable[..., Any]) -> int:
    steps: int = inspect.signature(check).parameters["steps"].default
    return steps


def probe() -> None:
    """Every measurement, in this (fresh) interpreter; printed as JSON rows."""
    import torch
    from bench_recipes import FineTuneMLP, parameter_count

    import trainparity as tp
    from trainparity.quickstarts.mixed_precision import AmpRegression

    warm_up_torch()
    errors: list[str] = []

    def checking(check: Callable[[], tp.Result]) -> Callable[[], None]:
        def call() -> None:
            result = check()
            if result.outcome is not tp.Outcome.PASS and len(errors) < 20:
                errors.append(f"{result.report()[:2000]}")

        return call

    def training(recipe: Any, steps: int) -> Callable[[], None]:
        def call() -> None:
            seed_like_the_checks(0)
            train(recipe, recipe.setup(), steps)

        return call

    preflight = [
        ("check_optimizer_coverage", lambda: tp.check_optimizer_coverage(_tiny()), _tiny(),
         _default_steps(tp.check_optimizer_coverage)),
        ("check_training", lambda: tp.check_training(_tiny()), _tiny(), _default_steps(tp.check_training)),
        ("check_mixed_precision", lambda: tp.check_mixed_precision(AmpRegression), AmpRegression(),
         _default_steps(tp.check_mixed_precision)),
        ("check_train_mode", lambda: tp.check_train_mode(FineTuneMLP, eval_modules="0"), FineTuneMLP(),
         _default_steps(tp.check_train_mode)),
        ("check_frozen", lambda: tp.check_frozen(FineTuneMLP), FineTuneMLP(), _default_steps(tp.check_frozen)),
    ]
    rows: list[dict[str, Any]] = []

    def measure(name: str, check: Callable[[], tp.Result], plain: Callable[[], object], what: str,
                bound: float, extra: float = 0.0) -> None:
        cold = seconds(checking(check))
        # Alternated, so that a change in the machine's load (it is shared) weighs on both sides alike.
        warms, plains = zip(*((seconds(checking(check)), seconds(plain)) for _ in range(ROUNDS)), strict=True)
        warm, reference = statistics.median(warms), statistics.median(plains) + extra
        rows.append({"check": name, "cold": cold, "warm": warm, "plain": reference, "what": what, "bound": bound})

    start = fork_seconds()
    measure("check_resume", lambda: tp.check_resume(_tiny(), steps=STEPS, resume_at=STEPS // 2),
            lambda: plain_resume_runs(_tiny(), STEPS, STEPS // 2),
            f"4 runs (18 steps, save, load) + one process start ({start * 1e3:.1f} ms)", 3.0, extra=start)
    measure("check_accumulation", lambda: tp.check_accumulation(_tiny(), microbatches=4, cycles=2),
            lambda: plain_accumulation_runs(_tiny, 4, 2, torch.float64), "2 runs, float64 (2 steps, 2 windows of 4)",
            2.0)
    measure("check_parallel (threads)",
            lambda: tp.check_parallel(_tiny_sharded(), world_size=WORLD_SIZE, backend="threads", steps=STEPS),
            lambda: plain_parallel_runs(_tiny_sharded, WORLD_SIZE, STEPS),
            f"a world of 1 and of {WORLD_SIZE} ranks as threads, float64, DDP ({STEPS} steps each)", 2.0)
    for name, check, recipe, steps in preflight:
        measure(name, check, training(recipe, steps), f"setup + {steps} steps", 2.0)
    print(json.dumps({"rows": rows, "errors": errors, "parameters": parameter_count(_tiny().setup().model)}))


def run(args: argparse.Namespace) -> None:
    from benchmarks._timing import in_fresh_interpreter

    figures = in_fresh_interpreter("overhead", "probe")
    print(f"check overhead on a tiny model ({figures['parameters']:,} parameters, {STEPS} steps); {machine()}; "
          f"warm figures are medians of {ROUNDS}")
    table = [("check", "cold", "warm", "plain runs", "ratio", "bound", "plain: what")]
    for row in figures["rows"]:
        ratio = row["warm"] / row["plain"]
        table.append((row["check"], f"{row['cold'] * 1e3:.0f} ms", f"{row['warm'] * 1e3:.1f} ms",
                      f"{row['plain'] * 1e3:.1f} ms", f"{ratio:.2f}x",
                      f"<= {row['bound']:.0f}x {'pass' if ratio <= row['bound'] else 'FAIL'}", row["what"]))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    sys.stdout.flush()
    for message in figures["errors"]:
        print(f"ERROR: a check did not PASS:\n{message}", file=sys.stderr)
    if figures["errors"]:
        raise SystemExit(1)
