"""`check_runs_equivalent`: two commands that should train the same, compared optimizer step by step.

A refactor, another launcher, or `--grad-accum 4 --batch 8` against `--grad-accum 1 --batch 32`:
the reference runs twice (ABSTAIN when the two differ), the candidate once, each observed through
the same hooks as `check_resume_script` with the gradients at each optimizer step recorded too.
Per step, in observation order: the samples of the step (as a multiset: micro-batches may cut
them differently), the loss, the gradients, the state after the step. Gradients `k` times the
reference's are `loss_not_scaled`, `1/k` times `loss_scaled_twice`, as in the accumulation check.
RNG streams are not compared: two commands may draw differently and still train the same. A command launched
by `torchrun` is observed on every rank (`_launch`): a single-process script checks against its multi-rank launch,
and replicas of the launch that disagree lead their step's violations (`grads_not_synchronized`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from trainparity._equivalent._judge import configuration_note, not_reproducible, steady_settings, step_violations
from trainparity._process import _session
from trainparity._process._options import Deadline
from trainparity._process._scratch import scratch_directory
from trainparity._results._result import RunsResult
from trainparity._results._violation import Outcome
from trainparity._resume._trace import RunTrace
from trainparity._script._hook import ScriptRun
from trainparity._script._launch import copy_violations
from trainparity._script._runs import Command, ScriptRuns, parse_command, parse_environment, run_error
from trainparity._state._compare import Comparison, ignored, resolve_comparison
from trainparity._validation import check_globs, check_int


@_session.recorded
def check_runs_equivalent(
    reference: Command,
    candidate: Command,
    *,
    steps: int,
    comparison: Comparison | None = None,
    timeout: float = 600.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    ignore: str | Sequence[str] | None = None,
) -> RunsResult:
    """Check that `candidate` trains like `reference` for `steps` optimizer steps. Never raises for a FAIL.

    Both are commands (a string split like a shell, or a list); `{workdir}` is a fresh directory
    per run. The comparison is exact unless declared: where the candidate sums the batch in
    another order (accumulation, another batch size), declare a tolerance. `ignore`: globs over State paths
    not compared (`model.checkpointing`, `ema.*`; a glob that names a path ignores what lies under it).
    """
    reference_command, candidate_command = parse_command(reference, "reference"), parse_command(candidate, "candidate")
    check_int("steps", steps, 1, "optimizer steps")
    declared = resolve_comparison(comparison)
    ignoring = check_globs(ignore, "ignore", "model.checkpointing") or ()
    deadline = Deadline.after(timeout)
    config: dict[str, Any] = {"reference": shlex.join(reference_command), "candidate": shlex.join(candidate_command),
                              "steps": steps, "comparison": declared.describe(),
                              **({"ignore": list(ignoring)} if ignoring else {})}
    with scratch_directory("trainparity-runs-") as root:
        runs = ScriptRuns(root, deadline, parse_environment(env), cwd)
        job = runs.job
        run = ScriptRun("baseline", steps, steps, 1, gradients=True)
        outcomes = runs.run([job("reference", reference_command, "reference", run),
                             job("reference (repeat)", reference_command, "repeat", run),
                             job("candidate", candidate_command, "candidate", run)])
    error = run_error(outcomes, steps, steps)
    if error is not None:
        return RunsResult.errored(error, config)
    expected, again, actual = (o.output for o in outcomes)
    return judge_runs(expected, again, actual, declared, ignoring, config)


def judge_runs(reference: RunTrace, repeat: RunTrace, candidate: RunTrace, comparison: Comparison,
               ignore: Sequence[str], config: dict[str, Any]) -> RunsResult:
    configured = set(steady_settings(reference.steps, candidate.steps))

    def compared(path: str) -> bool:
        return not ignored(path, ignore) and path not in configured

    unstable = not_reproducible(reference.steps, repeat.steps, comparison, compared, config)
    if unstable is not None:
        return unstable
    if reference.copies:
        disagreeing = copy_violations(reference)[0]
        return RunsResult(Outcome.ABSTAIN, [disagreeing], config=config, reason=(
            f"the reference's ranks disagree: {disagreeing.path} differs between ranks at step {disagreeing.step}"))
    replicas = [v for v in copy_violations(candidate) if compared(v.path)]
    compared_steps = [v for e, a in zip(reference.steps, candidate.steps, strict=False)
                      for v in step_violations(e, a, comparison, compared)]
    # a step's disagreeing replicas first: they say why the launch differs from the reference there
    violations = sorted(replicas + compared_steps, key=lambda v: v.step or 0)
    notes = configuration_note(sorted(configured), "commands at every step")
    return RunsResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes, config=config)
