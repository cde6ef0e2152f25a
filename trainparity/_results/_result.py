"""Results: what every check returns, its violations ordered, rendered by the report module."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import ClassVar, NoReturn, Self

from trainparity._results._report import brief_location, render_json, render_text
from trainparity._results._telemetry import TrainingStep, render_table
from trainparity._results._violation import ChildError, JsonValue, Outcome, Violation


@dataclasses.dataclass
class Result:
    """The common shape of every check's result.

    `violations` holds everything found, in observation order; `notes` holds what the
    report should say but does not fail the check (a skipped phase, an RNG stream that
    was not restored but changed nothing); `config` the check's declared parameters.
    """

    check: ClassVar[str] = "check"
    #: the assertion that raises with this result's report (named when a result is used as a bool)
    assertion: ClassVar[str] = "the check's assertion function"

    outcome: Outcome
    violations: list[Violation] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    config: dict[str, JsonValue] = dataclasses.field(default_factory=dict)
    #: one line saying why, for ABSTAIN and ERROR
    reason: str | None = None
    error: ChildError | None = None
    #: the live exception when the user's code ran in this process (isolation="inprocess")
    exception: BaseException | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def errored(cls, error: ChildError, config: dict[str, JsonValue], exception: BaseException | None = None) -> Self:
        """The ERROR result for a run that raised, hung or died; the reason is the error's headline."""
        return cls(Outcome.ERROR, config=config, reason=error.headline().splitlines()[0], error=error,
                   exception=exception)

    @property
    def first_violation(self) -> Violation | None:
        return self.violations[0] if self.violations else None

    @property
    def counts(self) -> dict[str, int]:
        """How many violations of each kind were found."""
        return dict(sorted(Counter(v.kind for v in self.violations).items()))

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS

    def report(self) -> str:
        """Stable, ASCII, human-readable text: the form expecttest snapshots."""
        return render_text(self)

    def to_json(self, *, include_environment: bool = False) -> str:
        """Deterministic JSON (sorted keys, schema_version, trainparity_version).

        No PIDs, timings or absolute paths unless `include_environment=True`.
        """
        return render_json(self, include_environment=include_environment)

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        """One line: `<ResumeResult FAIL at scheduler.last_epoch (not_restored, step 3), 66 violations>`."""
        name, first = type(self).__name__, self.first_violation
        if self.outcome is Outcome.FAIL:
            where = f" at {brief_location(first)}" if first is not None else ""
            count = len(self.violations)
            return f"<{name} FAIL{where}, {count} violation{'' if count == 1 else 's'}>"
        reason = f": {self.reason.splitlines()[0]}" if self.reason else ""
        return f"<{name} {self.outcome.value}{reason}>"

    def __bool__(self) -> NoReturn:
        # `assert result` would pass on a FAIL: a result has no truth value.
        raise TypeError(
            f"a trainparity {type(self).__name__} has no truth value (it is {self.outcome.value}): test "
            f"`result.passed`, or assert with {self.assertion}, which raises with the report"
        )


class ResumeResult(Result):
    check: ClassVar[str] = "resume"
    assertion: ClassVar[str] = "tp.assert_resume_equivalent (or tp.assert_resume_script_equivalent)"


class AccumulationResult(Result):
    check: ClassVar[str] = "accumulation"
    assertion: ClassVar[str] = "tp.assert_accumulation_equivalent"


class CoverageResult(Result):
    check: ClassVar[str] = "coverage"
    assertion: ClassVar[str] = "tp.assert_coverage"


class DataParallelResult(Result):
    check: ClassVar[str] = "data_parallel"
    assertion: ClassVar[str] = "tp.assert_data_parallel_equivalent"


class OptimizerCoverageResult(Result):
    check: ClassVar[str] = "optimizer_coverage"
    assertion: ClassVar[str] = "tp.assert_optimizer_coverage"


class MixedPrecisionResult(Result):
    check: ClassVar[str] = "mixed_precision"
    assertion: ClassVar[str] = "tp.assert_mixed_precision_safe"


class RunsResult(Result):
    check: ClassVar[str] = "runs_equivalent"
    assertion: ClassVar[str] = "tp.assert_runs_equivalent"


class FrozenResult(Result):
    check: ClassVar[str] = "frozen"
    assertion: ClassVar[str] = "tp.assert_frozen"


class TrainModeResult(Result):
    check: ClassVar[str] = "train_mode"
    assertion: ClassVar[str] = "tp.assert_train_mode"


class WorkerRandomnessResult(Result):
    check: ClassVar[str] = "worker_randomness"
    assertion: ClassVar[str] = "tp.assert_worker_randomness"


@dataclasses.dataclass(repr=False)
class TrainingResult(Result):
    """`check_training`'s result: the verdicts, and what the run recorded per call of `step()` (`telemetry`), which
    `table()` renders and the JSON carries."""

    check: ClassVar[str] = "training"
    assertion: ClassVar[str] = "tp.assert_training_healthy, tp.assert_loss_decreases or tp.assert_overfits_one_batch"

    telemetry: list[TrainingStep] = dataclasses.field(default_factory=list)

    @property
    def losses(self) -> list[float | None]:
        """The loss each call of `step()` returned, in order."""
        return [step.loss for step in self.telemetry]

    def table(self) -> str:
        """The run, one row per optimizer step: loss, gradient norm (before -> after clipping), ||update|| /
        ||parameters|| and learning rate per parameter group, skipped steps and non-finite values."""
        return render_table(self.telemetry)

    def to_json(self, *, include_environment: bool = False) -> str:
        return render_json(self, include_environment=include_environment,
                           extra={"telemetry": [step.to_json() for step in self.telemetry]})
