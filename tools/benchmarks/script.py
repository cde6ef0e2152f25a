"""check_resume_script on the nanoGPT-shaped test script against one plain run of it (target <= 2.5x).

The check runs the script four times (two baselines and the interrupted run side by side, then the
resumed run), each paying the script's start-up: imports, data, model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

from benchmarks._timing import ROOT, machine, seconds


def run(args: argparse.Namespace) -> None:
    import trainparity as tp

    script = ROOT / "test" / "scripts" / "nanogpt_train.py"
    with tempfile.TemporaryDirectory() as directory:
        plain = seconds(lambda: subprocess.run(
            [sys.executable, str(script), "--out_dir", directory, "--max_iters", "6"], check=True))
    command = [sys.executable, str(script), "--out_dir", "{workdir}"]
    results: list[tp.Result] = []
    checked = seconds(lambda: results.append(
        tp.check_resume_script(command, [*command, "--init_from", "resume"], steps=6, resume_at=3)))
    assert results[0].passed, results[0].report()
    print(f"resume-script check of test/scripts/nanogpt_train.py, 6 steps, resume at 3; {machine()}")
    print(f"one plain run of the script (6 steps):  {plain:.2f} s")
    print(f"check_resume_script:                     {checked:.2f} s = {checked / plain:.2f}x (target <= 2.5x)")
