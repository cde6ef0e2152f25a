"""Assertion functions for pytest and plain scripts; the unittest mixin is a thin layer over them.

Each `assert_*` takes its check's arguments plus `msg=` and `abstain=`. It returns the
result on PASS; raises AssertionError carrying the report on FAIL, and on ABSTAIN unless
`abstain="skip"` (then `unittest.SkipTest`, which unittest and pytest both report as a skip);
re-raises the recipe's error on ERROR. `msg` follows the host's convention: appended to the
report (unittest: unless the TestCase's `longMessage` is False, which makes it replace the
report, as in unittest's own assertions); a callable receives the report and returns the message.
"""

from __future__ import annotations

import builtins
import contextvars
import dataclasses
import functools
import os
import unittest
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NoReturn, TypeAlias, TypeVar

from torch.utils.data import DataLoader

from trainparity._accumulation import check_accumulation
from trainparity._accumulation._run import SplitFunction
from trainparity._coverage import check_coverage
from trainparity._coverage._check import Policies, RankBatches
from trainparity._equivalent import check_equivalent
from trainparity._parallel import check_parallel
from trainparity._preflight import (
    check_frozen,
    check_mixed_precision,
    check_optimizer_coverage,
    check_train_mode,
    check_training,
)
from trainparity._preflight._training_verdicts import Band, Schedule
from trainparity._process._options import Isolation
from trainparity._process._session import Precision
from trainparity._recipe._reference import RecipeSpec
from trainparity._results._result import (
    AccumulationResult,
    CoverageResult,
    FrozenResult,
    MixedPrecisionResult,
    OptimizerCoverageResult,
    ParallelResult,
    Result,
    ResumeResult,
    RunsResult,
    TrainingResult,
    TrainModeResult,
    WorkerRandomnessResult,
)
from trainparity._results._violation import ChildError, Outcome
from trainparity._resume import check_resume
from trainparity._script import Command, check_resume_script, check_runs_equivalent
from trainparity._state._compare import Comparison
from trainparity._validation import check_argument, check_choice
from trainparity._workers import check_worker_randomness

# Failures point at the user's line, not ours: unittest skips frames of modules that set this,
# pytest frames that set `__tracebackhide__`.
__unittest = True

R = TypeVar("R", bound=Result)
Message: TypeAlias = str | Callable[[str], str] | None
Abstain: TypeAlias = Literal["fail", "skip"]
ABSTAIN_MODES = ("fail", "skip")


class RecipeError(Exception):
    """The recipe failed in a child process: it raised, hung past the timeout, or its process died.

    `error` holds the details (phase, exit code or signal, the child's traceback). When the
    child raised a builtin exception, the raised error is also an instance of that type, so
    `except ValueError` still catches a ValueError raised by the recipe.
    """

    def __init__(self, message: str, error: ChildError) -> None:
        super().__init__(message)
        self.error = error


@functools.cache
def _recipe_error_type(name: str) -> type[RecipeError]:
    builtin = getattr(builtins, name, None)
    if not (isinstance(builtin, type) and issubclass(builtin, Exception)) or issubclass(builtin, RecipeError):
        return RecipeError
    try:
        return type(name, (RecipeError, builtin), {"__module__": "trainparity"})
    except TypeError:  # builtins with their own instance layout (OSError...) cannot be mixed in
        return RecipeError


def raise_for_error(result: Result) -> NoReturn:
    """Re-raise the user's error: the live exception in-process, or a RecipeError carrying the child's traceback."""
    __tracebackhide__ = True
    if result.exception is not None:
        raise result.exception
    assert result.error is not None
    error = result.error
    cls = _recipe_error_type(error.exc_type) if error.kind == "raised" and error.exc_type else RecipeError
    raise cls(result.report(), error)


def _skip(reason: str) -> None:
    raise unittest.SkipTest(reason)


@dataclasses.dataclass(frozen=True)
class Host:
    """How the framework running an assertion reports: the unittest mixin passes its TestCase's ways."""

    failure: type[BaseException] = AssertionError
    skip: Callable[[str], object] = _skip
    #: unittest's `longMessage`: False makes a string `msg` replace the report
    long_message: bool = True


PLAIN = Host()
#: the host of the assertion running now; None: a plain function's (pytest, scripts)
HOST: contextvars.ContextVar[Host | None] = contextvars.ContextVar("trainparity_host", default=None)


def validate_options(msg: object, abstain: object) -> None:
    check_choice("abstain", abstain, ABSTAIN_MODES)
    check_argument(msg is None or isinstance(msg, str) or callable(msg),
                   f"msg= must be a string or a callable taking the report, got {type(msg).__name__}")


