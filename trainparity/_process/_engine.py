"""The process engine: run tasks in fresh processes, with timeouts, and bring back their output.

Written once, used by every check that needs processes. Three isolations:

- "process": a child forked from the warmed fork server (`_forkserver.py`): a new PID and
  fresh imports of the user's modules, without paying torch's import in every child;
- "spawn": a completely fresh interpreter (`python -m trainparity._process._child`);
- "inprocess": the task runs in this process (fast, no isolation; for debugging).

The engine owns each child's whole life: it sends the request through a pipe (the parent's
environment never rests on disk), kills the child's whole tree (`_tree.kill_tree`) on
timeout, on a peer's failure, on Ctrl-C or SIGTERM, and after a normal exit (what the child
left running), waits until the kill is confirmed, and removes the temporary directory. Every job of
a call, and every call of one check, shares the check's `Deadline` (its whole `timeout`, the fork
server's start included), so a check past its timeout returns within about a second and a half of it;
a run in this process is interrupted at the deadline (`_alarm`). Children write their output in
the `_wire` format (JSON and raw bytes: reading it cannot run code); output that cannot be
read back as the job's record is an error of kind "corrupt", and a hang or a crash comes with faulthandler's
stacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pathlib
import pickle
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from trainparity._process import _wire as wire
from trainparity._process._alarm import DeadlinePassed, can_interrupt, interrupted_at
from trainparity._process._child import (
    ERROR_FILE,
    JOB_DIRECTORY,
    RAISED_EXIT,
    RESULT_FILE,
    STACKS_DUMPER,
    STACKS_FILE,
    Request,
    engine_frame,
    error_record,
    load_task,
    recipe_exception,
)
from trainparity._process._launchers import SERVER, SERVER_LOCK, ForkServer, Spawner
from trainparity._process._options import Deadline
from trainparity._process._scratch import scratch_directory
from trainparity._process._session import refuse_processes_while_importing
from trainparity._records import read
from trainparity._results._violation import ChildError

#: seconds to wait for killed children to be confirmed gone before returning regardless
KILL_CONFIRM_TIMEOUT = 1.5


@dataclasses.dataclass(frozen=True)
class Job:
    """One task to run: `task(payload, workdir) -> record` in a fresh process."""

    task: str
    payload: Any
    #: names the run in reports: "baseline", "resumed", "rank 1", ...
    phase: str
    rank: int | None = None
    #: index (in the same run_jobs call) of a job that must succeed before this one starts
    after: int | None = None
    #: the record type (a dataclass) the task returns: read back from the child's output by its annotations
    #: (`trainparity._records.read`); output that is not one is "corrupt"
    record: type | None = None
    #: a program to run instead of the task (isolation "spawn" only), with these environment
    #: variables added; it writes its output files to the directory `JOB_DIRECTORY` names
    command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    #: whether the task writes in its work directory: a task run in this process that does not is given a path that
    #: does not exist (creating and removing a directory costs milliseconds on a busy disk, a small check's tenth)
    workdir: bool = True


@dataclasses.dataclass
class JobOutcome:
    phase: str
    #: the task's output: a `Job.record` where the job names one
    output: Any
    error: ChildError | None = None
    #: the live exception, only for isolation="inprocess"
    exception: BaseException | None = None
    #: when the job failed, on the machine-wide monotonic clock: when its exception was caught in
    #: the child; for a death, when it was seen less DEATH_UNCERTAINTY; for a timeout, its deadline
    failed_at: float = math.inf


#: how much earlier than it is seen a process may have died: the processes that depend on it (ranks
#: in a collective) raise within milliseconds of its death, before the engine may have seen it
DEATH_UNCERTAINTY = 0.5


def first_error(outcomes: Sequence[JobOutcome]) -> JobOutcome | None:
    """The outcome whose error caused the others (an "abandoned" job only reports a consequence):
    the first failed job in the order of the jobs, which is the order of a check's runs."""
    errors = [o for o in outcomes if o.error is not None]
    return next((o for o in errors if o.error is not None and o.error.kind != "abandoned"), None) or next(
        iter(errors), None
    )


def first_failure(outcomes: Sequence[JobOutcome]) -> JobOutcome | None:
    """The outcome whose error came first in time, for jobs that fail each other (the ranks of one
    world: when one fails, the others' collectives break and they raise too, a little later)."""
    errors = [o for o in outcomes if o.error is not None and o.error.kind != "abandoned"]
    return min(errors, key=lambda o: o.failed_at) if errors else first_error(outcomes)


