"""Wall times of a 2-rank FSDP2 parallel check (test/parallel_recipes.py) and of a resume check of the
FSDP2 + DCP tiny GPT of examples/fsdp_gpt.py from 2 ranks to 1, each cold and warm, in one process."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from benchmarks._timing import ROOT, machine, seconds


def run(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(ROOT / "test"), str(ROOT / "examples")]
    from fsdp_gpt import TinyGPT
    from parallel_recipes import FSDPRecipe

    import trainparity as tp

    print(f"{machine()}; gloo on the CPU")
    checks: list[tuple[str, Callable[[], tp.Result]]] = [
        ("parallel check, FSDP2, 2 ranks and the reference, 3 steps",
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
