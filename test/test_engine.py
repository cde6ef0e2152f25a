"""The process engine: fresh processes, fresh imports, dependencies, timeouts, nothing left behind."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time

import pytest
import resume_recipes
from process_helpers import still_running

from trainparity._process._child import STACKS_DUMPER, STACKS_FILE, _dump_stacks_at, engine_frame
from trainparity._process._engine import Job, JobOutcome, first_error, first_failure, run_jobs, user_stacks
from trainparity._process._launchers import warm_up
from trainparity._process._options import Deadline

pytestmark = pytest.mark.exact

IDENTITY = "resume_recipes:report_identity"


@pytest.mark.parametrize("isolation", ["process", "spawn"])
def test_children_are_fresh_processes_with_fresh_imports(isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # User state changed in this process must not reach a child: it imports the module anew.
    monkeypatch.setitem(resume_recipes.IMPORT_MARKER, "value", "changed in the parent")
    outcomes = run_jobs([Job(IDENTITY, None, "a"), Job(IDENTITY, None, "b")], deadline=Deadline.after(60),
                        isolation=isolation)
    outputs = [o.output for o in outcomes]
    assert all(output is not None for output in outputs), [o.error for o in outcomes]
    pids = {output["pid"] for output in outputs if output is not None}
    assert len(pids) == 2 and os.getpid() not in pids
    assert [output["marker"] for output in outputs if output is not None] == ["initial", "initial"]


def test_fork_server_never_imports_user_modules() -> None:
    # A module imported by the server (or inherited from this process) would carry the PID of
    # the process that imported it; a fresh import in the child carries the child's PID.
    outcome = run_jobs([Job("test_engine:where_imported", None, "probe")], deadline=Deadline.after(60))[0]
    assert outcome.output is not None, outcome.error
    assert outcome.output["imported_in_pid"] == outcome.output["pid"] != os.getpid()


#: the PID of the process that imported this module
IMPORTED_IN_PID = os.getpid()


def where_imported(payload: object, workdir: object) -> dict[str, object]:
    """Engine task: which process imported this module."""
    return {"imported_in_pid": IMPORTED_IN_PID, "pid": os.getpid()}


def test_dependent_job_waits_and_is_abandoned_when_its_dependency_fails() -> None:
    outcomes = run_jobs(
        [
            Job("resume_recipes:no_such_task", None, "first"),
            Job(IDENTITY, None, "second", after=0),
            Job(IDENTITY, None, "independent"),
        ],
        deadline=Deadline.after(60),
    )
    assert outcomes[0].error is not None and outcomes[0].error.kind == "raised"
    assert outcomes[0].error.exc_type == "AttributeError"
    assert outcomes[1].error is not None and outcomes[1].error.kind == "abandoned"
    assert outcomes[2].output is not None
    assert first_error(outcomes) is outcomes[0]


def test_the_first_failure_in_time_is_the_cause_whatever_the_order_of_the_jobs() -> None:
    from trainparity._results._violation import ChildError

    def failed(phase: str, kind: str, at: float) -> JobOutcome:
        return JobOutcome(phase, None, ChildError(kind, phase, "x"), failed_at=at)

    echo, cause, killed = failed("rank 0", "raised", 10.2), failed("rank 1", "raised", 10.1), failed(
        "reference", "abandoned", float("inf"))
    assert first_failure([echo, cause, killed]) is cause
    assert first_error([echo, cause, killed]) is echo  # the order of the runs, for checks whose runs are independent
    assert first_failure([killed]) is killed
    assert first_failure([JobOutcome("rank 0", {})]) is None


def test_dependency_must_be_an_earlier_job() -> None:
    with pytest.raises(ValueError, match="Job.after must name an earlier job"):
        run_jobs([Job(IDENTITY, None, "a", after=0)], deadline=Deadline.after(60))


def test_workdirs_are_removed() -> None:
    outcome = run_jobs([Job(IDENTITY, None, "a")], deadline=Deadline.after(60))[0]
    assert outcome.output is not None
    assert not os.path.exists(outcome.output["workdir"])


def test_import_starts_no_process_and_loads_hypothesis_only_for_strategies() -> None:
    code = (
        "import sys, threading, trainparity, trainparity._process._launchers as e; "
        "assert not e.SERVER.running(); assert threading.active_count() == 1; "
        "assert 'hypothesis' not in sys.modules; trainparity.strategies.sampler_configs; "
        "assert 'hypothesis' in sys.modules; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_fork_server_exits_when_its_parent_dies_during_warm_up() -> None:
    code = (
        "import os, threading, time, trainparity._process._launchers as e\n"
        "threading.Thread(target=e.warm_up, daemon=True).start()\n"
        "while e.SERVER._process is None: time.sleep(0.01)\n"
        "print(e.SERVER._process.pid, flush=True)\n"
        "os._exit(1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    server = int(done.stdout.split()[0])
    assert still_running([server], grace=5.0) == []




def churn_frames(payload: object, workdir: object) -> dict[str, object]:
    """Engine task: push and pop frames without end, in this thread and in short-lived others."""
    import threading

    def deep(n: int) -> int:
        return 0 if n == 0 else deep(n - 1) + 1

    while True:
        thread = threading.Thread(target=deep, args=(50,))
        thread.start()
        for _ in range(100):
            deep(50)
        thread.join()


def test_the_stacks_dumped_before_the_kill_never_crash_the_child() -> None:
    # faulthandler's watchdog read the frames of running threads and could crash the child just before its
    # deadline: a hang reported as a SIGSEGV. Frames pushed and popped without end are the worst case. A forked
    # child and a spawned one dump through the same `run_request` (test_reliability's hang-timeout-spawn case
    # checks a spawned child's stack), so a forked one stands for both: a spawned one would burn two cores for 30 s.
    warm_up()  # the deadline is the children's, not the fork server's start
    outcomes = run_jobs([Job("test_engine:churn_frames", None, f"churn {i}") for i in range(2)],
                        deadline=Deadline.after(8), isolation="process", concurrency=2)
    for outcome in outcomes:
        assert outcome.error is not None and outcome.error.kind in ("timeout", "abandoned"), outcome.error
    stacks = [o.error.traceback for o in outcomes if o.error is not None and o.error.kind == "timeout"]
    assert stacks and all(s is not None and "in churn_frames" in s for s in stacks), stacks


def test_the_thread_that_dumps_the_stacks_is_left_out_of_the_report(tmp_path: pathlib.Path) -> None:
    with open(tmp_path / STACKS_FILE, "w") as stacks:
        cancel = _dump_stacks_at(time.monotonic(), stacks)
        deadline = time.monotonic() + 30
        while not (tmp_path / STACKS_FILE).stat().st_size and time.monotonic() < deadline:
            time.sleep(0.01)
        cancel()
    blocks = (tmp_path / STACKS_FILE).read_text().strip().split("\n\n")
    dumper = [block for block in blocks if f" in {STACKS_DUMPER}" in block]
    assert len(dumper) == 1, blocks
    # what the dumper's block would add to the report: its frames outside trainparity (threading.py's)
    added = "\n".join("  " + line.strip() for line in dumper[0].splitlines()
                      if (frame := re.match(r'\s*File "([^"]*)"', line)) and not engine_frame(frame[1]))
    reported = user_stacks(tmp_path)
    assert reported is not None and "in test_the_thread_that_dumps_the_stacks_is_left_out_of_the_report" in reported
    assert added and added not in reported.split("\n", 1)[1].split("\n  (another thread)\n"), reported


def test_the_fork_server_caches_bytecode_privately_and_keeps_a_spare_child(tmp_path: pathlib.Path) -> None:
    """Under PYTHONDONTWRITEBYTECODE a child compiles the user's modules from source unless the server gives it a
    bytecode directory of its own: the second child reads what the first wrote there, the user's tree gets no
    __pycache__, and the directory is gone once the server is, even one that was killed. Between requests the
    server holds one spare child, forked ahead, that ends with it."""
    source, temporary = tmp_path / "src", tmp_path / "tmp"
    source.mkdir()
    temporary.mkdir()
    (source / "user_task.py").write_text(textwrap.dedent("""
        import importlib.util, os, sys

        def task(payload, workdir):
            written = os.stat(importlib.util.cache_from_source(__file__))  # rewritten by a child that compiled
            return {"pid": os.getpid(), "prefix": sys.pycache_prefix,
                    "bytecode_file": [written.st_ino, written.st_mtime_ns]}
    """))
    script = textwrap.dedent(f"""
        import json, os, pathlib, signal, sys, time
        sys.path.insert(0, {str(source)!r})
        from trainparity._process import _forkserver, _launchers
        from trainparity._process._engine import Job, run_jobs
        from trainparity._process._options import Deadline

        def spares(server):
            found = []
            for entry in pathlib.Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    if parent == server and (entry / "comm").read_bytes().strip() == _forkserver.SPARE_NAME:
                        found.append(int(entry.name))
                except OSError:
                    pass
            return found

        def outputs():
            return [run_jobs([Job("user_task:task", None, "a")], deadline=Deadline.after(60))[0].output
                    for _ in range(2)]

        first = outputs()
        server = _launchers.SERVER._process.pid
        killed_bytecode = _launchers.SERVER.bytecode_directory()
        waited = time.monotonic() + 10
        while not spares(server) and time.monotonic() < waited:
            time.sleep(0.01)
        spare = spares(server)
        os.kill(server, signal.SIGKILL)
        _launchers.SERVER._process.wait()
        second = outputs()
        print(json.dumps({{"first": first, "second": second, "spare": spare, "server": server,
                          "killed_bytecode_exists": os.path.exists(killed_bytecode),
                          "bytecode": _launchers.SERVER.bytecode_directory(),
                          "server_after": _launchers.SERVER._process.pid,
                          "spare_after": spares(_launchers.SERVER._process.pid)}}))
    """)
    # Without the suite's shared bytecode directory (test/conftest.py): the user's environment as it comes.
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPYCACHEPREFIX"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**environment, "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(temporary)})
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.splitlines()[-1])
    first, second = facts["first"], facts["second"]
    assert all(output is not None for output in first + second), done.stderr
    assert first[0]["prefix"] is not None and first[0]["prefix"].startswith(str(temporary / "trainparity-bytecode-"))
    assert first[0]["bytecode_file"] == first[1]["bytecode_file"], "the second child compiled the module again"
    assert second[0]["bytecode_file"] == second[1]["bytecode_file"], "the second child compiled the module again"
    assert not (source / "__pycache__").exists()
    assert not facts["killed_bytecode_exists"], "the parent did not remove the bytecode of the server it lost"
    assert facts["bytecode"] != first[0]["prefix"] and facts["bytecode"] == second[0]["prefix"]
    assert len(facts["spare"]) == 1 and len(facts["spare_after"]) == 1
    assert facts["spare"][0] not in [output["pid"] for output in first]
    assert still_running([facts["server_after"], *facts["spare_after"]], grace=5.0) == []
    assert list(temporary.glob("trainparity-*")) == []
