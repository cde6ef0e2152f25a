"""A 6-step resume check of a tiny model (4 fresh processes): cold and warm, against one torch import.

Cold: the first check in a new interpreter that has imported trainparity and the recipe
(it starts the fork server). Warm: the median of the next 7 checks in that interpreter.
"""

from __future__ import annotations

import argparse
import json

from benchmarks._timing import in_fresh_interpreter, median_seconds, seconds, torch_import_seconds


def probe() -> None:
    """The cold check, then the median of 7 warm ones, in this (fresh) interpreter, printed as JSON."""
    import trainparity as tp
    from trainparity.quickstarts.resume import Regression

    def check() -> None:
        result = tp.check_resume(Regression, steps=6, resume_at=3)
        assert result.outcome is tp.Outcome.PASS, result.report()

    print(json.dumps({"cold": seconds(check), "warm": median_seconds(check, 7)}))


def run(args: argparse.Namespace) -> None:
    reference = torch_import_seconds()
    figures = in_fresh_interpreter("resume", "probe")
    print(f"python -c 'import torch':  {reference:.3f} s (median of 3)")
    print(f"cold check (first, starts the fork server): {figures['cold']:.3f} s = "
          f"{figures['cold'] / reference:.2f}x torch import (target <= 2x)")
    print(f"warm check (median of 7):   {figures['warm']:.3f} s = "
          f"{figures['warm'] / reference:.3f}x torch import (target <= 0.15x)")
