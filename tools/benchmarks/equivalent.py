"""The equivalence check of a tiny transformer (examples/transformations.py: a 2-block GPT, about 30 k parameters,
checkpointing off against on), 4 steps in float64, in-process, against the plain float64 training of its two runs
measured in the same run: the target is at most 3x.

Each figure is the median of `--rounds` rounds after one warm-up round of each (torch's first calls at new shapes
are nobody's steady state).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks._timing import ROOT, machine, median_seconds

TARGET = 3.0
STEPS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help="rounds per figure (default: %(default)s)")


def run(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from transformations import Transformed

    import trainparity as tp

    reference, candidate = Transformed(), Transformed(checkpointing=True)

    def plain(recipe: Transformed) -> None:
        """The run as the recipe's author would train it in float64: seeded, set up, `STEPS` steps."""
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            torch.manual_seed(0)
            recipe.calls = 0
            state = recipe.setup()
            state.model.double()
            batches = iter(recipe.batches(state))
            for _ in range(STEPS):
                recipe.step(state, next(batches))
        finally:
            torch.set_default_dtype(default)

    def both_plain() -> None:
        plain(reference)
        plain(candidate)

    def check() -> None:
        result = tp.check_equivalent(reference, candidate, steps=STEPS)
        assert result.passed, result.report()

    both_plain()
    check()
    trained, checked = median_seconds(both_plain, args.rounds), median_seconds(check, args.rounds)
    ratio = checked / trained
    print(f"equivalence check, tiny GPT, checkpointing off vs on, {STEPS} steps, float64, in-process; {machine()}")
    print(f"plain float64 training of its two runs: {trained:.3f} s (median of {args.rounds})")
    print(f"check_equivalent: {checked:.3f} s (median of {args.rounds})")
    print(f"ratio {ratio:.2f}x (target <= {TARGET:.0f}x): {'PASS' if ratio <= TARGET else 'FAIL'}")
