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
import itertools
from collections.abc import Iterator
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


#: where a violation stands in the report: (resumed step, or -1 for what was restored; slot within the step; the
#: order it was found in). Slots within a step follow observation order, but for an RNG stream that the data
#: pipeline drew: its data violation leads, the stream follows.
OrderKey = tuple[int, int, int]
RNG_SLOT, DATA_SLOT, DRAWN_RNG_SLOT, AFTER_DATA_SLOT = range(4)


@dataclasses.dataclass
class _Judgement:
    """The four runs and what the judgement has found so far, as (order key, violation) pairs sorted once."""

    baseline: RunTrace
    interrupted: RunTrace
    resumed: RunTrace
    resume_at: int
    comparison: Comparison
    script: bool
    found: list[tuple[OrderKey, Violation]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: the first step at which each RNG stream differs, with the violation that would blame it there
    rng_first: dict[str, tuple[OrderKey, Violation]] = dataclasses.field(default_factory=dict)
    last_divergence: int = 0
    #: the order in which the judgement found its violations: the last part of every order key
    sequence: Iterator[int] = dataclasses.field(default_factory=itertools.count)

    def add(self, step_key: int, slot: int, violation: Violation) -> None:
        self.found.append(((step_key, slot, next(self.sequence)), violation))

    def violation(self, kind: str, mismatch: Mismatch, step: int, cause: str | None, preface: str) -> Violation:
        """`_violation`, naming where a script's framework checkpoints (Ignite's to_save, Accelerate's prepared
        objects) when the violation is about restoring: the line to change."""
        held = self.interrupted.holders.get("data.sample_ids" if kind == "data_mismatch"
                                            else state_entry(mismatch.path))
        restoring = cause == "not_restored" or kind == "data_mismatch" and cause is not None
        return _violation(kind, mismatch, step, cause, f"{preface} {held}" if held and restoring else preface)

    def restored(self) -> None:
        """What the resumed run restored, held against what the uninterrupted run had at the same point."""
        saved, loaded = self.interrupted.saved, self.resumed.loaded
        assert saved is not None and loaded is not None, "the interrupted run saves and the resumed run loads"
        base = self.baseline.steps
        start = base[self.resume_at].start if self.script and len(base) > self.resume_at else None
        expected, preface = (saved.state, "The State right after load() differs from the State right after save().") \
            if start is None else (start, "The State the resumed script restored differs from the uninterrupted run's "
                                   f"at the same point (the first backward or optimizer step of step "
                                   f"{self.resume_at + 1}).")
        for mismatch in compare_snapshots(expected, loaded.state, self.comparison):
            self.add(-1, AFTER_DATA_SLOT, self.violation("state_mismatch", mismatch, self.resume_at, "not_restored",
                                                         preface))

    def resumed_steps(self) -> None:
        """Each resumed step against the baseline's, in observation order (`diff_steps`)."""
        rng_causes = _rng_causes(self.baseline, self.interrupted, self.resumed, self.script)
        for index, record in enumerate(self.resumed.steps, start=self.resume_at):
            for difference in diff_steps(self.baseline.steps[index], record, self.comparison):
                if difference.aspect == "rng":
                    self._rng(difference.mismatch.path, record.step, rng_causes)
                    continue
                self.last_divergence = record.step
                if difference.aspect == "data":
                    self._data(difference.mismatch, index, record, rng_causes)
                elif difference.aspect == "mode":
                    self._mode(difference.mismatch, record.step)
                else:
                    kind, preface = ("loss_mismatch", "The loss differs from uninterrupted training.") \
                        if difference.aspect == "loss" else \
                        ("state_mismatch", "The State after the step differs from uninterrupted training.")
                    self.add(record.step, AFTER_DATA_SLOT,
                             self.violation(kind, difference.mismatch, record.step, None, preface))

    def _rng(self, path: str, step: int, rng_causes: dict[str, RngCause]) -> None:
        if path in self.rng_first:
            return
        known = rng_causes.get(path, RESTORED)
        found = self.violation("rng_mismatch", Mismatch(path, "Generator states are not equal.", None, None), step,
                               known.cause, "The RNG stream at the start of the step differs from uninterrupted "
                               "training: " + known.reason)
        self.rng_first[path] = ((step, RNG_SLOT, next(self.sequence)), found)

    def _data(self, mismatch: Mismatch, index: int, record: StepRecord, rng_causes: dict[str, RngCause]) -> None:
        assert record.sample_ids is not None
        cause, sample, position = _data_cause(self.baseline.steps, index, record.sample_ids)
        message = "The resumed run trained on other samples than uninterrupted training."
        # A stream restored right, then drawn by the data pipeline: the data is what to fix, so it leads.
        drawn = [path for path, (key, _) in self.rng_first.items() if key[0] == record.step
                 and rng_causes.get(path, RESTORED) is RESTORED] if cause is not None else []
        if drawn:
            message += " " + DRAWN_BY_THE_DATA.format(stream=" and ".join(drawn))
            for path in drawn:
                key, found = self.rng_first[path]
                self.rng_first[path] = ((key[0], DRAWN_RNG_SLOT, key[2]), found)
        data = self.violation("data_mismatch", mismatch, record.step, cause, message)
        self.add(record.step, DATA_SLOT, dataclasses.replace(data, sample_id=sample, position=position))

    def _mode(self, mismatch: Mismatch, step: int) -> None:
        saved, loaded = self.interrupted.saved, self.resumed.loaded
        assert saved is not None and loaded is not None
        at_save, at_load = saved.modes.get(mismatch.path), loaded.modes.get(mismatch.path)
        # load() left a mode the steps since kept: the resumed run trained in it
        left = at_save is not None and at_save != at_load and mismatch.actual == at_load
        self.add(step, AFTER_DATA_SLOT, self.violation(
            "state_mismatch", mismatch, step, "not_restored" if left else None,
            "The State's modules are in another mode (train or eval, which dropout and batch norm follow) after the "
            "step than in uninterrupted training."
            + (f" load() left them in {at_load!r} where the save found {at_save!r}, and no step set it since: call "
               "model.train() after loading." if left else "")))

    def rng_blamed(self) -> None:
        """An RNG stream is blamed only when something diverged at or after the step it first differed; else a note."""
        for path, (key, found) in sorted(self.rng_first.items(), key=lambda item: item[1][0]):
            if self.last_divergence >= key[0]:
                self.found.append((key, found))
            else:
                self.notes.append(f"{path} differs from uninterrupted training from step {key[0]} on, but nothing "
                                  "else diverged: reported, not failed.")

    def unchecked_notes(self) -> None:
        if self.baseline.unobserved:
            self.notes.append(f"not compared: {', '.join(self.baseline.unobserved)}: trainparity sees no state in "
                              "these State entries (no state_dict(), tensors, numbers or public attributes); give them "
                              "a state_dict()/load_state_dict() to have them checked.")
        if any(r.sample_ids is None for r in self.baseline.steps):
            self.notes.append("data stream not checked: the recipe's sample_ids() returns None.")


def _abstention(baseline: RunTrace, repeat: RunTrace, interrupted: RunTrace, comparison: Comparison,
                config: dict[str, Any]) -> ResumeResult | None:
    """ABSTAIN when the uninterrupted runs differ, or the interrupted one before its save: nothing can be judged."""
    for other, what in ((repeat.steps, "Two uninterrupted runs differ"),
                        (interrupted.steps, "The interrupted run differs from the uninterrupted one before the save")):
        found = _nondeterminism(baseline.steps, other, comparison, what)
        if found is not None:
            return ResumeResult(Outcome.ABSTAIN, [found], config=config,
                                reason=f"baseline not reproducible: {found.path} differs at step {found.step}")
    return None


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
    abstained = _abstention(baseline, repeat, interrupted, comparison, config)
    if abstained is not None:
        return abstained
    judgement = _Judgement(baseline, interrupted, resumed, resume_at, comparison, script)
    judgement.restored()
    judgement.resumed_steps()
    judgement.rng_blamed()
    judgement.unchecked_notes()
    violations = [violation for _, violation in sorted(judgement.found, key=lambda pair: pair[0])]
    return ResumeResult(Outcome.FAIL if violations else Outcome.PASS, violations, judgement.notes, config)