# -- running jobs ----------------------------------------------------------------------------------


#: what a failed job does to the others: nothing, abandon the jobs after it, or abandon all
FAILURE_POLICIES = ("continue", "later", "all")


def run_jobs(
    jobs: Sequence[Job], *, deadline: Deadline, isolation: str = "process", concurrency: int | None = None,
    on_failure: str = "continue",
) -> list[JobOutcome]:
    """Run `jobs` (concurrently where cores allow) and return their outcomes in order.

    When a job raises, dies or times out, `on_failure="later"` kills or skips the jobs after
    it in the list, while the earlier ones run on: when every job fails, the first one's
    error is the one reported, whichever ended first. `on_failure="all"` kills every other
    job (ranks of one distributed run wait on each other forever otherwise). Those are
    reported with kind "abandoned", the failed job carries the error; `first_error` picks
    the error to report. Every job ends by `deadline`, the check's: a job still running then is
    killed (in this process: interrupted) and reported as a timeout, and a job not started by then
    is abandoned; the fork server's start counts too.
    """
    if on_failure not in FAILURE_POLICIES:
        raise ValueError(f"on_failure must be one of {FAILURE_POLICIES}, got {on_failure!r}")
    if isolation != "inprocess":
        refuse_processes_while_importing()
    for index, job in enumerate(jobs):
        if job.after is not None and not 0 <= job.after < index:
            raise ValueError(f"Job.after must name an earlier job, got {job.after} for job {index}")
    if isolation == "inprocess":
        done: list[JobOutcome] = []
        for job in jobs:
            before = None if job.after is None else done[job.after]
            if before is not None and before.error is not None:
                done.append(_abandoned(job, f"not started: {before.phase} failed"))
            elif deadline.remaining() <= 0:
                done.append(_abandoned(job, f"not started: the check's {deadline.describe()} had passed"))
            else:
                done.append(_run_inprocess(job, deadline))
        return done
    with scratch_directory("trainparity-") as workroot, SERVER_LOCK:
        launcher = SERVER if isolation == "process" else Spawner()
        if launcher is SERVER:
            try:
                SERVER.ensure_running(deadline.at)
            except TimeoutError:
                return _server_not_ready(jobs, deadline)
        batch = _Batch(jobs, workroot, launcher, concurrency or max(1, os.cpu_count() or 1), on_failure, deadline)
        return batch.run()


def _timeout(job: Job, deadline: Deadline, what: str) -> ChildError:
    return ChildError("timeout", job.phase, f"did not finish within {deadline.describe()}, the limit of the whole "
                      f"check (all its runs); {what}", rank=job.rank)


def _abandoned(job: Job, why: str) -> JobOutcome:
    return JobOutcome(job.phase, None, ChildError("abandoned", job.phase, why, rank=job.rank))


def _server_not_ready(jobs: Sequence[Job], deadline: Deadline) -> list[JobOutcome]:
    """The outcomes of jobs that never started: the fork server was still starting at the deadline (it goes on
    starting, and a later check uses it)."""
    first = JobOutcome(jobs[0].phase, None, _timeout(jobs[0], deadline, "it never started: the fork server, which "
                       "imports torch once for every check of this process, was still starting"), failed_at=deadline.at)
    return [first, *(_abandoned(job, "not started: the fork server was still starting") for job in jobs[1:])]


def _run_inprocess(job: Job, deadline: Deadline) -> JobOutcome:
    unused = contextlib.nullcontext(pathlib.Path(tempfile.gettempdir()) / "trainparity-no-workdir")
    with scratch_directory("trainparity-") if job.workdir else unused as workdir:
        try:
            with interrupted_at(deadline):
                output = load_task(job.task)(job.payload, workdir)
        except DeadlinePassed as interruption:
            error = _timeout(job, deadline, "it was interrupted in this process (isolation='inprocess')")
            return JobOutcome(job.phase, None, dataclasses.replace(error, traceback=interruption.stack()),
                              failed_at=deadline.at)
        except Exception as error:  # noqa: BLE001 - the user's error becomes an ERROR outcome
            record = error_record(error)
            return JobOutcome(job.phase, None, ChildError.raised(record, job.phase, job.rank),
                              exception=recipe_exception(error), failed_at=record["raised_at"])
    if deadline.remaining() <= 0 and not can_interrupt():  # nothing interrupted it: its time was up all the same
        return JobOutcome(job.phase, None, _timeout(job, deadline, "it ran in this process off the main thread, "
                          "where it cannot be interrupted, and returned late"), failed_at=deadline.at)
    if job.record is not None and not isinstance(output, job.record):
        wrong = TypeError(f"the task returned a {type(output).__name__}, not a {job.record.__name__}")
        return JobOutcome(job.phase, None, _corrupt(job, wrong))
    return JobOutcome(job.phase, output)


