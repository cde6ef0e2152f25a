"""What both script checks share: commands and environments checked at the call, jobs that run a
command under observation (one fresh directory per run chain), and the error of the first run
that failed or did not do its part."""

from __future__ import annotations

import os
import pathlib
import shlex
import sys
from collections.abc import Mapping, Sequence

from trainparity._process._engine import Job, JobOutcome, first_error, run_jobs
from trainparity._process._options import Deadline
from trainparity._results._violation import ChildError
from trainparity._resume._trace import RunTrace
from trainparity._script._hook import ENVIRONMENT, ScriptRun
from trainparity._validation import InvalidArgument, check_argument

SITE = pathlib.Path(__file__).resolve().parent / "site"
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
#: the placeholder in a command replaced by the run chain's own directory
WORKDIR = "{workdir}"

Command = str | Sequence[str]


def parse_command(command: object, name: str) -> list[str]:
    if isinstance(command, str):
        parts = shlex.split(command)
    elif isinstance(command, Sequence) and all(isinstance(part, str) for part in command):
        parts = list(command)
    else:
        raise InvalidArgument(f"{name}= must be a command line (a string, split like a shell) or a list of strings, "
                              f"got {type(command).__name__}")
    check_argument(parts, f"{name}= is empty: give the command that trains, e.g. 'python train.py'")
    return parts


def parse_environment(env: object) -> dict[str, str]:
    if env is None:
        return {}
    if not (isinstance(env, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise InvalidArgument("env= must map environment variable names to strings")
    return dict(env)


class ScriptRuns:
    """Jobs that run a command as a script under observation, one fresh directory per run chain, all within
    the check's deadline."""

    def __init__(self, root: pathlib.Path, deadline: Deadline, env: dict[str, str],
                 cwd: str | os.PathLike[str] | None):
        self.root = root
        self.deadline = deadline
        self.env = env
        self.cwd = str(pathlib.Path(cwd or os.getcwd()).resolve())

    def job(self, phase: str, parts: list[str], chain: str, run: ScriptRun) -> Job:
        (self.root / chain).mkdir(exist_ok=True)
        words = tuple(part.replace(WORKDIR, str(self.root / chain)) for part in parts)
        path = os.pathsep.join([str(SITE), str(PACKAGE_ROOT), *(p for p in sys.path if p)])
        variables = {**self.env, ENVIRONMENT: run.to_json(), "PYTHONPATH": path}
        return Job("", None, phase, record=RunTrace, command=words,
                   env=tuple(variables.items()), cwd=self.cwd)

    def run(self, jobs: Sequence[Job]) -> list[JobOutcome]:
        """Run `jobs` as fresh interpreters; a failed run abandons the runs after it (the earlier ones go on)."""
        return run_jobs(jobs, deadline=self.deadline, isolation="spawn", on_failure="later")


def run_error(outcomes: Sequence[JobOutcome], steps: int, resume_at: int) -> ChildError | None:
    """The failure of the first run that failed or did not do its part (in the order of the runs)."""
    failed = first_error(outcomes)
    for outcome in outcomes:
        if outcome.error is not None:
            return failed.error if failed is not None else outcome.error
        trace: RunTrace = outcome.output
        taken = trace.steps[-1].step if trace.steps else 0
        if outcome.phase.startswith("interrupted") and trace.saved is None:
            return ChildError("died", outcome.phase, "the script wrote no checkpoint (torch.save, safetensors or "
                              f"torch.distributed.checkpoint) at or after optimizer step {resume_at}: it ended "
                              f"after step {taken}")
        if not outcome.phase.startswith("interrupted") and taken < steps:
            return ChildError("died", outcome.phase, f"the script ended after optimizer step {taken}, before "
                              f"step {steps}: give it enough iterations (steps={steps})")
    return None
