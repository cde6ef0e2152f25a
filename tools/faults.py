"""The fault matrix: every fault ends in a clear result, nothing is left running, no file is left.

    python tools/faults.py                       # the full matrix (about half an hour on 2 cores)
    python tools/faults.py --quick               # the bounded subset CI runs (a few minutes)
    python tools/faults.py --write docs/reliability.md

Faults (test/fault_recipes.py: raise, hang, os._exit, SIGKILL, SIGSEGV, sys.exit(0), a hanging
grandchild in its own session, a grandchild left behind, a child ignoring SIGTERM, a huge
message, escape codes, huge output, reading stdin, looking for the environment on disk) are
injected into each phase (setup, batches, step, save, load, sample_ids) of the resume,
accumulation, parallel and preflight checks in each isolation that runs children, the faults a
process survives (raise, hang, huge message, escape codes) also in this process
(isolation="inprocess"), and into the iterables `check_coverage` reads (with a timeout). Then
signals to the parent (SIGINT at many moments, SIGTERM) and leak loops of many checks. For each
row: the outcome, whether anything was left running, whether temporary files were left, the
seconds between the check's timeout (the bound of the whole check) and its return, and whether a
raw exception escaped. Exits 1 if any row breaks a promise.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pathlib
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEST_DIR = ROOT / "test"
# Every temporary file of every check goes below a directory of our own, so that what is left is seen.
SCRATCH = pathlib.Path(tempfile.mkdtemp(prefix="faults-"))
os.environ["TMPDIR"] = str(SCRATCH / "tmp")
(SCRATCH / "tmp").mkdir()
tempfile.tempdir = None
sys.path.insert(0, str(TEST_DIR))
sys.path.insert(0, str(ROOT))

import fault_recipes as recipes  # noqa: E402
import process_helpers  # noqa: E402
from process_helpers import still_running  # noqa: E402

import trainparity as tp  # noqa: E402
from trainparity._process import _launchers  # noqa: E402

#: long enough for a spawned interpreter to import torch and reach the phase under load
TIMEOUTS = {"inprocess": 3.0, "process": 5.0, "spawn": 15.0}
CHECK_PHASES = {
    "resume": recipes.PHASES,
    "accumulation": ("setup", "batches", "step"),  # it never asks for sample IDs
    "parallel": ("setup", "batches", "step", "sample_ids"),
    "optimizer coverage": ("setup", "batches", "step"),
    "mixed precision": ("setup", "batches", "step"),
    "frozen": ("setup", "batches", "step"),
    "train mode": ("setup", "batches", "step"),
    "training": ("setup", "batches", "step"),
}
#: the faults a check in this process can meet and go on (the others end the process itself)
INPROCESS_FAULTS = ("raise", "hang", "huge_message", "escape_codes")
#: faults of user iterables that check_coverage reads in this process
COVERAGE_FAULTS = ("raise", "hang", "huge_message", "escape_codes")
#: the timeout of check_coverage's rows (it has none by default)
COVERAGE_TIMEOUT = 3.0


@dataclass
class Row:
    check: str
    isolation: str
    phase: str
    fault: str
    outcome: str
    kind: str
    left_running: int
    files_left: int
    past_timeout: float | None
    raw_exception: str | None
    #: what went wrong with this row, if anything
    problem: str | None = None

    def cells(self) -> list[str]:
        past = "-" if self.past_timeout is None else f"{self.past_timeout:+.1f}"
        return [self.check, self.isolation, self.phase, self.fault, self.outcome, self.kind or "-",
                str(self.left_running), str(self.files_left), past, self.raw_exception or "-",
                self.problem or "ok"]


HEADER = ["check", "isolation", "phase", "fault", "outcome", "error kind", "left running", "files left",
          "s past timeout", "raw exception", "verdict"]


def marked_processes() -> list[int]:
    """Running processes that a check of this matrix started (not another test run's: our TMPDIR)."""
    return process_helpers.marked_processes(also=f"TMPDIR={SCRATCH / 'tmp'}".encode())


def _leftovers() -> list[pathlib.Path]:
    """Temporary files and directories of trainparity's (torch keeps caches of its own there too), but this process's
    fork server's bytecode directory, which lives as long as the server (docs/design.md, Processes)."""
    server = _launchers.SERVER.bytecode_directory()
    return [path for path in (SCRATCH / "tmp").glob("trainparity-*") if str(path) != server]


def leftover_files() -> int:
    return len(_leftovers())


def clear_leftovers() -> None:
    for path in _leftovers():
        subprocess.run(["rm", "-rf", str(path)], check=False)


def expected_outcome(fault: str, check: str) -> set[str]:
    if fault not in recipes.BENIGN:
        return {"ERROR"}
    return {"ABSTAIN"} if check == "frozen" else {"PASS"}  # the fault recipe freezes nothing


def run_row(check: str, isolation: str, phase: str, fault: str, call: Callable[[str], tp.Result],
            timeout: float | None) -> Row:
    """One check against one fault; a timed-out check must return within 2 s of its timeout."""
    pid_dir = SCRATCH / f"pids-{time.monotonic_ns()}"
    pid_dir.mkdir()
    started = time.monotonic()
    raw = None
    outcome, kind = "-", ""
    try:
        result = call(str(pid_dir))
        outcome = result.outcome.value
        kind = result.error.kind if result.error is not None else ""
    except Exception as error:  # noqa: BLE001 - what the matrix looks for
        raw = f"{type(error).__name__}: {str(error)[:80]}"
    elapsed = time.monotonic() - started
    # a fault in this process (isolation="inprocess") records this process: it is not left running
    left = still_running([pid for pid in recipes.recorded_pids(pid_dir) if pid != os.getpid()], grace=2.0)
    left += [pid for pid in marked_processes() if pid not in left]
    files = leftover_files()
    clear_leftovers()
    past = elapsed - timeout if timeout is not None and kind == "timeout" else None
    problems = []
    if raw:
        problems.append("raw exception")
    if outcome not in expected_outcome(fault, check) and not raw:
        problems.append(f"expected {'/'.join(sorted(expected_outcome(fault, check)))}")
    if left:
        problems.append("left running")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if files:
        problems.append("files left")
    if past is not None and past > 2.0:
        problems.append("timeout not honoured")
    return Row(check, isolation, phase, fault, outcome, kind, len(left), files, past, raw,
               "; ".join(problems) or None)


def matrix(quick: bool, isolations: tuple[str, ...]) -> Iterator[Row]:
    for check, phases in CHECK_PHASES.items():
        for isolation in (*isolations, "inprocess") if check != "parallel" else isolations:
            for phase in ("step",) if quick else phases:
                for fault in INPROCESS_FAULTS if isolation == "inprocess" else recipes.FAULTS:
                    if fault == "huge_output" and phase != "step":
                        continue  # where the output comes from changes nothing
                    timeout = TIMEOUTS[isolation] + (5.0 if check == "parallel" else 0.0)
                    yield run_row(check, isolation, phase, fault, _checker(check, isolation, phase, fault, timeout),
                                  timeout)
    for fault in COVERAGE_FAULTS:
        yield run_row("coverage", "inprocess", "iteration", fault, _coverage(fault), COVERAGE_TIMEOUT)


def _checker(check: str, isolation: str, phase: str, fault: str, timeout: float) -> Callable[[str], tp.Result]:
    def call(pid_dir: str) -> tp.Result:
        recipe = recipes.Faulty(fault, phase, pid_dir)
        if check == "resume":
            return tp.check_resume(recipe, steps=4, resume_at=2, isolation=isolation, timeout=timeout)
        if check == "accumulation":
            return tp.check_accumulation(recipe, microbatches=2, cycles=1, isolation=isolation, timeout=timeout)
        if check == "optimizer coverage":
            return tp.check_optimizer_coverage(recipe, steps=2, isolation=isolation, timeout=timeout)
        if check == "mixed precision":
            return tp.check_mixed_precision(recipe, steps=2, isolation=isolation, timeout=timeout)
        if check == "frozen":
            return tp.check_frozen(recipe, steps=2, isolation=isolation, timeout=timeout)
        if check == "train mode":
            return tp.check_train_mode(recipe, steps=2, isolation=isolation, timeout=timeout)
        if check == "training":
            return tp.check_training(recipe, steps=2, isolation=isolation, timeout=timeout)
        return tp.check_parallel(recipe, world_size=2, steps=2, isolation=isolation, timeout=timeout)

    return call


def _coverage(fault: str) -> Callable[[str], tp.Result]:
    def batches() -> Iterator[list[int]]:
        yield [0, 1]
        recipes.inject(fault, None)

    return lambda pid_dir: tp.check_coverage({0: batches()}, policy=tp.ExactlyOnce(range(4)), timeout=COVERAGE_TIMEOUT)


# -- signals to the parent, leaks -------------------------------------------------------------------------


def interrupts(count: int) -> Iterator[Row]:
    """SIGINT (as KeyboardInterrupt) at moments spread over the first 50 ms of a check that hangs."""
    _launchers.warm_up()

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for attempt in range(count):
            delay = 0.0001 + 0.05 * attempt / count
            pid_dir = SCRATCH / f"pids-int-{attempt}"
            pid_dir.mkdir()
            interrupted = False
            try:
                signal.setitimer(signal.ITIMER_REAL, delay)
                tp.check_resume(recipes.Faulty("hang", pid_dir=str(pid_dir)), steps=4, resume_at=2, timeout=60)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            left = still_running(recipes.recorded_pids(pid_dir), grace=2.0) + marked_processes()
            files = leftover_files()
            clear_leftovers()
            problem = "; ".join(p for p, bad in (("not interrupted", not interrupted), ("left running", left),
                                                 ("files left", files)) if bad) or None
            yield Row("resume", "process", f"parent, {delay * 1000:.1f} ms", "SIGINT", "interrupted" if interrupted
                      else "-", "", len(left), files, None, None, problem)
    finally:
        signal.signal(signal.SIGALRM, previous)


def sigterm(isolation: str) -> Row:
    """SIGTERM to a parent process whose check runs a hanging recipe with a grandchild."""
    pids = SCRATCH / f"pids-term-{isolation}"
    pids.mkdir()
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(TEST_DIR)!r}, {str(ROOT)!r}]
        import trainparity as tp
        from trainparity._process import _launchers
        from fault_recipes import Faulty
        _launchers.warm_up()
        print(_launchers.SERVER._process.pid, flush=True)
        tp.check_resume(Faulty("grandchild_hangs", pid_dir={str(pids)!r}), steps=4, resume_at=2, timeout=120,
                        isolation={isolation!r})
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    # its fork server outlives it by moments: it sees its parent gone, kills what is left and removes its bytecode
    # directory, which is not left behind until the server has ended
    server = [int(line)] if (line := parent.stdout.readline()).strip() else []
    deadline = time.monotonic() + 90
    while len(recipes.recorded_pids(pids)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    parent.send_signal(signal.SIGTERM)
    try:
        code = parent.wait(timeout=30)
    except subprocess.TimeoutExpired:
        parent.kill()
        code = parent.wait()
    left = still_running([*recipes.recorded_pids(pids), *server], grace=3.0) + marked_processes()
    files = leftover_files()
    clear_leftovers()
    ended = code == -signal.SIGTERM  # after its cleanup, the process ends by the signal, as without trainparity
    failures = (("did not end by SIGTERM", not ended), ("left running", bool(left)), ("files left", bool(files)))
    problem = "; ".join(p for p, bad in failures if bad) or None
    return Row("resume", isolation, "parent", "SIGTERM", "ended by SIGTERM" if ended else f"exit {code}", "",
               len(left), files, None, None, problem)


def leak_loop(checks: int) -> Row:
    """Many failing and passing checks in one process: open files, threads and memory stay flat."""
    def measure() -> tuple[int, int, int]:
        return (len(os.listdir("/proc/self/fd")), threading.active_count(),
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    for _ in range(10):  # warm caches first
        tp.check_resume(recipes.Faulty("raise"), steps=2, resume_at=1, timeout=30)
    before = measure()
    for index in range(checks):
        fault = ("raise", None, "exit")[index % 3]
        tp.check_resume(recipes.Faulty(fault), steps=2, resume_at=1, timeout=30)
    after = measure()
    left = marked_processes()
    files = leftover_files()
    clear_leftovers()
    grown = [name for name, b, a, slack in zip(("fds", "threads", "max RSS"), before, after, (0, 0, 64 * 1024),
                                               strict=True) if a > b + slack]
    problem = "; ".join(([f"{', '.join(grown)} grew"] if grown else []) + (["left running"] if left else [])
                        + (["files left"] if files else [])) or None
    outcome = f"fds {before[0]}->{after[0]}, threads {before[1]}->{after[1]}, max RSS {before[2] // 1024}->" \
              f"{after[2] // 1024} MB"
    return Row("resume", "process", f"{checks} checks", "leak loop", outcome, "", len(left), files, None, None,
               problem)


def render(rows: list[Row], command: str) -> str:
    widths = [max(len(h), *(len(r.cells()[i]) for r in rows)) for i, h in enumerate(HEADER)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    bad = [r for r in rows if r.problem]
    lines = [
        "# Reliability: the fault matrix",
        "",
        f"Generated by `{command}`; {len(rows)} rows, {len(bad)} with a problem.",
        "",
        "Each row injects one fault (test/fault_recipes.py) into one phase of one check and records the",
        "outcome, the error kind, how many processes were left running (recorded PIDs and any process",
        "carrying a trainparity job marker, 2 s after the check returned), how many temporary files were",
        "left, how long after its timeout a timed-out check returned, and any raw exception that escaped.",
        "",
        line(HEADER),
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        *(line(r.cells()) for r in rows),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the bounded subset CI runs")
    parser.add_argument("--isolation", choices=("process", "spawn"), action="append",
                        help="only this isolation (repeatable; default: process, and spawn too unless --quick)")
    parser.add_argument("--write", metavar="PATH", help="save the table as Markdown")
    options = parser.parse_args()
    command = "python tools/faults.py" + (" --quick" if options.quick else "") + "".join(
        f" --isolation {isolation}" for isolation in options.isolation or ()) + (
        f" --write {options.write}" if options.write else "")
    rows: list[Row] = []
    # The children's output (huge output, the recipes' tracebacks) is not the matrix's.
    saved_stderr = os.dup(2)
    log = open(SCRATCH / "children.log", "wb")  # noqa: SIM115
    os.dup2(log.fileno(), 2)
    try:
        isolations = tuple(options.isolation or (("process",) if options.quick else ("process", "spawn")))
        for row in itertools.chain(matrix(options.quick, isolations), interrupts(10 if options.quick else 40),
                                   (sigterm(isolation) for isolation in isolations),
                                   (leak_loop(checks) for checks in ((30,) if options.quick else (200,)))):
            rows.append(row)
            os.write(saved_stderr, (" | ".join(row.cells()) + "\n").encode())
    finally:
        os.dup2(saved_stderr, 2)
        log.close()
    text = render(rows, command)
    if options.write:
        pathlib.Path(options.write).write_text(text)
        print(f"wrote {options.write}")
    else:
        print(text)
    subprocess.run(["rm", "-rf", str(SCRATCH)], check=False)
    return 1 if any(row.problem for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
