"""The judgement of two runs that should train the same: step by step, in observation order, the samples of the
step, the loss, the gradients each optimizer stepped on, the State after the step. Shared by `check_equivalent`
(recipes) and `check_runs_equivalent` (scripts).

Causes are hypotheses tested against what was observed: gradients `k` times the reference's are `loss_not_scaled`,
`1/k` times `loss_scaled_twice` (as in the accumulation check); the checkpoint causes read the activation-checkpoint
regions either run entered (`CheckpointRegion`). A step's parameters and optimizer state follow from its gradients:
where they differ without a cause of their own, they carry the cause of the step's first diagnosed gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from trainparity._accumulation._diagnoses import close, norm
from trainparity._equivalent._run import EquivalentTrace
from trainparity._observe._checkpoints import CheckpointRegion
from trainparity._results._result import RunsResult
from trainparity._results._violation import JsonValue, Outcome, Violation
from trainparity._resume._trace import GRADIENTS, StepRecord
from trainparity._state._compare import EXACT, Comparison, Leaf, compare_leaves, compare_snapshots, ignored

#: a violation, the reference's leaf at its path and the candidate's -> a cause, or None
Diagnosis = Callable[[Violation, Leaf, Leaf], "str | None"]


def step_violations(expected: StepRecord, actual: StepRecord, comparison: Comparison,
                    compared: Callable[[str], bool] = lambda path: True,
                    diagnose: Diagnosis | None = None) -> list[Violation]:
    """The differences of one step, in observation order, for the paths `compared` keeps."""
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
    for mismatch in compare_snapshots(expected.state, actual.state, comparison):
        if not compared(mismatch.path):
            continue
        reference, candidate = expected.state.get(mismatch.path), actual.state.get(mismatch.path)
        if mismatch.path.startswith(GRADIENTS):
            kind = "gradient_mismatch"
            both = mismatch.path in expected.state and mismatch.path in actual.state
            message = (_missing_gradient(reference, candidate) if both else None) or (
                f"The gradients at the optimizer step differ from the reference's.\n{mismatch.message}")
        else:
            kind, message = "state_mismatch", f"The state after the step differs from the reference's.\n" \
                f"{mismatch.message}"
        violation = Violation(kind, mismatch.path, message, step=step, expected=mismatch.expected,
                              actual=mismatch.actual)
        cause = _scale_cause(reference, candidate) if kind == "gradient_mismatch" else None
        cause = cause or (diagnose(violation, reference, candidate) if diagnose is not None else None)
        found.append(dataclasses.replace(violation, cause=cause))
    # the loss and the State after the step follow from the step's gradients; a gradient has only its own cause
    step_cause = next((v.cause for v in found if v.kind == "gradient_mismatch" and v.cause is not None), None)
    return [dataclasses.replace(v, cause=step_cause) if v.cause is None and v.kind in ("loss_mismatch",
                                                                                       "state_mismatch") else v
            for v in found]


def not_reproducible(first: Sequence[StepRecord], second: Sequence[StepRecord], comparison: Comparison,
                     compared: Callable[[str], bool], config: dict[str, JsonValue]) -> RunsResult | None:
    """ABSTAIN with the first difference between two runs of the reference, or None where they agree: a FAIL may
    blame the candidate only once the reference reproduces itself."""
    for expected, actual in zip(first, second, strict=False):
        for violation in step_violations(expected, actual, comparison, compared):
            return RunsResult(Outcome.ABSTAIN, [violation], config=config, reason=(
                f"the reference is not reproducible: {violation.path} differs between two runs of it at step "
                f"{violation.step}"))
    return None


def _missing_gradient(reference: Leaf, candidate: Leaf) -> str | None:
    if isinstance(reference, torch.Tensor) and candidate is None:
        return "The parameter got no gradient at the optimizer step, where the reference's got one."
    if reference is None and isinstance(candidate, torch.Tensor):
        return "The parameter got a gradient at the optimizer step, where the reference's got none."
    return None


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


def checkpoint_cause(regions: Sequence[CheckpointRegion]) -> Diagnosis:
    """The checkpoint causes, tested against the regions either run entered."""

    def diagnose(violation: Violation, reference: Leaf, candidate: Leaf) -> str | None:
        if violation.path.startswith(GRADIENTS):
            parameter = violation.path.removeprefix(GRADIENTS)
            if (reference is None) != (candidate is None) and any(
                    r.reentrant and not r.inputs_need_grad and parameter in r.parameters for r in regions):
                return "checkpoint_without_grad"
            if any(r.drew_random and not r.preserve_rng_state for r in regions):
                return "checkpoint_rng_not_preserved"
            return None
        if any(violation.path in r.recomputed_buffers for r in regions):
            return "checkpoint_double_update"
        return None

    return diagnose


def compile_cause(reference: EquivalentTrace, candidate: EquivalentTrace) -> Diagnosis:
    """`compile_stale`: one run is compiled, the other is not, and a setting of the compiled model had changed since
    its first call by the step that differs (the eager model saw the change; the compiled code may keep what it
    captured)."""
    compiled = reference if reference.compiled else candidate
    changes = compiled.compiled_changes if bool(reference.compiled) != bool(candidate.compiled) else []

    def diagnose(violation: Violation, expected: Leaf, actual: Leaf) -> str | None:
        step = violation.step or 0
        return "compile_stale" if any(change.step <= step for change in changes) else None

    return diagnose


def evaluation_effects(reference: EquivalentTrace, candidate: EquivalentTrace,
                       violations: Sequence[Violation]) -> str | None:
    """`evaluation_changed_training`: the runs evaluated at different steps before the step that differs, and what
    the evaluation left behind is seen: random numbers drawn (the global streams differ at the start of a step), a
    mode left changed (the models' modes differ after a step), weights left changed (the step's gradients agree,
    the State after it does not). None where the runs evaluated alike or nothing of this is seen."""
    step = violations[0].step or 0
    evaluations = [[s for s in trace.evaluated if s <= step] for trace in (reference, candidate)]
    if evaluations[0] == evaluations[1]:
        return None
    seen = []
    for expected, actual in zip(reference.steps[:step], candidate.steps[:step], strict=True):
        drawn = next(compare_snapshots(expected.rng, actual.rng, EXACT), None)
        if drawn is not None:
            seen.append(f"random numbers drawn ({drawn.path} differs at the start of step {expected.step})")
            break
    for expected, actual in zip(reference.steps[:step - 1], candidate.steps[:step - 1], strict=True):
        modes = [f"{path} {mode} -> {actual.modes[path]}" for path, mode in expected.modes.items()
                 if actual.modes.get(path, mode) != mode]
        if modes:
            seen.append(f"a mode left changed ({', '.join(modes)} after step {expected.step})")
            break
    if not any(v.kind == "gradient_mismatch" for v in violations) and any(
            v.kind == "state_mismatch" for v in violations):
        seen.append(f"weights left changed (the gradients at step {step} agree, the State after it does not)")
    if not seen:
        return None
    evaluated = ", ".join(f"the {run} at {_steps(steps)}" for run, steps in zip(("reference", "candidate"),
                                                                                 evaluations, strict=True))
    return (f"The runs evaluate at different steps ({evaluated}) and the evaluation changed training: "
            f"{'; '.join(seen)}. An evaluation should draw from its own generator, restore the mode it found "
            "(model.train() after model.eval()) and the weights it swapped in.")


def _steps(steps: list[int]) -> str:
    """`no step`, `step 2`, `steps 2, 4`."""
    return f"step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}" if steps else "no step"


def configuration(reference: EquivalentTrace, candidate: EquivalentTrace) -> list[str]:
    """The paths that differ right after setup() and hold no tensor: how each recipe is configured (a
    `checkpointing` flag, transformers' `gradient_checkpointing`), not what it trains."""
    return [m.path for m in compare_snapshots(reference.initial, candidate.initial, EXACT)
            if not isinstance(reference.initial.get(m.path), torch.Tensor)
            and not isinstance(candidate.initial.get(m.path), torch.Tensor)]


def steady_settings(reference: Sequence[StepRecord], candidate: Sequence[StepRecord]) -> list[str]:
    """For two scripts, observed from their first step on: the paths that hold no tensor, keep one value through
    each run, and differ between the runs: configuration, as `configuration` finds it after a recipe's setup()."""
    if not reference or not candidate:
        return []
    first, other = reference[0].state, candidate[0].state
    return [path for path, value in first.items()
            if path in other and not isinstance(value, torch.Tensor) and not isinstance(other[path], torch.Tensor)
            and compare_leaves(value, other[path], EXACT) is not None
            and all(record.state.get(path, value) == value for record in reference)
            and all(record.state.get(path, other[path]) == other[path] for record in candidate)]


def configuration_note(paths: Sequence[str], when: str) -> list[str]:
    """The note naming configuration paths (`when`: where they were found to differ)."""
    return [f"Configuration, not compared (it differs between the two {when} and holds no tensor): "
            f"{', '.join(paths)}."] if paths else []


def judge_equivalent(reference: EquivalentTrace, candidate: EquivalentTrace, comparison: Comparison,
                     config: dict[str, JsonValue]) -> RunsResult:
    """The first step at which the candidate trains differently from the reference, or PASS; what the comparison
    ignores (`Comparison.ignore`) is passed over, the loss included."""
    configured = configuration(reference, candidate)
    configured_paths = set(configured)

    def compared(path: str) -> bool:
        return path not in configured_paths and not ignored(path, comparison.ignore)

    notes = _notes(reference, candidate, configured)
    initial = [Violation("state_mismatch", m.path, f"The State after setup() differs from the reference's: the two "
                         f"runs do not start alike.\n{m.message}", expected=m.expected, actual=m.actual)
               for m in compare_snapshots(reference.initial, candidate.initial, comparison) if compared(m.path)]
    if initial:
        return RunsResult(Outcome.FAIL, initial, notes, config)
    checkpoints, compiling = checkpoint_cause([*reference.regions, *candidate.regions]), compile_cause(reference,
                                                                                                       candidate)

    reads = [f"the {run}'s " + "; ".join(trace.cross_document.reads) for run, trace in (("reference", reference),
             ("candidate", candidate)) if trace.cross_document is not None and trace.cross_document.reads]

    def diagnose(violation: Violation, expected: Leaf, actual: Leaf) -> str | None:
        packed = "cross_document_attention" if reads else None
        return checkpoints(violation, expected, actual) or compiling(violation, expected, actual) or packed

    for expected, actual in zip(reference.steps, candidate.steps, strict=True):
        violations = step_violations(expected, actual, comparison, compared, diagnose)
        if violations:
            evaluation = evaluation_effects(reference, candidate, violations)
            if evaluation is not None:
                violations = [v if v.cause is not None else dataclasses.replace(v, cause="evaluation_changed_training")
                              for v in violations]
                notes.append(evaluation)
            if expected.step < len(reference.steps):
                notes.append(f"Steps after step {expected.step} are not judged: they start from diverged state.")
            notes += _compiled_notes(reference, candidate, expected.step)
            if reads:
                notes.append(f"Documents packed into one row read each other: {'; '.join(reads)} (a gradient probe "
                             "over the packed row). Each document's attention must stop at its start: a block-"
                             "diagonal mask from the position_ids, or the varlen kernels' cu_seq_lens.")
            return RunsResult(Outcome.FAIL, violations, notes, config)
    return RunsResult(Outcome.PASS, [], notes, config)


def _notes(reference: EquivalentTrace, candidate: EquivalentTrace, configured: list[str]) -> list[str]:
    notes = configuration_note(configured, "recipes right after setup()")
    unobserved = sorted(set(reference.unobserved) | set(candidate.unobserved))
    if unobserved:
        notes.append(f"Not compared (nothing of them can be observed): {', '.join(unobserved)}.")
    for run, trace in (("reference", reference), ("candidate", candidate)):
        if trace.compiled:
            notes.append(f"The {run}'s {', '.join(trace.compiled)} is compiled (torch.compile): compared by the "
                         "model's own parameter names, without `_orig_mod.`.")
    return notes


def _compiled_notes(reference: EquivalentTrace, candidate: EquivalentTrace, step: int) -> list[str]:
    """A compiled run that diverges from an eager one at `step`: what changed in its model since its first call, or,
    where nothing did, the dropout masks of the inductor backend."""
    if bool(reference.compiled) == bool(candidate.compiled):
        return []
    compiled = reference if reference.compiled else candidate
    changes = [f"{change.what} (at step {change.step})" for change in compiled.compiled_changes
               if change.step <= step]
    notes = [f"The compiled model changed after its first call: {'; '.join(changes)}. Compiled code keeps what it "
             "captured at its first call: a hook added later is not run (Dynamo does not guard module hooks by "
             "default). Make the change before the first compiled call, or compile again after it."] if changes else []
    return notes or ["One run is compiled and the other is not: torch.compile's default (inductor) backend draws its "
                     "own dropout masks, so with dropout active the two differ by design. Compare them with dropout "
                     "off, or compile with backend='aot_eager', which draws the eager masks."]
