"""Reliability: every fault ends in a clear result, nothing is left running, no raw exception escapes.

Each test stands for one way a check used to go wrong (issue 10); `tools/faults.py` runs the
whole fault matrix. Timing bounds here are loose (seconds past the timeout, where the old
engine took ten more): they catch a wait that should not be there, not a slow machine.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest
import torch
from fault_recipes import (
    SECRET_VARIABLE,
    CorruptsItsTrace,
    Faulty,
    StopsInStep,
    TwoFaults,
    WithOpaqueEntry,
    WithRngEntry,
    recorded_pids,
)
from process_helpers import marked_processes, running, still_running

import trainparity as tp
from trainparity._process import _engine, _forkserver, _launchers, _scratch, _wire
from trainparity._process._child import RESULT_FILE

pytestmark = pytest.mark.exact

HERE = pathlib.Path(__file__).resolve().parent
ISOLATIONS = ("process", "spawn")


def resume(recipe: tp.Recipe, isolation: str = "process", timeout: float = 60) -> tp.ResumeResult:
    return tp.check_resume(recipe, steps=4, resume_at=2, isolation=isolation, timeout=timeout)


def spare(process: pathlib.Path) -> bool:
    """Whether /proc/<pid> is the fork server's spare child, forked ahead of the next request."""
    try:
        return (process / "comm").read_bytes().strip() == _forkserver.SPARE_NAME
    except OSError:
        return False


def server_children() -> list[int]:
    """The live children of this process's fork server that run a job (not its spare)."""
    server = _launchers.SERVER._process
    if server is None:
        return []
    children = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == server.pid and running(int(entry.name)) and not spare(entry):
                children.append(int(entry.name))
    return children


@pytest.fixture
def pid_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    yield tmp_path
    assert still_running(recorded_pids(tmp_path)) == []


# 1. Ctrl-C while the fork server starts a child ---------------------------------------------------


