"""check_resume_script on each framework's test script against one plain run of it (target <= 2.5x each).

The scripts: the nanoGPT-shaped one, PyTorch Lightning, the Hugging Face Trainer, Accelerate and Ignite
(test/scripts/, the frameworks where installed: `python -m pip install -e ".[frameworks]"`). The check
runs a script four times (two baselines and the interrupted run side by side, then the resumed run),
each paying the script's start-up: imports, data, model; the plain run trains the same 6 steps once.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import subprocess
import sys
import tempfile

from benchmarks._timing import ROOT, machine, seconds

#: script, its framework's module (None: torch alone), the flag that resumes it, how to train 6 steps
SCRIPTS = (
    ("nanogpt_train.py", None, ["--init_from", "resume"], ["--max_iters", "6"]),
    ("lightning_train.py", "lightning", ["--resume"], ["--max_steps", "6"]),
    ("hf_train.py", "transformers", ["--resume"], ["--max_steps", "6"]),
    ("accelerate_train.py", "accelerate", ["--resume"], ["--max_steps", "6"]),
    ("ignite_train.py", "ignite", ["--resume"], ["--max_steps", "6"]),
)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _plain_run(script: str, six_steps: list[str]) -> None:
    import os

    with tempfile.TemporaryDirectory() as directory:
        subprocess.run([sys.executable, script, "--out_dir", directory, *six_steps], check=True, capture_output=True,
                       env={**os.environ, **OFFLINE})


def run(args: argparse.Namespace) -> None:
    import trainparity as tp

    print(f"resume-script check of each test script, 6 steps, resume at 3, against one plain run; {machine()}")
    failed = []
    for name, framework, resume, six_steps in SCRIPTS:
        if framework is not None and importlib.util.find_spec(framework) is None:
            print(f"{name}: skipped ({framework} is not installed)")
            continue
        script = str(ROOT / "test" / "scripts" / name)
        plain = seconds(functools.partial(_plain_run, script, six_steps))
        command = [sys.executable, script, "--out_dir", "{workdir}"]
        results: list[tp.Result] = []
        check = functools.partial(tp.check_resume_script, command, [*command, *resume], steps=6, resume_at=3,
                                  env=OFFLINE)
        checked = seconds(lambda: results.append(check()))  # noqa: B023 - called at once
        if not results[0].passed:
            failed.append(f"{name}: {results[0].report()[:2000]}")
        ratio = checked / plain
        print(f"{name:22s} plain run {plain:6.2f} s   check {checked:6.2f} s = {ratio:.2f}x "
              f"({'pass' if ratio <= 2.5 else 'FAIL'}: target <= 2.5x)")
    for message in failed:
        print(f"ERROR: the clean script did not PASS: {message}", file=sys.stderr)
    if failed:
        raise SystemExit(1)
