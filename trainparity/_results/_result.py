"""Results: what every check returns, its violations ordered, rendered by the report module."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NoReturn, Self, cast

from trainparity._records import RecordError, read
from trainparity._results._report import (
    Document,
    Recorded,
    brief_location,
    kind_counts,
    read_json,
    render_json,
    render_text,
)
from trainparity._results._telemetry import TrainingStep, render_table
from trainparity._results._violation import ChildError, JsonValue, Outcome, Violation, json_safe

#: check name -> its result type, for `Result.from_json` (filled as the types are defined)
_TYPES: dict[str, type[Result]] = {}
#: a check's name in the JSON of an older trainparity -> its name now, whose result type reads it
RENAMED_CHECKS = {"data_parallel": "parallel"}  # round 3's tp.check_data_parallel, now tp.check_parallel


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
    #: for a result read by `from_json`: the trainparity version and environment its JSON was written with
    recorded: Recorded | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    #: the JSON fields a result type adds to the common ones (`_json_extra`)
    json_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, *, check: str | None = None, assertion: str | None = None, **kwargs: Any) -> None:
        """`class CoverageResult(Result, check="coverage", assertion="tp.assert_coverage")`: the result type of a
        check, which `Result.from_json` reads back by its check's name."""
        super().__init_subclass__(**kwargs)
        if check is not None:
            cls.check = check
        if assertion is not None:
            cls.assertion = assertion
        if "check" in cls.__dict__:  # a type that names its own check; a subclass that keeps its parent's is not one
            if cls.check in _TYPES:
                raise TypeError(f"{cls.__name__} and {_TYPES[cls.check].__name__} both name the check {cls.check!r}:"
                                " Result.from_json could not tell which to read")
            _TYPES[cls.check] = cls

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
        return kind_counts(self.violations)

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS

    def report(self) -> str:
        """Stable, ASCII, human-readable text: the form expecttest snapshots."""
        return render_text(self)

    def to_json(self, *, include_environment: bool = False) -> str:
        """Deterministic JSON (sorted keys, schema_version, trainparity_version).

        No PIDs, timings or absolute paths unless `include_environment=True`: then the environment the check ran
        in (for a result read by `from_json`, the one its JSON recorded, or null).
        """
        return render_json(self, include_environment=include_environment, extra=self._json_extra())

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """The result `to_json()` wrote, read back: its `to_json()` is the text read (with `include_environment=True`
        too, where the text has the environment), its `report()` the report of the result that wrote it.

        On `tp.Result` it returns the type of the check the JSON names (a `tp.ResumeResult`, ...); on a result type
        it refuses another check's JSON. The JSON of a check since renamed (round 3's "data_parallel") reads to the
        type of its new name (a `tp.ParallelResult`), whose `to_json()` and report name the check by its new name.
        `exception` is None (the live exception stayed in its process). Raises ValueError naming what is wrong with
        text not written by `to_json()`, and for the schema of a newer trainparity.
        """
        document = read_json(text)
        kind = _TYPES.get(RENAMED_CHECKS.get(document.check, document.check))
        if kind is None:
            raise ValueError(f"not a trainparity result's JSON: unknown check {document.check!r} (this trainparity "
                             f"knows {', '.join(sorted(_TYPES))})")
        if not issubclass(kind, cls):
            raise ValueError(f"the JSON is a {kind.check} check's result ({kind.__name__}), not a "
                             f"{cls.__name__}: read it with tp.Result.from_json or tp.{kind.__name__}.from_json")
        unknown = sorted(set(document.extra) - set(kind.json_fields))
        missing = [name for name in kind.json_fields if name not in document.extra]
        if unknown or missing:
            raise ValueError(f"not a trainparity result's JSON: a {kind.__name__} " + " and ".join(
                ([f"has no field {', '.join(map(repr, unknown))}"] if unknown else [])
                + ([f"lacks {', '.join(map(repr, missing))}"] if missing else [])))
        return cast(Self, kind._from_document(document))

    @classmethod
    def _from_document(cls, document: Document) -> Result:
        result = cls(document.outcome, document.violations, document.notes, document.config, document.reason,
                     document.error, **cls._read_extra(document.extra))
        result.recorded = document.recorded
        return result

    def _json_extra(self) -> dict[str, JsonValue]:
        """The JSON of this result type's own fields (`json_fields`), besides the common ones."""
        return {}

    @classmethod
    def _read_extra(cls, extra: dict[str, JsonValue]) -> dict[str, Any]:
        """`_json_extra`'s inverse: the JSON of `json_fields` as keyword arguments of the result's constructor."""
        return {}

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