def test_ctrl_c_at_any_moment_of_a_check_leaves_nothing_running(tmp_path: pathlib.Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _launchers.warm_up()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the checks' temporary directories go

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for delay_ms in (0.1, 0.5, 1, 2, 3, 5, 8, 12, 20):
            try:
                signal.setitimer(signal.ITIMER_REAL, delay_ms / 1000)
                resume(Faulty("hang"), timeout=60)
            except KeyboardInterrupt:
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            deadline = time.monotonic() + 3
            while server_children() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server_children() == [], f"interrupted {delay_ms} ms into the check"
            assert list(tmp_path.glob("trainparity-*")) == [], f"interrupted {delay_ms} ms into the check"
    finally:
        signal.signal(signal.SIGALRM, previous)
    # nothing stale is left in the protocol either: the next check runs normally
    assert resume(Faulty()).outcome is tp.Outcome.PASS


@pytest.mark.parametrize("guard", [(_launchers, "signals_deferred"), (_scratch, "_sigterm_cleans_up")],
                         ids=["signals_deferred", "sigterm_cleans_up"])
def test_an_interrupt_as_the_signals_are_changed_still_restores_them(guard: tuple[object, str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python signal handler runs as soon as a call returns: a Ctrl-C pending as the engine holds
    SIGINT/SIGTERM (or installs its SIGTERM handler) raises right after the change. The change must
    still be undone, or every later child inherits a blocked SIGTERM and ignores its termination."""
    real_mask, real_handler = signal.pthread_sigmask, signal.signal

    def mask_then_interrupt(how: int, mask: object) -> object:
        previous = real_mask(how, mask)  # type: ignore[arg-type]
        if how == signal.SIG_BLOCK and mask:
            raise KeyboardInterrupt
        return previous

    def handler_then_interrupt(signum: int, handler: object) -> object:
        previous = real_handler(signum, handler)  # type: ignore[arg-type]
        if handler not in (signal.SIG_DFL, signal.SIG_IGN):
            raise KeyboardInterrupt
        return previous

    monkeypatch.setattr(signal, "pthread_sigmask", mask_then_interrupt)
    monkeypatch.setattr(signal, "signal", handler_then_interrupt)
    with pytest.raises(KeyboardInterrupt), getattr(*guard)():
        pass
    monkeypatch.undo()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == set()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# 2. A check past its timeout returns promptly --------------------------------------------------------


# An accumulation check under process and spawn, with a tighter bound and nothing left running:
# test_timeouts.py::test_the_timeout_holds_in_every_isolation.


def test_a_hanging_rank_of_a_large_world_ends_the_check_soon_after_its_timeout(pid_dir: pathlib.Path) -> None:
    started = time.monotonic()
    result = tp.check_parallel(Faulty("hang", pid_dir=str(pid_dir)), world_size=12, steps=2, timeout=20)
    elapsed = time.monotonic() - started
    assert result.outcome is tp.Outcome.ERROR and result.error is not None, result.report()
    assert result.error.kind == "timeout" and "in inject" in (result.error.traceback or ""), result.report()
    assert elapsed < 20 + 5, f"returned {elapsed:.1f} s after a 20 s timeout"


# 3. Whole trees are killed -------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize(("fault", "outcome"), [("grandchild_hangs", tp.Outcome.ERROR),
                                                 ("grandchild_left", tp.Outcome.PASS)])
def test_a_grandchild_in_its_own_session_does_not_survive_the_check(
    isolation: str, fault: str, outcome: tp.Outcome, pid_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run serves a second test too, as a check under spawn costs seconds: the hanging one shows a timeout's
    stack, the recipe's (section 7); the passing one also looks for the environment in the checks' temporary files,
    and would end in ERROR had it found it there (section 8)."""
    recipe = Faulty(fault, pid_dir=str(pid_dir))
    if outcome is tp.Outcome.PASS:
        monkeypatch.setenv(SECRET_VARIABLE, f"secret-{uuid.uuid4()}")
        recipe = TwoFaults(fault, "secret_on_disk", pid_dir=str(pid_dir))
    # long enough for a spawned interpreter to import torch and reach the step on a loaded machine; a hanging
    # check waits all of it
    timeout = 60 if outcome is tp.Outcome.PASS else 25 if isolation == "spawn" else 8
    _launchers.warm_up()  # nor need it cover the fork server's start, where this is a worker's first check
    result = resume(recipe, isolation=isolation, timeout=timeout)
    assert result.outcome is outcome, result.report()
    assert len(recorded_pids(pid_dir)) >= 2  # the child and its grandchild did start
    assert still_running(recorded_pids(pid_dir)) == []
    assert marked_processes() == []
    if outcome is tp.Outcome.ERROR:  # the child hangs in inject(), called from step()
        assert_the_recipe_s_stack(result, "timeout")


# 4. Output the parent cannot read is an ERROR, not a raw exception --------------------------------------


@pytest.mark.parametrize("kind", ["fields", "nested"])
def test_undecodable_child_output_is_an_error(kind: str) -> None:
    result = resume(CorruptsItsTrace(kind))
    assert result.outcome is tp.Outcome.ERROR, result.report()
    assert result.error is not None and result.error.kind in ("corrupt", "raised"), result.report()


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated", "flipped"])
def test_unreadable_result_files_are_corrupt_outcomes(damage: str, tmp_path: pathlib.Path) -> None:
    _wire.dump({"steps": [], "tensor": torch.arange(100)}, tmp_path / RESULT_FILE)
    data = (tmp_path / RESULT_FILE).read_bytes()
    damaged = {"garbage": b"\xff\xfe not the wire format", "empty": b"", "truncated": data[: len(data) // 2],
               "flipped": bytes(b ^ 0xFF for b in data[:40]) + data[40:]}[damage]
    (tmp_path / RESULT_FILE).write_bytes(damaged)
    job = _engine.Job("trainparity._resume._trace:train_run", None, "baseline")
    outcome = _engine._read_outcome(job, tmp_path, 0, 0)
    assert outcome.output is None and outcome.error is not None and outcome.error.kind == "corrupt"
    assert outcome.error.headline().startswith("baseline: its output could not be read")


# 5. Valid input gets a right answer ---------------------------------------------------------------------


def test_a_state_entry_named_rng_is_state_not_a_random_stream() -> None:
    assert resume(WithRngEntry()).outcome is tp.Outcome.PASS
    result = resume(WithRngEntry(forget=True))
    first = result.first_violation
    assert first is not None and (first.path, first.kind, first.cause) == ("rng", "state_mismatch", "not_restored")


# 6. Bad input is refused at the call ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", [2**70, 2**63, -1])
def test_a_seed_out_of_range_is_refused_at_the_call(seed: int) -> None:
    with pytest.raises(ValueError, match=r"seed= must be in \[0, 2\*\*63\)"):
        tp.check_resume(Faulty(), seed=seed)
    with pytest.raises(ValueError, match="seed="):
        tp.check_accumulation(Faulty, seed=seed)
    with pytest.raises(ValueError, match="seed="):
        tp.check_parallel(Faulty, world_size=2, seed=seed)


# 7. Reports ---------------------------------------------------------------------------------------------------


def assert_the_recipe_s_stack(result: tp.Result, kind: str) -> None:
    """The check ended in an error of `kind`, reported with the stack of the recipe, where Faulty injects its fault
    from step(): not one of trainparity's own frames, nor a `<string>` frame."""
    assert result.error is not None and result.error.kind == kind, result.report()
    stack = result.error.traceback or ""
    assert "fault_recipes.py" in stack and "in inject" in stack and "in step" in stack, result.report()
    assert "trainparity/_" not in stack and "<string>" not in stack


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_crash_comes_with_the_recipes_stack(isolation: str, pid_dir: pathlib.Path) -> None:
    """A hang's stack (a timeout's) is checked on the hanging run of
    test_a_grandchild_in_its_own_session_does_not_survive_the_check, which waits out a timeout anyway."""
    timeout = 8 if isolation == "process" else 20
    result = resume(Faulty("sigsegv", pid_dir=str(pid_dir)), isolation=isolation, timeout=timeout)
    assert_the_recipe_s_stack(result, "died")


def test_every_run_failing_reports_the_same_phase_and_traceback_in_every_isolation() -> None:
    reports = {(isolation, attempt): resume(Faulty("raise", phase="setup"), isolation=isolation)
               for isolation in ISOLATIONS for attempt in range(3)}
    phases = {result.error.phase for result in reports.values() if result.error is not None}
    tracebacks = {result.report().split("Traceback from the recipe:")[1] for result in reports.values()}
    assert phases == {"interrupted"}
    assert len(tracebacks) == 1
    traceback = tracebacks.pop()
    assert "test/fault_recipes.py" in traceback and "trainparity/_" not in traceback and str(HERE) not in traceback


@pytest.mark.parametrize("isolation", ["inprocess", "process"])
def test_a_stop_iteration_out_of_step_is_reported_as_the_recipe_raised_it(isolation: str) -> None:
    # The engine calls step() from generators, where Python turns a StopIteration into a RuntimeError (PEP 479).
    result = tp.check_training(StopsInStep(), steps=3, isolation=isolation, timeout=120)
    assert result.outcome is tp.Outcome.ERROR and result.error is not None
    assert result.reason == "training: the recipe raised StopIteration"
    assert result.error.traceback is not None and "next(empty)" in result.error.traceback
    assert "RuntimeError" not in result.report()
    if isolation == "inprocess":
        with pytest.raises(StopIteration):
            tp.assert_training_healthy(StopsInStep(), steps=3, isolation=isolation)
    # One of the recipe's own generators makes it a RuntimeError in the recipe's code: that is what it raised.
    for own_generator in (StopsInStep(own_generator=True), StopsInStep(in_batches=True)):
        own = tp.check_training(own_generator, steps=3, isolation=isolation, timeout=120)
        assert own.reason == "training: the recipe raised RuntimeError: generator raised StopIteration"


def test_escape_codes_in_an_exception_do_not_reach_the_report() -> None:
    report = resume(Faulty("escape_codes")).report()
    assert "\x1b" not in report and "\x07" not in report
    assert "\\x1b[31mred\\x1b[0m and a bell\\x07" in report


def test_a_huge_exception_message_makes_a_bounded_report() -> None:
    report = resume(Faulty("huge_message")).report()
    assert len(report) < 50_000  # the message, cut to 10,000 characters, is in the reason and the traceback
    assert "more characters cut" in report


# 8. No environment at rest ------------------------------------------------------------------------------------


# The environment is never written to a temporary file: the passing runs of
# test_a_grandchild_in_its_own_session_does_not_survive_the_check look for it there, in every isolation.


def test_sigterm_to_the_parent_kills_the_children_and_removes_the_temporary_files(tmp_path: pathlib.Path) -> None:
    pids, temporary = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    temporary.mkdir()
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import trainparity as tp
        from trainparity._process import _launchers
        from fault_recipes import Faulty
        _launchers.warm_up()
        print(_launchers.SERVER._process.pid, flush=True)
        tp.check_resume(Faulty("grandchild_hangs", pid_dir={str(pids)!r}), steps=4, resume_at=2, timeout=120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(temporary)})
    try:
        assert parent.stdout is not None
        server = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while len(recorded_pids(pids)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(recorded_pids(pids)) >= 2, "the recipe did not start"
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == -signal.SIGTERM  # ended by SIGTERM, after cleaning up
    finally:
        parent.kill()
        parent.wait()
    assert still_running([*recorded_pids(pids), server]) == []
    assert list(temporary.glob("trainparity-*")) == []  # torch may keep caches there (torchinductor_<user>)


def test_sigterm_during_a_check_under_a_test_runner_ends_the_run_and_removes_the_temporary_files(
        tmp_path: pathlib.Path) -> None:
    """A check in this process holds directories (the checkpoint's, the run's workdir) though no child runs; and a
    test runner catches the SystemExit that unwinds the check, then runs the next test: SIGTERM must still remove
    the directories, then end the process."""
    pids, temporary, after = tmp_path / "pids", tmp_path / "tmp", tmp_path / "the next test ran"
    pids.mkdir()
    temporary.mkdir()
    (tmp_path / "test_user.py").write_text(textwrap.dedent(f"""
        import pathlib
        import sys
        import unittest
        sys.path.insert(0, {str(HERE)!r})
        import trainparity as tp
        from fault_recipes import Faulty

        class Training(unittest.TestCase):
            def test_a_resume(self):
                tp.check_resume(Faulty("hang", pid_dir={str(pids)!r}), steps=4, resume_at=2, isolation="inprocess",
                                timeout=120)

            def test_b_next(self):
                pathlib.Path({str(after)!r}).touch()
    """))
    runner = subprocess.Popen([sys.executable, "-m", "unittest", "test_user"], cwd=tmp_path,
                              env={**os.environ, "TMPDIR": str(temporary)})
    try:
        deadline = time.monotonic() + 60
        while not recorded_pids(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert recorded_pids(pids), "the recipe did not start"
        assert list(temporary.glob("trainparity-checkpoint-*")), "the check made no checkpoint directory"
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == -signal.SIGTERM
    finally:
        runner.kill()
        runner.wait()
    assert list(temporary.glob("trainparity-*")) == []
    assert not after.exists()


def test_a_check_that_a_killed_child_was_running_leaves_no_temporary_files(tmp_path: pathlib.Path) -> None:
    """A child that imports the recipe's module runs what the module runs at import, an in-process check
    included; killed at the deadline, it cannot remove that check's directories: its parent must."""
    pids, temporary = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    temporary.mkdir()
    (tmp_path / "imports_a_check.py").write_text(textwrap.dedent(f"""
        import os
        import trainparity as tp
        from fault_recipes import Faulty

        class Outer(Faulty):
            pass

        if "TRAINPARITY_JOB" in os.environ:  # in the check's children only, as a script without a __main__ guard
            tp.check_resume(Faulty("hang", pid_dir={str(pids)!r}), steps=2, resume_at=1, isolation="inprocess",
                            timeout=600)
    """))
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(HERE)!r}, {str(tmp_path)!r}]
        import trainparity as tp
        from imports_a_check import Outer
        from trainparity._process import _launchers
        _launchers.warm_up()  # the timeout, which the check waits out, then need not cover the fork server's start
        print(tp.check_resume(Outer(), steps=2, resume_at=1, timeout=15).outcome.name)
    """)
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(temporary)},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ERROR", done.stdout + done.stderr
    assert recorded_pids(pids), "the check at import did not start"
    assert still_running(recorded_pids(pids)) == []
    assert sorted(temporary.rglob("trainparity-*")) == []


def _run_with_a_scratch_directory(tmp_path: pathlib.Path, body: str, after: str = "") -> tuple[int, str, pathlib.Path]:
    """Run `body` in a fresh interpreter inside `scratch_directory` (as `path`), then `after`, with TMPDIR in
    `tmp_path`; return the exit status (negative: the signal that ended it), its output, and the temporary
    directory."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    script = "import os, pathlib, signal, sys, time\nfrom trainparity._process._scratch import scratch_directory\n" \
        "with scratch_directory('trainparity-') as path:\n" + textwrap.indent(textwrap.dedent(body), "    ") + after
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(temporary)},
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr, temporary


def test_a_second_sigterm_does_not_cut_the_cleanup_the_first_started(tmp_path: pathlib.Path) -> None:
    code, output, temporary = _run_with_a_scratch_directory(tmp_path, """
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            print("cleaned up", flush=True)
    """)
    assert code == -signal.SIGTERM and "cleaned up" in output, (code, output)
    assert list(temporary.iterdir()) == []


def test_a_sigterm_pending_as_the_handler_is_undone_still_ends_the_process(tmp_path: pathlib.Path) -> None:
    """CPython runs a pending handler before `signal.signal` changes it: SIGTERM sent just then raises in the
    cleanup, which must still undo the handler (or every later check would leave SIGTERM to a caught exit)."""
    code, output, temporary = _run_with_a_scratch_directory(tmp_path, """
        real = signal.signal
        def sigterm_first(signum, handler):
            if handler == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGTERM)
            return real(signum, handler)
        signal.signal = sigterm_first
    """)
    assert code == -signal.SIGTERM, (code, output)
    assert list(temporary.iterdir()) == []


def test_a_process_forked_during_a_check_dies_of_sigterm_without_removing_the_check_s_directory(
        tmp_path: pathlib.Path) -> None:
    """A recipe's helper forked from the main thread inherits the handler and a copy of the check's stack:
    unwinding that copy would remove the directories the check is still using."""
    code, output, temporary = _run_with_a_scratch_directory(tmp_path, """
        ready, started = os.pipe()
        helper = os.fork()
        if helper == 0:
            os.write(started, b"1")  # once the interpreter runs: a signal sent during fork() is dropped
            time.sleep(30)
            os._exit(0)
        os.read(ready, 1)
        os.kill(helper, signal.SIGTERM)
        _, status = os.waitpid(helper, 0)
        print("helper ended by signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
        print("directory there:", path.is_dir(), flush=True)
    """)
    assert code == 0, (code, output)
    assert f"helper ended by signal {int(signal.SIGTERM)}" in output and "directory there: True" in output, output
    assert list(temporary.iterdir()) == []


def test_a_sigterm_handler_installed_during_a_check_is_kept(tmp_path: pathlib.Path) -> None:
    code, output, _ = _run_with_a_scratch_directory(tmp_path, """
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
    """, after='print("after:", signal.getsignal(signal.SIGTERM).__name__)\n')
    assert code == 0 and "after: mine" in output, (code, output)

# 9. What is not compared is said ---------------------------------------------------------------------------------


def test_opaque_state_entries_are_named_in_the_notes() -> None:
    result = resume(WithOpaqueEntry())
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert any(note.startswith("not compared: blob (object)") for note in result.notes), result.notes


# 11. A check at module level ----------------------------------------------------------------------------------


def test_a_check_at_module_level_is_an_error_not_a_check_in_every_child(tmp_path: pathlib.Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "module_level_check.py").write_text(textwrap.dedent("""
        import trainparity as tp
        from fault_recipes import Faulty

        class Recipe(Faulty):
            pass

        RESULT = tp.check_resume(Recipe(), steps=2, resume_at=1, timeout=60)  # no __main__ guard
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "module_level_check", raising=False)
    import module_level_check

    result = module_level_check.RESULT
    assert result.outcome is tp.Outcome.ERROR and result.error is not None, result.report()
    assert "a check that starts processes was called while trainparity imported 'module_level_check'" in \
        result.error.message
    sys.modules.pop("module_level_check", None)