def _message(result: Result, msg: Message, host: Host) -> str:
    report = result.report()
    if msg is None:
        return report
    if callable(msg):
        return msg(report)
    return f"{report}\n\n{msg}" if host.long_message else msg


def assert_passed(result: R, *, msg: Message = None, abstain: Abstain = "fail") -> R:
    """Assert on a result you already have: the rule every assertion applies to its check's result."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    check_argument(isinstance(result, Result), f"expected a trainparity result, got {type(result).__name__}")
    if result.outcome is Outcome.PASS:
        return result
    if result.outcome is Outcome.ERROR:
        raise_for_error(result)
    host = HOST.get() or PLAIN
    if result.outcome is Outcome.ABSTAIN and abstain == "skip":
        host.skip(f"trainparity {result.check} check abstained: {result.reason}")
        return result
    raise host.failure(_message(result, msg, host))


def assert_resume_equivalent(
    recipe: RecipeSpec,
    *,
    steps: int = 6,
    resume_at: int | None = None,
    comparison: Comparison | None = None,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    world_size: int = 1,
    resume_world_size: int | None = None,
    backend: str = "gloo",
    precision: Precision | None = None,
    ignore: str | Sequence[str] | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> ResumeResult:
    """`tp.check_resume(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)  # before the check runs: a misspelt option costs no training
    result = check_resume(recipe, steps=steps, resume_at=resume_at, comparison=comparison, seed=seed,
                          isolation=isolation, timeout=timeout, world_size=world_size,
                          resume_world_size=resume_world_size, backend=backend, precision=precision, ignore=ignore)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_resume_script_equivalent(
    command: Command,
    resume_command: Command,
    *,
    steps: int = 6,
    resume_at: int = 3,
    comparison: Comparison | None = None,
    timeout: float = 600.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> ResumeResult:
    """`tp.check_resume_script(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_resume_script(command, resume_command, steps=steps, resume_at=resume_at, comparison=comparison,
                                 timeout=timeout, env=env, cwd=cwd)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_runs_equivalent(
    reference: Command,
    candidate: Command,
    *,
    steps: int,
    comparison: Comparison | None = None,
    timeout: float = 600.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    ignore: str | Sequence[str] | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> RunsResult:
    """`tp.check_runs_equivalent(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_runs_equivalent(reference, candidate, steps=steps, comparison=comparison, timeout=timeout,
                                   env=env, cwd=cwd, ignore=ignore)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_equivalent(
    reference: RecipeSpec,
    candidate: RecipeSpec,
    *,
    steps: int = 4,
    precision: Precision | None = None,
    comparison: Comparison | None = None,
    seed: int = 0,
    ignore: str | Sequence[str] | None = None,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> RunsResult:
    """`tp.check_equivalent(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_equivalent(reference, candidate, steps=steps, precision=precision, comparison=comparison,
                              seed=seed, ignore=ignore, isolation=isolation, timeout=timeout)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_accumulation_equivalent(
    recipe: RecipeSpec,
    *,
    microbatches: int | Sequence[int] = 4,
    cycles: int = 2,
    comparison: Comparison | None = None,
    seed: int = 0,
    split: SplitFunction | None = None,
    precision: Precision | None = None,
    disable_dropout: bool = True,
    batch_dependent: Literal["fail", "eval"] = "fail",
    isolation: Isolation | None = None,
    timeout: float | None = None,
    ignore: str | Sequence[str] | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> AccumulationResult:
    """`tp.check_accumulation(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_accumulation(recipe, microbatches=microbatches, cycles=cycles, comparison=comparison, seed=seed,
                                split=split, precision=precision, disable_dropout=disable_dropout,
                                batch_dependent=batch_dependent, isolation=isolation, timeout=timeout, ignore=ignore)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_coverage(
    ranks: RankBatches,
    *,
    policy: Policies,
    sample_ids: Callable[[Any], Any] | None = None,
    max_violations: int | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> CoverageResult:
    """`tp.check_coverage(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_coverage(ranks, policy=policy, sample_ids=sample_ids, max_violations=max_violations,
                            timeout=timeout)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_parallel_equivalent(
    recipe: RecipeSpec,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    steps: int = 3,
    comparison: Comparison | None = None,
    seed: int = 0,
    precision: Precision | None = None,
    timeout: float | None = None,
    isolation: Isolation | None = None,
    ignore: str | Sequence[str] | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> ParallelResult:
    """`tp.check_parallel(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_parallel(recipe, world_size=world_size, backend=backend, steps=steps, comparison=comparison,
                            seed=seed, precision=precision, timeout=timeout, isolation=isolation, ignore=ignore)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_optimizer_coverage(
    recipe: RecipeSpec,
    *,
    steps: int = 1,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> OptimizerCoverageResult:
    """`tp.check_optimizer_coverage(...)` as an assertion: the result on PASS, AssertionError with the report
    otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_optimizer_coverage(recipe, steps=steps, seed=seed, isolation=isolation, timeout=timeout)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_mixed_precision_safe(
    recipe: RecipeSpec,
    *,
    steps: int = 4,
    max_skipped_steps: int | None = None,
    allow_float32: str | Sequence[str] | None = None,
    max_float32_share: float = 0.0,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> MixedPrecisionResult:
    """`tp.check_mixed_precision(...)` as an assertion: the result on PASS, AssertionError with the report
    otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_mixed_precision(recipe, steps=steps, max_skipped_steps=max_skipped_steps,
                                   allow_float32=allow_float32, max_float32_share=max_float32_share, seed=seed,
                                   isolation=isolation, timeout=timeout)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_frozen(
    recipe: RecipeSpec,
    *,
    frozen: str | list[str] | tuple[str, ...] | None = None,
    steps: int = 2,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> FrozenResult:
    """`tp.check_frozen(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_frozen(recipe, frozen=frozen, steps=steps, seed=seed, isolation=isolation, timeout=timeout)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_train_mode(
    recipe: RecipeSpec,
    *,
    steps: int = 3,
    eval_modules: str | list[str] | tuple[str, ...] | None = None,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> TrainModeResult:
    """`tp.check_train_mode(...)` as an assertion: the result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_train_mode(recipe, steps=steps, eval_modules=eval_modules, seed=seed, isolation=isolation,
                              timeout=timeout)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_worker_randomness(
    loader: DataLoader[Any],
    *,
    epochs: int = 2,
    batches: int | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> WorkerRandomnessResult:
    """`tp.check_worker_randomness(...)` as an assertion: the result on PASS, AssertionError with the report
    otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_worker_randomness(loader, epochs=epochs, batches=batches, timeout=timeout)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_loss_decreases(
    recipe: RecipeSpec,
    *,
    steps: int = 20,
    min_decrease: float = 0.1,
    window: int | None = None,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> TrainingResult:
    """`tp.check_training(recipe, min_decrease=..., window=...)` as an assertion: the median loss of the last
    `window` steps (default steps // 4) is below the first window's by `min_decrease` of it, and nothing is
    non-finite. The result on PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_training(recipe, steps=steps, seed=seed, isolation=isolation, timeout=timeout,
                            min_decrease=min_decrease, window=window)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_overfits_one_batch(
    recipe: RecipeSpec,
    *,
    steps: int = 100,
    overfit_fraction: float = 0.1,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> TrainingResult:
    """`tp.check_training(recipe, overfit=True, ...)` as an assertion: trained `steps` times on the recipe's first
    batch, the loss falls below `overfit_fraction` of its value at step 1, and nothing is non-finite. The result on
    PASS, AssertionError with the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_training(recipe, steps=steps, seed=seed, isolation=isolation, timeout=timeout, overfit=True,
                            overfit_fraction=overfit_fraction)
    return assert_passed(result, msg=msg, abstain=abstain)


def assert_training_healthy(
    recipe: RecipeSpec,
    *,
    steps: int = 20,
    max_grad_norm: float | None = None,
    update_ratio: Band | bool | None = (None, 1.0),
    lr_schedule: Schedule | Mapping[str, Schedule] | None = None,
    max_skipped_steps: int = 0,
    max_loss_growth: float | None = 100.0,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
    msg: Message = None,
    abstain: Abstain = "fail",
) -> TrainingResult:
    """`tp.check_training(recipe, max_skipped_steps=0, update_ratio=(None, 1.0), max_loss_growth=100.0, ...)` as an
    assertion: nothing non-finite, no step skipped by the GradScaler (beyond `max_skipped_steps`), no update as large
    as the parameters it changes (`update_too_large` above `update_ratio`'s upper bound 1; True for the band
    (1e-5, 1e-1), a (low, high) of your own, None: not judged), no loss above 100 times its start (`loss_diverged`;
    None: not judged), and the bounds given: `max_grad_norm`, `lr_schedule`. The result on PASS, AssertionError with
    the report otherwise."""
    __tracebackhide__ = True
    validate_options(msg, abstain)
    result = check_training(recipe, steps=steps, seed=seed, isolation=isolation, timeout=timeout,
                            max_grad_norm=max_grad_norm, update_ratio=update_ratio, lr_schedule=lr_schedule,
                            max_skipped_steps=max_skipped_steps, max_loss_growth=max_loss_growth)
    return assert_passed(result, msg=msg, abstain=abstain)
