"""Checks on models of 16.8 M and 124 M parameters: time against plain training, and the parent's memory.

Each measurement runs in a fresh interpreter (`scale_probe`), so that no part inherits another's memory:
- mlp, gpt: the resume check's four runs (interrupted 1..3 and save, baseline 1..6, resumed 4..6 from the
  checkpoint, baseline repeat 1..6) trained one after another in one warm process without any check;
  in another process a first check_resume(steps=6, resume_at=3), then the warm one timed, with the
  parent's peak RSS during it;
- steps: the parent's peak RSS during check_resume of a 1.1 M-parameter MLP at 50 steps against 6;
- accumulation: check_accumulation of a 3.2 M-parameter MLP (k=4, cycles=2) against plain training of the
  same forward/backward/optimizer steps in one process, in float32 and in float64 (the check's judging
  precision, hence the floor; the target is against it), each the fastest of 5 interleaved rounds; and, as
  medians of those rounds, the CPU-time ratio and the minor page faults of the check and of float64 training.
Targets are reported, not enforced; the exit status is non-zero when a probe fails or a check on these
correct recipes does not PASS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

from benchmarks._timing import (
    MB,
    PeakRSS,
    in_fresh_interpreter,
    plain_accumulation_runs,
    plain_resume_runs,
    warm_up_torch,
)

#: the parts of the scale benchmark, each runnable alone with --only
PARTS = ("mlp", "gpt", "steps", "accumulation")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", choices=PARTS, help="scale: run only this part (repeatable)")


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


def _plain_resume_runs(part: str, steps: int, resume_at: int) -> dict[str, float]:
    """The resume check's four runs trained one after another in this (warm) process, without any check."""
    recipe = _scale_recipe(part)
    warm_up_torch()
    return {"plain": plain_resume_runs(recipe, steps, resume_at)}


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


#: rounds of (warm check, plain float32, plain float64) in the accumulation part of the scale benchmark
ACCUMULATION_ROUNDS = 5


def _accumulation() -> dict[str, Any]:
    """check_accumulation (k=4, cycles=2) against plain training of the same steps: the first (cold) check, then
    ACCUMULATION_ROUNDS rounds of a warm check and plain training in float32 and float64, each figure the fastest
    of its rounds (these runs take tenths of a second, so one measurement of each, taken at different moments,
    mostly measures what else the machine was doing)."""
    import torch

    import trainparity as tp

    recipe, k, cycles = _scale_recipe("accumulation"), 4, 2
    warm_up_torch()

    def plain(dtype: torch.dtype) -> None:
        plain_accumulation_runs(lambda **overrides: _scale_recipe("accumulation", **overrides), k, cycles, dtype)

    errors: list[str] = []

    def check() -> None:
        result = tp.check_accumulation(recipe, microbatches=k, cycles=cycles)
        if result.outcome is not tp.Outcome.PASS:
            errors.append(f"check_accumulation is {result.outcome.name}:\n{result.report()[:3000]}")

    def measured(run: Any) -> tuple[float, float, int]:
        """Wall seconds, CPU seconds (user and system) and minor page faults of one run, from this process."""
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        run()
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return seconds, cpu, after.ru_minflt - before.ru_minflt

    cold = measured(check)[0]
    rounds = [(measured(check), measured(lambda: plain(torch.float32)), measured(lambda: plain(torch.float64)))
              for _ in range(ACCUMULATION_ROUNDS)]
    warm, float32, float64 = (min(figures[0] for figures in runs) for runs in zip(*rounds, strict=True))
    # CPU time and page faults say what the wall time, on a shared machine, cannot: where the check's cost is.
    return {"plain": float32, "plain_float64": float64, "cold": cold, "warm": warm, "errors": errors,
            "cpu_ratio": statistics.median(check_[1] / plain64[1] for check_, _, plain64 in rounds),
            "faults": statistics.median(check_[2] for check_, _, _ in rounds),
            "faults_float64": statistics.median(plain64[2] for _, _, plain64 in rounds)}


def probe(name: str) -> None:
    """Run one measurement of the scale benchmark in this process (a fresh interpreter) and print it as JSON."""
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


def run(args: argparse.Namespace) -> None:
    parts = args.only or list(PARTS)
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
                plain = in_fresh_interpreter("scale", "probe", f"plain:{part}")["plain"]
                check = in_fresh_interpreter("scale", "probe", f"check:{part}")
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
                steps = in_fresh_interpreter("scale", "probe", "steps")
                errors += steps["errors"]
                method = steps["method"]
                growth = steps["peak_50"] / steps["peak_6"]
                rows += [
                    ("MLP 1.1M", "parent peak RSS, check_resume 6 steps", f"{steps['peak_6'] / MB:.0f} MB", ""),
                    ("MLP 1.1M", "parent peak RSS, check_resume 50 steps", f"{steps['peak_50'] / MB:.0f} MB", ""),
                    ("MLP 1.1M", "50 steps / 6 steps", f"{growth:.3f}x", target(growth, 1.1, "<= 1.10x")),
                ]
            else:
                accumulation = in_fresh_interpreter("scale", "probe", "accumulation")
                errors += accumulation["errors"]
                ratio = accumulation["warm"] / accumulation["plain"]
                float64_ratio = accumulation["warm"] / accumulation["plain_float64"]
                best = f"fastest of {ACCUMULATION_ROUNDS}"
                rows += [
                    ("MLP 3.2M", f"plain training, float32 (2 steps, 2 windows of 4; {best})",
                     f"{accumulation['plain']:.3f} s", ""),
                    ("MLP 3.2M", f"plain training, float64 (the check's default; {best})",
                     f"{accumulation['plain_float64']:.3f} s", ""),
                    ("MLP 3.2M", "first check_accumulation(k=4, cycles=2)", f"{accumulation['cold']:.3f} s", ""),
                    ("MLP 3.2M", f"warm check_accumulation ({best})", f"{accumulation['warm']:.3f} s", ""),
                    ("MLP 3.2M", "warm check / plain float32", f"{ratio:.2f}x", ""),
                    ("MLP 3.2M", "warm check / plain float64 (the judging precision, the floor)",
                     f"{float64_ratio:.2f}x", target(float64_ratio, 1.5, "<= 1.5x")),
                    ("MLP 3.2M", f"CPU time, check / plain float64 (median of {ACCUMULATION_ROUNDS})",
                     f"{accumulation['cpu_ratio']:.2f}x", ""),
                    ("MLP 3.2M", f"minor page faults, check and plain float64 (median of {ACCUMULATION_ROUNDS})",
                     f"{accumulation['faults']:.0f} and {accumulation['faults_float64']:.0f}", ""),
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
