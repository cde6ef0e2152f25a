"""`check_runs_equivalent`: two commands that should train the same, compared optimizer step by step.

A refactor, another launcher, or `--grad-accum 4 --batch 8` against `--grad-accum 1 --batch 32`:
the reference runs twice (ABSTAIN when the two differ), the candidate once, each observed through
the same hooks as `check_resume_script` with the gradients at each optimizer step recorded too.
Per step, in observation order: the samples of the step (as a multiset: micro-batches may cut
them differently), the loss, the gradients, the state after the step. Gradients `k` times the
reference's are `loss_not_scaled`, `1/k` times `loss_scaled_twice`, as in the accumulation check.
RNG streams are not compared: two commands may draw differently and still train the same.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping
from typing import Any

import torch

from trainparity._accumulation._diagnoses import close, norm
from trainparity._process import _session
from trainparity._process._options import Deadline
from trainparity._process._scratch import scratch_directory
from trainparity._results._result import RunsResult
from trainparity._results._violation import Outcome, Violation
from trainparity._resume._trace import RunTrace, StepRecord
from trainparity._script._hook import ScriptRun
from trainparity._script._runs import Command, ScriptRuns, parse_command, parse_environment, run_error
from trainparity._state._compare import Comparison, Leaf, compare_leaves, compare_snapshots, resolve_comparison
from trainparity._validation import check_int

GRADIENTS = "gradients."


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
) -> RunsResult:
    """Check that `candidate` trains like `reference` for `steps` optimizer steps. Never raises for a FAIL.

    Both are commands (a string split like a shell, or a list); `{workdir}` is a fresh directory
    per run. The comparison is exact unless declared: where the candidate sums the batch in
    another order (accumulation, another batch size), declare a tolerance.
    """
    reference_command, candidate_command = parse_command(reference, "reference"), parse_command(candidate, "candidate")
    check_int("steps", steps, 1, "optimizer steps")
    declared = resolve_comparison(comparison)
    deadline = Deadline.after(timeout)
    config: dict[str, Any] = {"reference": shlex.join(reference_command), "candidate": shlex.join(candidate_command),
                              "steps": steps, "comparison": declared.describe()}
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
    return judge_runs(expected, again, actual, declared, config)


def judge_runs(reference: RunTrace, repeat: RunTrace, candidate: RunTrace, comparison: Comparison,
               config: dict[str, Any]) -> RunsResult:
    for first, second in zip(reference.steps, repeat.steps, strict=False):
        for violation in _step_violations(first, second, comparison):
            return RunsResult(Outcome.ABSTAIN, [violation], config=config, reason=(
                f"the reference is not reproducible: {violation.path} differs between two runs of it at step "
                f"{violation.step}"))
    violations = [v for e, a in zip(reference.steps, candidate.steps, strict=False)
                  for v in _step_violations(e, a, comparison)]
    return RunsResult(Outcome.FAIL if violations else Outcome.PASS, violations, config=config)


def _step_violations(expected: StepRecord, actual: StepRecord, comparison: Comparison) -> list[Violation]:
    step = expected.step
    found = []
    if expected.sample_ids is not None and actual.sample_ids is not None and \
            sorted(map(str, expected.sample_ids)) != sorted(map(str, actual.sample_ids)):
        found.append(Violation("data_mismatch", "data.sample_ids", "The step trained on other samples than the "
                               "reference's step.", step=step, expected=list(expected.sample_ids),
                               actual=list(actual.sample_ids)))
    if expected.loss is not None and actual.loss is not None:
        loss = compare_leaves(expected.loss, actual.loss, comparison)
        if loss is not None:
            found.append(Violation("loss_mismatch", "loss", f"The step's loss differs from the reference's.\n"
                                   f"{loss.message}", step=step, expected=loss.expected, actual=loss.actual))
    mismatches = list(compare_snapshots(expected.state, actual.state, comparison))
    cause = next((c for m in mismatches if m.path.startswith(GRADIENTS)
                  for c in [_scale_cause(expected.state.get(m.path), actual.state.get(m.path))]), None)
    found = [dataclasses.replace(v, cause=cause) if v.kind == "loss_mismatch" else v for v in found]
    for mismatch in mismatches:
        gradient = mismatch.path.startswith(GRADIENTS)
        what = "gradients at the optimizer step" if gradient else "state after the step"
        found.append(Violation("gradient_mismatch" if gradient else "state_mismatch", mismatch.path,
                               f"The {what} differ from the reference's.\n{mismatch.message}", step=step,
                               expected=mismatch.expected, actual=mismatch.actual, cause=cause))
    return found


def _scale_cause(expected: Leaf, actual: Leaf) -> str | None:
    """`loss_not_scaled` when the gradients are k times the reference's (k >= 2), `loss_scaled_twice` at 1/k."""
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)) or not norm(expected):
        return None
    ratio = norm(actual) / norm(expected)
    if round(ratio) >= 2 and close(expected * round(ratio), actual):
        return "loss_not_scaled"
    if ratio and round(1 / ratio) >= 2 and close(actual * round(1 / ratio), expected):
        return "loss_scaled_twice"
    return None