def _read(job: Job, output: Any) -> JobOutcome:
    """The output a child wrote, read back as the job's record."""
    if job.record is None:
        return JobOutcome(job.phase, output)
    try:
        return JobOutcome(job.phase, read(job.record, output, "output"))
    except (Exception, RecursionError) as error:  # noqa: BLE001 - malformed output is the child's fault
        return JobOutcome(job.phase, None, _corrupt(job, error))


def _corrupt(job: Job, error: BaseException) -> ChildError:
    return ChildError("corrupt", job.phase, f"its output could not be read ({type(error).__name__}: {error})",
                      rank=job.rank)


#: one frame line of a faulthandler dump
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+ in ')


def user_stacks(workdir: pathlib.Path) -> str | None:
    """faulthandler's dump of a child, thread by thread, without trainparity's frames; None if empty."""
    try:
        text = (workdir / STACKS_FILE).read_text(errors="replace")
    except OSError:
        return None
    threads = []
    for block in text.strip().split("\n\n"):
        if f" in {STACKS_DUMPER}" in block:
            continue
        frames = [line.strip() for line in block.splitlines()
                  if (match := _DUMP_FRAME.match(line)) and not engine_frame(match["file"])]
        if frames:
            threads.append("\n".join("  " + frame for frame in frames))
    if not threads:
        return None
    return "Stack when the process crashed or was killed (most recent call first):\n" + "\n  (another thread)\n".join(
        threads)


def _read_outcome(job: Job, workdir: pathlib.Path, exitcode: int, signal_number: int) -> JobOutcome:
    try:
        if (workdir / RESULT_FILE).exists() and exitcode == 0:
            return _read(job, wire.load(workdir / RESULT_FILE))
        if (workdir / ERROR_FILE).exists() and exitcode == RAISED_EXIT:
            record = wire.load(workdir / ERROR_FILE)
            return JobOutcome(job.phase, None, ChildError.raised(record, job.phase, job.rank),
                              failed_at=float(record.get("raised_at", time.monotonic())))
    except (Exception, RecursionError) as error:  # noqa: BLE001 - malformed output is the child's fault
        return JobOutcome(job.phase, None, _corrupt(job, error), failed_at=time.monotonic())
    stacks = user_stacks(workdir)
    if signal_number:
        name = signal.Signals(signal_number).name
        died = ChildError("died", job.phase, f"killed by signal {name}", traceback=stacks, signal=name, rank=job.rank)
    else:
        what = "exited with status 0 without writing its output" if exitcode == 0 else f"exit code {exitcode}"
        died = ChildError("died", job.phase, what, traceback=stacks, exitcode=exitcode, rank=job.rank)
    return JobOutcome(job.phase, None, died, failed_at=time.monotonic() - DEATH_UNCERTAINTY)


@dataclasses.dataclass
class _Running:
    index: int
    #: unique across runs, so that a late line about a killed child is never mistaken for a new one
    key: str
    workdir: pathlib.Path
    deadline: float


