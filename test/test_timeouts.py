"""`timeout=` bounds the whole check: every run, rerun and process start; past it, ERROR within 2 s.

Each check meets a recipe (or a script) that hangs in one phase: the check must end in ERROR of kind
"timeout" no later than its timeout plus 2 seconds, whatever the isolation. The bound is the promise
the docs make (docs/api.md, "Timeouts"), not a speed goal: what the engine does past the deadline
(killing a tree, confirming the kill, removing files) is bounded by it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from fault_recipes import Faulty, recorded_pids
from process_helpers import still_running
from resume_recipes import ResumeRecipe
from wide_recipes import Wide
from worker_datasets import numbers

import trainparity as tp
from trainparity._process import _launchers

pytestmark = pytest.mark.exact

#: what a check may take past its timeout
MARGIN = 2.0
#: timeouts short enough to keep the file fast, long enough for a warm fork server (or a spawned
#: interpreter importing torch) to reach the phase that hangs
TIMEOUTS = {"inprocess": 1.0, "process": 2.5, "spawn": 5.0}
#: a script check runs its command in fresh interpreters, the resumed one after the interrupted one has saved
SCRIPT_TIMEOUT = 8.0
SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "hanging_train.py"


@pytest.fixture(scope="module", autouse=True)
def warm_up() -> None:
    """The fork server's first start counts against the first check's timeout (tested on its own below), and so
    does this process's first optimizer, which imports torch._dynamo (a second): both are paid here, so that the
    short timeouts below reach the phase that hangs."""
    _launchers.warm_up()
    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)


def timed(check: Callable[[], tp.Result]) -> tuple[tp.Result, float]:
    start = time.monotonic()
    result = check()
    return result, time.monotonic() - start


def assert_timed_out(result: tp.Result, elapsed: float, timeout: float) -> None:
    assert result.outcome is tp.Outcome.ERROR, result.report()
    assert result.error is not None and result.error.kind == "timeout", result.report()
    assert f"within timeout={timeout:g} s" in result.report(), result.report()
    assert elapsed <= timeout + MARGIN, f"returned {elapsed:.2f} s after the call, timeout={timeout:g} s"


def hanging(phase: str, pid_dir: pathlib.Path) -> Faulty:
    return Faulty("hang", phase, str(pid_dir))


def left_running(pid_dir: pathlib.Path) -> list[int]:
    """The processes that hung, as `pid_dir` records them, still running once the check returned (an in-process
    check records this process, which hung and goes on)."""
    return still_running([pid for pid in recorded_pids(pid_dir) if pid != os.getpid()], grace=2.0)


CHECKS: dict[str, Callable[[tp.Recipe, str, float], tp.Result]] = {
    "resume": lambda recipe, isolation, timeout: tp.check_resume(recipe, steps=4, resume_at=2, isolation=isolation,
                                                                timeout=timeout),
    "accumulation": lambda recipe, isolation, timeout: tp.check_accumulation(recipe, microbatches=2, cycles=1,
                                                                            isolation=isolation, timeout=timeout),
    "parallel": lambda recipe, isolation, timeout: tp.check_parallel(recipe, world_size=2, steps=2,
                                                                    isolation=isolation, timeout=timeout),
    "optimizer_coverage": lambda recipe, isolation, timeout: tp.check_optimizer_coverage(
        recipe, steps=2, isolation=isolation, timeout=timeout),
    "mixed_precision": lambda recipe, isolation, timeout: tp.check_mixed_precision(
        recipe, steps=2, isolation=isolation, timeout=timeout),
    "frozen": lambda recipe, isolation, timeout: tp.check_frozen(recipe, steps=2, isolation=isolation, timeout=timeout),
    "train_mode": lambda recipe, isolation, timeout: tp.check_train_mode(
        recipe, steps=2, isolation=isolation, timeout=timeout),
    "training": lambda recipe, isolation, timeout: tp.check_training(
        recipe, steps=2, overfit=True, isolation=isolation, timeout=timeout),
}
#: each check's own isolation, and the phases of a run it reaches
DEFAULTS = {"resume": "process", "accumulation": "inprocess", "parallel": "process",
            "optimizer_coverage": "inprocess", "mixed_precision": "inprocess", "frozen": "inprocess",
            "train_mode": "inprocess", "training": "inprocess"}
PHASES = {
    "resume": ("setup", "batches", "step", "sample_ids", "save", "load"),
    "accumulation": ("setup", "batches", "step"),
    "parallel": ("setup", "batches", "step", "sample_ids"),
    "optimizer_coverage": ("setup", "batches", "step"),
    "mixed_precision": ("setup", "batches", "step"),
    "frozen": ("setup", "batches", "step"),
    "train_mode": ("setup", "batches", "step"),
    "training": ("setup", "batches", "step"),
}


@pytest.mark.parametrize(("check", "phase"), [(check, phase) for check, phases in PHASES.items() for phase in phases])
def test_a_hang_in_any_phase_ends_the_check_soon_after_its_timeout(check: str, phase: str,
                                                                     tmp_path: pathlib.Path) -> None:
    isolation = DEFAULTS[check]
    # the resumed run loads, and starts once the interrupted one has trained, saved and exited
    timeout = TIMEOUTS[isolation] * (2 if phase == "load" else 1)
    result, elapsed = timed(lambda: CHECKS[check](hanging(phase, tmp_path), isolation, timeout))
    assert_timed_out(result, elapsed, timeout)
    assert result.error is not None and "in inject" in (result.error.traceback or ""), result.report()  # it hung there
    assert left_running(tmp_path) == []


@pytest.mark.parametrize(("check", "isolation"), [
    (check, isolation) for check, own in DEFAULTS.items() for isolation in TIMEOUTS
    if isolation != own and not (check == "parallel" and isolation == "inprocess")
])
def test_the_timeout_holds_in_every_isolation(check: str, isolation: str, tmp_path: pathlib.Path) -> None:
    timeout = TIMEOUTS[isolation]
    result, elapsed = timed(lambda: CHECKS[check](hanging("step", tmp_path), isolation, timeout))
    assert_timed_out(result, elapsed, timeout)
    assert left_running(tmp_path) == []


def test_an_in_process_timeout_shows_where_the_run_was_interrupted(tmp_path: pathlib.Path) -> None:
    result = tp.check_accumulation(hanging("step", tmp_path), microbatches=2, timeout=0.5)
    assert result.error is not None and result.error.traceback is not None
    assert result.error.traceback.startswith("Stack when the timeout interrupted it (most recent call last):")
    assert "in inject" in result.error.traceback and "time.sleep(3600)" in result.error.traceback
    assert "interrupted in this process (isolation='inprocess')" in result.report()


class HangsInItsReruns(Wide):
    """Loses a large weight on load (a FAIL known by digests), and hangs from the `hang_from`-th setup() on. A
    check's first four runs snapshot the State where they meet; as they FAIL, four more snapshot every step (setups
    5 to 8), and three more train again to fetch the values for the report (from the ninth)."""

    def __init__(self, calls: str, hang_from: int) -> None:
        super().__init__("weight")
        self.calls = calls
        self.hang_from = hang_from

    def setup(self) -> tp.State:
        directory = pathlib.Path(self.calls)
        (directory / f"{time.monotonic_ns()}").touch()
        if len(list(directory.iterdir())) >= self.hang_from:
            time.sleep(3600)
        return super().setup()


@pytest.mark.parametrize("hang_from, note", [
    (5, "the runs that snapshot the State at every step did not finish"),
    (9, "the values of the differing tensors could not be fetched"),
], ids=["every-step-snapshots", "values"])
def test_the_reruns_after_a_fail_share_the_timeout_and_leave_the_fail_standing(
        hang_from: int, note: str, tmp_path: pathlib.Path) -> None:
    first, _ = timed(lambda: tp.check_resume(Wide("weight"), steps=4, resume_at=2))
    assert first.outcome is tp.Outcome.FAIL
    timeout = 3 * TIMEOUTS["process"]
    result, elapsed = timed(lambda: tp.check_resume(HangsInItsReruns(str(tmp_path), hang_from), steps=4,
                                                    resume_at=2, timeout=timeout))
    assert elapsed <= timeout + MARGIN, f"returned {elapsed:.2f} s after the call, timeout={timeout:g} s"
    assert result.outcome is tp.Outcome.FAIL, result.report()
    assert result.violations[0].path == first.violations[0].path, result.report()
    assert any(note in text and f"timeout={timeout:g} s" in text for text in result.notes), result.notes


@pytest.mark.parametrize("where", ["step", "load"])
def test_a_script_that_hangs_ends_its_check_soon_after_the_timeout(where: str) -> None:
    command = [sys.executable, str(SCRIPT), "--out_dir", "{workdir}", "--hang", where]
    resume = [sys.executable, str(SCRIPT), "--out_dir", "{workdir}", "--resume", "--hang", where]
    # A hang at load is in the resumed run, which starts once the interrupted one (an interpreter importing torch
    # and training) has saved: its timeout leaves that run room on a busy machine.
    timeout = SCRIPT_TIMEOUT if where == "step" else 3 * SCRIPT_TIMEOUT
    result, elapsed = timed(lambda: tp.check_resume_script(command, resume, steps=4, resume_at=2, timeout=timeout))
    assert_timed_out(result, elapsed, timeout)
    assert result.error is not None and result.error.phase == ("resumed" if where == "load" else "interrupted")


def test_runs_equivalent_ends_soon_after_its_timeout() -> None:
    reference = [sys.executable, str(SCRIPT), "--out_dir", "{workdir}"]
    timeout = SCRIPT_TIMEOUT
    result, elapsed = timed(lambda: tp.check_runs_equivalent(reference, [*reference, "--hang", "step"], steps=3,
                                                             timeout=timeout))
    assert_timed_out(result, elapsed, timeout)


def stuck_stream() -> Iterator[list[int]]:
    yield [0, 1]
    time.sleep(3600)
    yield [2, 3]


def test_coverage_reading_a_stuck_iterable_ends_soon_after_its_timeout() -> None:
    result, elapsed = timed(lambda: tp.check_coverage({0: [[0]], 1: stuck_stream()}, policy=tp.ExactlyOnce(range(4)),
                                                      timeout=1.0))
    assert_timed_out(result, elapsed, 1.0)
    assert result.error is not None and (result.error.phase, result.error.rank) == ("epoch 0, rank 1", 1)
    assert "in stuck_stream" in (result.error.traceback or "")


def test_coverage_has_no_timeout_unless_given() -> None:
    def slow() -> Iterator[list[int]]:
        yield [0]
        time.sleep(1.5)
        yield [1]

    assert tp.check_coverage({0: slow()}, policy=tp.ExactlyOnce(range(2))).passed


def test_worker_randomness_with_a_hanging_worker_ends_soon_after_its_timeout_and_kills_the_workers(
        tmp_path: pathlib.Path) -> None:
    loader = numbers(hang_at=5, pids=str(tmp_path))  # worker 1's first batch is samples 4..7
    result, elapsed = timed(lambda: tp.check_worker_randomness(loader, timeout=1.5))
    assert_timed_out(result, elapsed, 1.5)
    assert result.error is not None and result.error.phase.startswith("epoch 0, batch ")
    assert result.error.traceback is not None and result.error.traceback.startswith("Stack when the timeout")
    pids = [int(path.read_text()) for path in tmp_path.glob("*.pids")]
    assert pids and still_running(pids, grace=2.0) == []
    assert multiprocessing.active_children() == []


def test_the_fork_server_start_counts_and_goes_on_for_the_next_check() -> None:
    """In a fresh interpreter the first check starts the fork server (it imports torch: seconds); with a timeout
    shorter than that, the check ends in ERROR at its timeout, and the next check uses the server that went on
    starting."""
    code = textwrap.dedent("""
        import json, sys, time
        sys.path.insert(0, sys.argv[1])
        import trainparity as tp
        from fault_recipes import Faulty
        start = time.monotonic()
        first = tp.check_resume(Faulty(), steps=2, resume_at=1, timeout=0.3)
        elapsed = time.monotonic() - start
        second = tp.check_resume(Faulty(), steps=2, resume_at=1, timeout=120)
        print(json.dumps({"first": first.outcome.value, "kind": first.error and first.error.kind,
                          "report": first.report(), "elapsed": elapsed, "second": second.outcome.value}))
    """)
    done = subprocess.run([sys.executable, "-c", code, str(pathlib.Path(__file__).parent)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert (figures["first"], figures["kind"]) == ("ERROR", "timeout"), figures["report"]
    assert "the fork server" in figures["report"] and "was still starting" in figures["report"], figures["report"]
    assert figures["elapsed"] <= 0.3 + MARGIN, figures
    assert figures["second"] == "PASS", figures


class SlowStep(Faulty):
    """Each step takes a second: a run that ends, late."""

    def step(self, state: tp.State, batch: Any) -> Any:
        time.sleep(1.0)
        return super().step(state, batch)


def test_off_the_main_thread_a_late_in_process_run_is_still_a_timeout(tmp_path: pathlib.Path) -> None:
    """No signal reaches another thread: the run is not interrupted, but it is reported as the timeout it was."""
    results: list[tp.Result] = []
    thread = threading.Thread(target=lambda: results.append(
        tp.check_accumulation(SlowStep(), microbatches=2, cycles=1, timeout=0.5)))
    thread.start()
    thread.join(timeout=60)
    assert results and results[0].error is not None and results[0].error.kind == "timeout", results
    assert "off the main thread" in results[0].report()


def test_a_timer_armed_by_someone_else_still_fires_and_is_armed_again(tmp_path: pathlib.Path) -> None:
    """pytest-timeout's signal method arms SIGALRM too: an earlier timer of theirs fires when due (here it only
    records), a later one is armed again after the check with what is left of it."""
    fired: list[float] = []

    def theirs(signum: int, frame: object) -> None:
        fired.append(time.monotonic())

    previous = signal.signal(signal.SIGALRM, theirs)
    try:
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        result = tp.check_accumulation(hanging("step", tmp_path), microbatches=2, timeout=1.0)
        assert result.error is not None and result.error.kind == "timeout"
        assert len(fired) == 1 and 0.25 <= fired[0] - start < 1.0, fired
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        tp.check_accumulation(Faulty(), microbatches=2, cycles=1, timeout=30)
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 5.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)



@pytest.mark.parametrize("timeout", [float("inf"), 1e10, float("nan")])
def test_a_timeout_the_interval_timer_cannot_hold_is_refused_naming_the_limit(timeout: float) -> None:
    # inf reached setitimer as a raw OverflowError out of check_coverage, and as an ERROR blamed on the recipe
    refused = r"timeout= must be a positive number of seconds, at most 100000000 \(about three years\)"
    with pytest.raises(ValueError, match=refused):
        tp.check_coverage({0: [[0]]}, policy=tp.ExactlyOnce(range(1)), timeout=timeout)
    with pytest.raises(ValueError, match=refused):
        tp.check_resume(ResumeRecipe, steps=2, resume_at=1, isolation="inprocess", timeout=timeout)


def test_workers_killed_at_the_timeout_leave_no_temporary_directory_once_the_process_exits(
        tmp_path: pathlib.Path) -> None:
    """A DataLoader worker killed at the check's timeout never exits, so it never removes a multiprocessing
    directory of its own (`pymp-*`, for the socket that hands over file descriptors): the workers share this
    process's, which goes when the process exits. TMPDIR shows what the process and its workers left."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import trainparity as tp
        from worker_datasets import numbers
        result = tp.check_worker_randomness(numbers(hang_at=5, pids=sys.argv[2]), timeout=1.5)
        assert result.error is not None and result.error.kind == "timeout", result.report()
    """)
    temporary, pids = tmp_path / "tmp", tmp_path / "pids"
    temporary.mkdir()
    pids.mkdir()
    done = subprocess.run([sys.executable, "-c", code, str(pathlib.Path(__file__).parent), str(pids)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "TMPDIR": str(temporary)})
    assert done.returncode == 0, done.stderr
    assert list(pids.glob("*.pids"))  # the workers did start
    assert sorted(path.name for path in temporary.iterdir()) == []
