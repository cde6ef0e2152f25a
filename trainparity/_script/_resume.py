"""`check_resume_script`: the resume check on a training script as it is, run as real processes.

The script is observed through hooks installed before its first line (`_hook`, by the
`sitecustomize.py` in `site/`, which leads the children's PYTHONPATH); it decides itself where
and when it saves. Four runs: two uninterrupted baselines of `steps` optimizer steps, the
interrupted run ended right after the script's first checkpoint at or after `resume_at`, and
`resume_command` continuing from it in the same directory. Their traces are `RunTrace`s, judged
by the same `judge_resume` as recipes. A `torchrun` command is observed on every rank (`_launch`), and the ranks
of the resumed launch that disagree where uninterrupted ones agree lead its violations (restored on one rank only).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from trainparity._process import _session
from trainparity._process._options import Deadline
from trainparity._process._scratch import scratch_directory
from trainparity._results._result import ResumeResult
from trainparity._results._violation import ChildError, Outcome
from trainparity._resume._judge import judge_resume
from trainparity._resume._trace import RunTrace, Whole
from trainparity._resume._values import fetch_values, values_wanted
from trainparity._script._hook import ScriptRun
from trainparity._script._launch import copy_violations
from trainparity._script._runs import Command, ScriptRuns, parse_command, parse_environment, run_error
from trainparity._state._compare import Comparison, compare_snapshots, resolve_comparison
from trainparity._validation import check_int, check_resume_at


def _validate(steps: object, resume_at: object) -> tuple[int, int]:
    steps = check_int("steps", steps, 2, "optimizer steps")
    return steps, check_resume_at(resume_at, steps)


@_session.recorded
def check_resume_script(
    command: Command,
    resume_command: Command,
    *,
    steps: int = 6,
    resume_at: int = 3,
    comparison: Comparison | None = None,
    timeout: float = 600.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> ResumeResult:
    """Check that an unmodified training script, interrupted by a real exit after its own checkpoint
    and continued by `resume_command`, reproduces its uninterrupted training. Never raises for a FAIL.

    `command` trains from scratch, `resume_command` continues from the checkpoint the script
    wrote (both a string split like a shell, or a list). `{workdir}` in either is a fresh
    directory per run chain: the interrupted and the resumed run share one, each baseline has
    its own. `env` adds environment variables; `cwd` defaults to the current directory.
    `timeout` bounds the whole check: its four runs, the reruns that fetch values for the report,
    and their interpreters' start. `trainparity.probe` lets the script name its batches' sample IDs
    and more state to compare.
    """
    run_command, continue_command = parse_command(command, "command"), parse_command(resume_command, "resume_command")
    steps, resume_at = _validate(steps, resume_at)
    declared = resolve_comparison(comparison)
    deadline = Deadline.after(timeout)
    variables = parse_environment(env)
    config: dict[str, Any] = {
        "command": shlex.join(run_command),
        "resume_command": shlex.join(continue_command),
        "steps": steps,
        "resume_at": resume_at,
        "comparison": declared.describe(),
    }
    with scratch_directory("trainparity-script-") as chains:
        return _run_and_judge(ScriptRuns(chains, deadline, variables, cwd), chains, (run_command, continue_command),
                              steps, resume_at, declared, config)


def _run_and_judge(runs: ScriptRuns, chains: pathlib.Path, commands: tuple[list[str], list[str]], steps: int,
                   resume_at: int, declared: Comparison, config: dict[str, Any]) -> ResumeResult:
    """The four runs of the script, judged; then the values the report shows, fetched by running three again."""
    run_command, continue_command = commands
    job = runs.job

    def traced(mode: str, last: int, first: int, **fields: Any) -> ScriptRun:
        # A step's tensors as digests but for a few small ones: the values the report shows are fetched (below).
        return ScriptRun(mode, last, resume_at, first, step_digests=True, **fields)

    handoff = str(chains / "saved-at")
    # As in check_resume: the resumed run starts as soon as the interrupted one has saved and
    # exited, while the baselines run beside them.
    outcomes = runs.run([
        job("interrupted", run_command, "resumed", traced("interrupted", steps, 1, handoff=handoff)),
        job("baseline", run_command, "baseline", traced("baseline", steps, 1)),
        dataclasses.replace(job("resumed", continue_command, "resumed",
                                traced("resumed", steps, 0, handoff=handoff)), after=0),
        job("baseline (repeat)", run_command, "repeat", traced("baseline", steps, 1)),
    ])
    error = run_error(outcomes, steps, resume_at)
    if error is not None:
        return ResumeResult.errored(error, config)
    interrupted, baseline, resumed, repeat = (o.output for o in outcomes)
    saved_at = interrupted.steps[-1].step
    notes = _drop_unseeded_streams(baseline, (baseline, repeat, interrupted, resumed))
    if saved_at != resume_at:
        notes.append(f"the script's first checkpoint at or after step {resume_at} was written after step "
                     f"{saved_at}.")
    result = judge_resume(baseline, repeat, interrupted, resumed, saved_at, declared, config, script=True)
    wanted = values_wanted(result, baseline, resumed, saved_at)
    if wanted is not None:

        def rerun(last: int, whole: Whole) -> tuple[list[RunTrace], ChildError | None]:
            """The three runs again, in chains of their own, to step `last` with `whole` shipped whole."""
            paths = tuple((step, tuple(sorted(names))) for step, names in whole)
            again = str(chains / "saved-at.values")
            rerun_outcomes = runs.run([
                job("baseline (values)", run_command, "baseline-values",
                    traced("baseline", last, 1, whole=paths)),
                job("interrupted (values)", run_command, "resumed-values",
                    traced("interrupted", steps, 1, handoff=again, whole=paths)),
                dataclasses.replace(job("resumed (values)", continue_command, "resumed-values",
                                        traced("resumed", last, 0, handoff=again, whole=paths)),
                                    after=1),
            ])
            failed = run_error(rerun_outcomes, last, resume_at)
            return [o.output for o in rerun_outcomes], failed

        notes += fetch_values(wanted, (baseline, interrupted, resumed), saved_at, rerun)
        result = judge_resume(baseline, repeat, interrupted, resumed, saved_at, declared, config, script=True)
    result.notes.extend(notes)
    return _with_replicas(result, baseline, resumed)


def _with_replicas(result: ResumeResult, baseline: RunTrace, resumed: RunTrace) -> ResumeResult:
    """A torchrun launch whose replicas disagree once resumed, and not uninterrupted, FAILs with them first: the
    resume set them apart (a checkpoint loaded on one rank only)."""
    if baseline.copies:
        first = baseline.copies[0]
        result.notes.append(f"the launch's ranks disagree in uninterrupted training too ({first.mismatch.path} at step "
                            f"{first.step}): check_runs_equivalent against one process names why.")
    if baseline.copies or not resumed.copies or result.outcome not in (Outcome.PASS, Outcome.FAIL):
        return result
    return ResumeResult(Outcome.FAIL, copy_violations(resumed) + result.violations, result.notes, result.config)


def _drop_unseeded_streams(baseline: RunTrace, traces: Sequence[RunTrace]) -> list[str]:
    """RNG streams that differ between the two baselines' first steps are never seeded by the script
    (nanoGPT never seeds numpy or random): they are not compared, and a note says so."""
    repeat = traces[1]
    if not baseline.steps or not repeat.steps:
        return []
    unstable = {m.path for m in compare_snapshots(baseline.steps[0].rng, repeat.steps[0].rng, resolve_comparison(None))}
    for trace in traces:
        for record in trace.steps:
            for path in unstable:
                record.rng.pop(path, None)
    if not unstable:
        return []
    return [f"not compared: {', '.join(sorted(unstable))}, which the script does not seed (they differ between "
            "two uninterrupted runs from the first step on); where the script draws from them, the loss or "
            "the state shows it."]