class _Batch:
    """One run_jobs call over processes: launches, deadlines, exits, kills and their confirmation."""

    def __init__(self, jobs: Sequence[Job], workroot: pathlib.Path, launcher: ForkServer | Spawner,
                 concurrency: int, on_failure: str, deadline: Deadline) -> None:
        self.jobs = jobs
        self.workroot = workroot
        self.launcher = launcher
        self.concurrency = concurrency
        self.on_failure = on_failure
        self.outcomes: list[JobOutcome | None] = [None] * len(jobs)
        self.pending = list(range(len(jobs)))
        self.running: dict[str, _Running] = {}
        #: killed children whose end is not confirmed yet
        self.dying: dict[str, _Running] = {}
        self.deadline = deadline
        #: the same for every job of the call, whatever ran beside it, so that their numbers agree
        self.threads = max(1, (os.cpu_count() or 1) // min(concurrency, len(jobs)))

    def run(self) -> list[JobOutcome]:
        try:
            while self.pending or self.running:
                self._launch_ready()
                for key, code, sig in self.launcher.exits(0.05 if self.running else 0):
                    self._ended(key, code, sig)
                self._expire()
        finally:
            for key in list(self.running):
                self._kill(key, None)
            self._confirm_kills()
        return [o for o in self.outcomes if o is not None]

    def _launch_ready(self) -> None:
        for index in list(self.pending):
            job = self.jobs[index]
            before = None if job.after is None else self.outcomes[job.after]
            if job.after is not None and before is None:
                continue
            if before is not None and before.error is not None:
                self.pending.remove(index)
                self.outcomes[index] = _abandoned(job, f"not started: {before.phase} failed")
            elif len(self.running) < self.concurrency:
                self.pending.remove(index)
                self._launch(index, job)
            if self._expire():  # launching thousands of ranks takes seconds: deadlines hold meanwhile
                return

    def _launch(self, index: int, job: Job) -> None:
        key = f"{self.workroot.name}.{index}"
        workdir = self.workroot / f"job{index}"
        workdir.mkdir()
        deadline = self.deadline.at
        request = Request(job.task, job.payload, str(workdir), list(sys.path), os.getcwd(), dict(os.environ), key,
                          deadline - min(1.0, self.deadline.timeout / 10), self.threads)
        self.running[key] = _Running(index, key, workdir, deadline)
        if job.command is None:
            try:
                self.launcher.start(key, pickle.dumps(request))
            except RuntimeError as error:  # the fork server died (the machine killed it): this run never started
                del self.running[key]
                self.outcomes[index] = JobOutcome(job.phase, None, ChildError("died", job.phase, str(error),
                                                                              rank=job.rank))
                self._abandon(index, f"not started: {error}")
        else:
            assert isinstance(self.launcher, Spawner), "a command job runs with isolation='spawn'"
            self.launcher.start_command(key, job.command, {**dict(job.env), JOB_DIRECTORY: str(workdir)}, job.cwd)

    def _ended(self, key: str, code: int, sig: int) -> None:
        if key in self.dying:
            item = self.dying.pop(key)
            outcome = self.outcomes[item.index]
            if outcome is not None and outcome.error is not None and outcome.error.kind == "abandoned" \
                    and sig != signal.SIGKILL and code != 0:
                # it failed by itself before the kill reached it, perhaps before the failure that
                # abandoned it: its own error, with its own time, competes for the first
                self.outcomes[item.index] = outcome = _read_outcome(self.jobs[item.index], item.workdir, code, sig)
            if outcome is not None and outcome.error is not None and outcome.error.traceback is None:
                outcome.error = dataclasses.replace(outcome.error, traceback=user_stacks(item.workdir))
            return
        if key not in self.running:
            return  # a child of an earlier, interrupted run
        item = self.running.pop(key)
        job = self.jobs[item.index]
        self.outcomes[item.index] = outcome = _read_outcome(job, item.workdir, code, sig)
        if outcome.error is not None:
            self._abandon(item.index, f"killed after {job.phase} failed")

    def _expire(self) -> bool:
        """Kill the jobs past their deadline; whether any was."""
        now = time.monotonic()
        late = [item for item in self.running.values() if item.deadline <= now]
        for item in late:
            if item.key not in self.running:  # abandoned by an earlier one's timeout
                continue
            job = self.jobs[item.index]
            self._kill(item.key, _timeout(job, self.deadline, "its process tree was killed"))
            self._abandon(item.index, f"killed after {job.phase} timed out")
        return bool(late)

    def _kill(self, key: str, error: ChildError | None) -> None:
        item = self.running.pop(key)
        self.launcher.kill(key)
        self.dying[key] = item
        if error is not None:
            failed_at = item.deadline if error.kind == "timeout" else math.inf
            self.outcomes[item.index] = JobOutcome(error.phase, None, error, failed_at=failed_at)

    def _abandon(self, failed: int, why: str) -> None:
        """What `on_failure` says to do with the other jobs once job `failed` has failed."""
        if self.on_failure == "continue":
            return
        first = 0 if self.on_failure == "all" else failed + 1
        for key, item in list(self.running.items()):
            if item.index >= first:
                job = self.jobs[item.index]
                self._kill(key, ChildError("abandoned", job.phase, why, rank=job.rank))
        for index in [i for i in self.pending if i >= first]:
            self.outcomes[index] = _abandoned(self.jobs[index], f"not started: {why}")
            self.pending.remove(index)

    def _confirm_kills(self) -> None:
        """Wait (bounded) until every killed child is confirmed gone, so that nothing is left running."""
        deadline = time.monotonic() + KILL_CONFIRM_TIMEOUT
        while self.dying and time.monotonic() < deadline:
            for key, code, sig in self.launcher.exits(max(0.0, min(0.05, deadline - time.monotonic()))):
                self._ended(key, code, sig)
