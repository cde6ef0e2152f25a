"""`.ci/run` itself: its exit status is the status of its steps, and it leaves nothing running."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

pytestmark = pytest.mark.exact

CI_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / ".ci" / "run"


def _exit_trap() -> str:
    traps = re.findall(r"^trap .* EXIT$", CI_SCRIPT.read_text(), flags=re.MULTILINE)
    assert len(traps) == 1, f"expected one EXIT trap in {CI_SCRIPT}, found {traps}"
    return traps[0]


def _background_jobs() -> str:
    """.ci/run's lines from its list of background jobs to the end of `finish`, the function that waits for one."""
    block = re.findall(r"^background=\(\)$.*?^finish\(\) \{$.*?^\}$", CI_SCRIPT.read_text(),
                       flags=re.MULTILINE | re.DOTALL)
    assert len(block) == 1, f"expected one list of background jobs and its finish() in {CI_SCRIPT}, found {block}"
    assert _exit_trap() in block[0]
    return block[0]


def _run_with_the_exit_trap(background: str, steps: str) -> subprocess.CompletedProcess[str]:
    # The same shell options, background jobs and trap as .ci/run, one job, then the steps that follow it there.
    script = f'set -euo pipefail\n{_background_jobs()}\n{background} &\njob=$!\nbackground+=("$job")\n{steps}\n'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_a_run_whose_steps_all_pass_exits_zero_after_its_background_job_ended() -> None:
    # The background job has ended and has no children: the trap's pkill and kill find nothing to stop.
    finished = _run_with_the_exit_trap("true", 'finish "$job" "$(mktemp)"\necho steps passed')
    assert (finished.returncode, finished.stdout) == (0, "steps passed\n"), finished.stderr


def test_a_failing_background_job_fails_the_run_with_the_lines_of_its_log_that_say_why() -> None:
    log = 'log=$(mktemp)\nprintf "row | ok\\nrow | left running\\n" > "$log"\n'
    failed = _run_with_the_exit_trap("false", f'{log}finish "$job" "$log" "| ok$"\necho not reached')
    assert (failed.returncode, failed.stdout) == (1, "row | left running\n"), failed.stderr


def test_a_failing_step_fails_the_run_and_stops_the_background_job() -> None:
    marker = "trainparity-ci-trap-test"
    failed = _run_with_the_exit_trap(f"bash -c 'exec -a {marker} sleep 300'", "false")
    assert failed.returncode == 1
    still_running = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert still_running.stdout == "", f"the background job outlived the run: {still_running.stdout}"


@pytest.mark.parametrize(("elapsed", "status"), [(3599, 0), (3601, 1)])
def test_a_run_past_sixty_minutes_fails(elapsed: int, status: int) -> None:
    budget = re.findall(r"^if \(\( SECONDS > 3600 \)\); then\n.*?^fi$", CI_SCRIPT.read_text(),
                        flags=re.MULTILINE | re.DOTALL)
    assert len(budget) == 1, f"expected one 60-minute budget check in {CI_SCRIPT}, found {budget}"
    # bash counts SECONDS on from what it is set to
    done = subprocess.run(["bash", "-c", f"set -euo pipefail\nSECONDS={elapsed}\n{budget[0]}\n"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == status, done.stdout + done.stderr
    assert ("over the 60-minute budget" in done.stdout) == bool(status)
