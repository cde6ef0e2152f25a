"""The resume verdict: two uninterrupted baselines, the interrupted run and the resumed run, judged in order.

In observation order: what the resumed run restored (cause `not_restored`), then per resumed step the RNG
streams at the start of the step, the batch's sample IDs, the loss and the State after the step against the
baseline. What was restored is held against what the uninterrupted run had at the same point: a recipe's
State right after `load` against the State right after `save` (nothing runs between them), a script's State
at its first resumed backward or optimizer step against the baseline's at the same point (a scheduler or
handler at the top of the iteration runs in both). Recipes' and scripts' runs are judged alike (`_script`
builds the same traces).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainparity._results._result import ResumeResult
from trainparity._results._violation import Outcome, Violation
from trainparity._resume._ranks import path_rank
from trainparity._resume._trace import RunTrace, StepRecord, diff_steps
from trainparity._state._compare import EXACT, Comparison, Mismatch, compare_leaves, compare_snapshots
from trainparity._state._snapshot import state_entry


def _violation(kind: str, mismatch: Mismatch, step: int, cause: str | None, preface: str) -> Violation:
    return Violation(
        kind=kind,
        path=mismatch.path,
        message=f"{preface}\n{mismatch.message}" if preface else mismatch.message,
        step=step,
        expected=mismatch.expected,
        actual=mismatch.actual,
        cause=cause,
        rank=path_rank(mismatch.path),  # a run of several ranks names a rank's own values `path[rank r]`
    )


def _nondeterminism(
    expected: list[StepRecord], actual: list[StepRecord], comparison: Comparison, what: str
) -> Violation | None:
    for a, b in zip(expected, actual, strict=False):
        for difference in diff_steps(a, b, comparison):
            return _violation(
                "nondeterministic_baseline",
                difference.mismatch,
                a.step,
                "baseline_nondeterministic",
                f"{what} at step {a.step}: the recipe is not reproducible, so resume equivalence cannot be judged.",
            )
    return None


def _data_cause(baseline: list[StepRecord], index: int, actual: list[int | str]) -> tuple[str | None, int | str, int]:
    """Why the resumed batch differs: IDs already consumed (replayed) or from later batches (skipped).
    Named by the first differing position, else by the first sample of the batch that tells."""
    expected = baseline[index].sample_ids or []
    position = next((i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a),
                    min(len(expected), len(actual)))
    earlier = {i for record in baseline[:index] for i in record.sample_ids or []}
    later = {i for record in baseline[index + 1:] for i in record.sample_ids or []}
    belongs = set(expected)
    for at in (position, *range(len(actual))):
        # a sample of the expected batch is not what went wrong, though later epochs bring it back
        if at < len(actual) and actual[at] not in belongs:
            if actual[at] in earlier:
                return "data_replayed", actual[at], at
            if actual[at] in later:
                return "data_skipped", actual[at], at
    return None, actual[position] if position < len(actual) else expected[position], position


def _rng_causes(baseline: RunTrace, interrupted: RunTrace, resumed: RunTrace, script: bool) -> dict[str, RngCause]:
    """What is known of each RNG stream of the save: whether the resumed run restored it, and how."""
    saved, loaded = interrupted.saved, resumed.loaded
    assert saved is not None and loaded is not None, "the interrupted run saves and the resumed run loads"
    causes: dict[str, RngCause] = {}
    first = resumed.steps[0].rng if resumed.steps else {}
    fresh = baseline.steps[0].rng if baseline.steps else {}
    for path, value in saved.rng.items():
        if path in loaded.rng:
            causes[path] = RESTORED if compare_leaves(value, loaded.rng[path], EXACT) is None else (
                RngCause("not_restored", "the state the resumed run restored is not the one the checkpoint saved."
                         if script else "load() did not restore it."))
        elif script and path in first and path in fresh and compare_leaves(first[path], fresh[path], EXACT) is None:
            causes[path] = RngCause("not_restored", "the resumed run draws a fresh start's stream: at this step it "
                                    "is where an uninterrupted run's is at step 1 (the checkpoint holds no RNG state "
                                    "and the script seeds it again).")
        elif script:
            causes[path] = RngCause(None, "the checkpoint does not hold it, or the resumed script draws from it "
                                    "differently.")
    return causes


@dataclasses.dataclass(frozen=True)
class RngCause:
    """Why an RNG stream may differ after the resume: its cause code, and the sentence the report says."""

    cause: str | None
    reason: str


RESTORED = RngCause(None, "it was restored, then consumed between load() and this step (for example by a new "
                    "DataLoader iterator drawing its base seed).")
#: what a data violation says when the data pipeline drew from a stream the load had restored
DRAWN_BY_THE_DATA = (
    "{stream} was restored, then drawn differently before this batch by what produces the data (a batch prefetched "
    "before the save and lost with it, or a DataLoader or sampler rebuilt on resume that draws its order or seed "
    "from the global RNG): the data stream is what to fix, and the RNG's difference follows from it."
)


def judge_resume(
    baseline: RunTrace,
    repeat: RunTrace,
    interrupted: RunTrace,
    resumed: RunTrace,
    resume_at: int,
    comparison: Comparison,
    config: dict[str, Any],
    script: bool = False,
) -> ResumeResult:
    """The verdict on the four runs' traces. `script=True`: the runs are a script's, whose resumed State is
    taken at its first backward or optimizer step (what it restored, after whatever code ran since the load),
    and held against the baseline's at the same point of the same step; the RNG streams it restored are those
    its checkpoint code set (`torch.set_rng_state`, ...)."""
    base, again, before, after = baseline.steps, repeat.steps, interrupted.steps, resumed.steps
    for other, what in ((again, "Two uninterrupted runs differ"),
                        (before, "The interrupted run differs from the uninterrupted one before the save")):
        found = _nondeterminism(base, other, comparison, what)
        if found is not None:
            return ResumeResult(Outcome.ABSTAIN, [found], config=config,
                                reason=f"baseline not reproducible: {found.path} differs at step {found.step}")
    violations: list[Violation] = []
    notes: list[str] = []
    saved, loaded = interrupted.saved, resumed.loaded
    assert saved is not None and loaded is not None, "the interrupted run saves and the resumed run loads"

    def violation(kind: str, mismatch: Mismatch, step: int, cause: str | None, preface: str) -> Violation:
        # Where a script's framework checkpoints (Ignite's to_save, Accelerate's prepared objects): the line to change.
        held = interrupted.holders.get("data.sample_ids" if kind == "data_mismatch" else state_entry(mismatch.path))
        restoring = cause == "not_restored" or kind == "data_mismatch" and cause is not None
        return _violation(kind, mismatch, step, cause, f"{preface} {held}" if held and restoring else preface)

    # What the resumed run restored, held against what the uninterrupted run had at the same point.
    start = base[resume_at].start if script and len(base) > resume_at else None
    expected, preface = (saved.state, "The State right after load() differs from the State right after save().") \
        if start is None else (start, f"The State the resumed script restored differs from the uninterrupted run's at "
                               f"the same point (the first backward or optimizer step of step {resume_at + 1}).")
    for mismatch in compare_snapshots(expected, loaded.state, comparison):
        violations.append(violation("state_mismatch", mismatch, resume_at, "not_restored", preface))
    rng_causes = _rng_causes(baseline, interrupted, resumed, script)
    rng_first: dict[str, tuple[Violation, int]] = {}
    last_divergence = 0
    for index, record in enumerate(after, start=resume_at):
        step = record.step
        for difference in diff_steps(base[index], record, comparison):
            mismatch = difference.mismatch
            if difference.aspect == "rng":
                if mismatch.path not in rng_first:
                    known = rng_causes.get(mismatch.path, RESTORED)
                    rng_first[mismatch.path] = (
                        violation("rng_mismatch", Mismatch(mismatch.path, "Generator states are not equal.",
                                                            None, None), step, known.cause,
                                   "The RNG stream at the start of the step differs from uninterrupted training: "
                                   + known.reason),
                        len(violations),
                    )
                continue
            last_divergence = step
            if difference.aspect == "data":
                assert record.sample_ids is not None
                cause, sample, position = _data_cause(base, index, record.sample_ids)
                message = "The resumed run trained on other samples than uninterrupted training."
                # A stream restored right, then drawn by the data pipeline: the data is what to fix, so it leads.
                drawn = [path for path, (found, _) in rng_first.items() if found.step == step
                         and rng_causes.get(path, RESTORED) is RESTORED] if cause is not None else []
                if drawn:
                    message += " " + DRAWN_BY_THE_DATA.format(stream=" and ".join(drawn))
                    for path in drawn:
                        rng_first[path] = (rng_first[path][0], len(violations) + 1)
                data = violation("data_mismatch", mismatch, step, cause, message)
                violations.append(dataclasses.replace(data, sample_id=sample, position=position))
            elif difference.aspect == "mode":
                at_save, at_load = saved.modes.get(mismatch.path), loaded.modes.get(mismatch.path)
                # load() left a mode the steps since kept: the resumed run trained in it
                left = at_save is not None and at_save != at_load and mismatch.actual == at_load
                violations.append(violation(
                    "state_mismatch", mismatch, step, "not_restored" if left else None,
                    "The State's modules are in another mode (train or eval, which dropout and batch norm follow) "
                    "after the step than in uninterrupted training."
                    + (f" load() left them in {at_load!r} where the save found {at_save!r}, and no step set it "
                       "since: call model.train() after loading." if left else "")))
            elif difference.aspect == "loss":
                violations.append(violation("loss_mismatch", mismatch, step, None,
                                             "The loss differs from uninterrupted training."))
            else:
                violations.append(violation("state_mismatch", mismatch, step, None,
                                             "The State after the step differs from uninterrupted training."))
    # An RNG stream is blamed only when something diverged at or after the step it first differed.
    inserted = 0
    for path, (found, position) in sorted(rng_first.items(), key=lambda item: item[1][1]):
        assert found.step is not None
        if last_divergence >= found.step:
            violations.insert(position + inserted, found)
            inserted += 1
        else:
            notes.append(f"{path} differs from uninterrupted training from step {found.step} on, "
                         "but nothing else diverged: reported, not failed.")
    if baseline.unobserved:
        notes.append(f"not compared: {', '.join(baseline.unobserved)}: trainparity sees no state in these State "
                     "entries (no state_dict(), tensors, numbers or public attributes); give them a "
                     "state_dict()/load_state_dict() to have them checked.")
    if any(r.sample_ids is None for r in base):
        notes.append("data stream not checked: the recipe's sample_ids() returns None.")
    outcome = Outcome.FAIL if violations else Outcome.PASS
    return ResumeResult(outcome, violations, notes, config)