class ResumeResult(Result, check="resume",
                   assertion="tp.assert_resume_equivalent (or tp.assert_resume_script_equivalent)"):
    """The result of `tp.check_resume` and `tp.check_resume_script`."""


class AccumulationResult(Result, check="accumulation", assertion="tp.assert_accumulation_equivalent"):
    """The result of `tp.check_accumulation`."""


class CoverageResult(Result, check="coverage", assertion="tp.assert_coverage"):
    """The result of `tp.check_coverage`."""


class ParallelResult(Result, check="parallel", assertion="tp.assert_parallel_equivalent"):
    """The result of `tp.check_parallel`."""


class OptimizerCoverageResult(Result, check="optimizer_coverage", assertion="tp.assert_optimizer_coverage"):
    """The result of `tp.check_optimizer_coverage`."""


class MixedPrecisionResult(Result, check="mixed_precision", assertion="tp.assert_mixed_precision_safe"):
    """The result of `tp.check_mixed_precision`."""


class RunsResult(Result, check="runs_equivalent", assertion="tp.assert_equivalent (tp.assert_runs_equivalent for "
                 "commands)"):
    """The result of `tp.check_equivalent` (two recipes) and of `tp.check_runs_equivalent` (two commands)."""


class FrozenResult(Result, check="frozen", assertion="tp.assert_frozen"):
    """The result of `tp.check_frozen`."""


class TrainModeResult(Result, check="train_mode", assertion="tp.assert_train_mode"):
    """The result of `tp.check_train_mode`."""


class WorkerRandomnessResult(Result, check="worker_randomness", assertion="tp.assert_worker_randomness"):
    """The result of `tp.check_worker_randomness`."""


@dataclasses.dataclass(repr=False)
class TrainingResult(Result):
    """`check_training`'s result: the verdicts, and what the run recorded per call of `step()` (`telemetry`), which
    `table()` renders and the JSON carries."""

    check: ClassVar[str] = "training"
    assertion: ClassVar[str] = "tp.assert_training_healthy, tp.assert_loss_decreases or tp.assert_overfits_one_batch"
    json_fields: ClassVar[tuple[str, ...]] = ("telemetry",)

    telemetry: list[TrainingStep] = dataclasses.field(default_factory=list)

    @property
    def losses(self) -> list[float | None]:
        """The loss each call of `step()` returned, in order."""
        return [step.loss for step in self.telemetry]

    def table(self) -> str:
        """The run, one row per optimizer step: loss, gradient norm (before -> after clipping), ||update|| /
        ||parameters|| and learning rate per parameter group, skipped steps and non-finite values."""
        return render_table(self.telemetry)

    def _json_extra(self) -> dict[str, JsonValue]:
        return {"telemetry": [json_safe(step) for step in self.telemetry]}

    @classmethod
    def _read_extra(cls, extra: dict[str, JsonValue]) -> dict[str, Any]:
        steps = extra["telemetry"]
        if not isinstance(steps, list):
            raise ValueError(f"not a trainparity result's JSON: 'telemetry' must be a list, got {steps!r}")
        try:
            telemetry = [read(TrainingStep, step, f"telemetry[{i}]", json=True) for i, step in enumerate(steps)]
        except RecordError as error:
            raise ValueError(f"not a trainparity result's JSON: {error}") from error
        return {"telemetry": telemetry}
