"""The unittest veneer: the assertion functions as TestCase methods.

Each method is the assertion function of the same check, run with the TestCase's
`failureException`, `skipTest` and `longMessage`, the way expecttest's TestCase is a thin
layer over its functions.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import expecttest

from trainparity._assertions import (
    HOST,
    Host,
    assert_accumulation_equivalent,
    assert_coverage,
    assert_equivalent,
    assert_frozen,
    assert_loss_decreases,
    assert_mixed_precision_safe,
    assert_optimizer_coverage,
    assert_overfits_one_batch,
    assert_parallel_equivalent,
    assert_passed,
    assert_resume_equivalent,
    assert_resume_script_equivalent,
    assert_runs_equivalent,
    assert_train_mode,
    assert_training_healthy,
    assert_worker_randomness,
)
from trainparity._deprecated import renamed

# Failures point at the user's line, not ours (unittest and pytest both honour these).
__unittest = True

P = ParamSpec("P")
R = TypeVar("R")


def _method(assertion: Callable[P, R]) -> Callable[Concatenate[TrainParityMixin, P], R]:
    """`assertion` as a method that reports through the TestCase (its signature and docs, `self` first)."""

    @functools.wraps(assertion)
    def method(self: TrainParityMixin, /, *args: P.args, **kwargs: P.kwargs) -> R:
        __tracebackhide__ = True
        token = HOST.set(self._trainparity_host())
        try:
            return assertion(*args, **kwargs)
        finally:
            HOST.reset(token)

    signature = inspect.signature(assertion)
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_parameter, *signature.parameters.values()]
    )
    del method.__wrapped__  # inspect would otherwise show the function's signature, without self
    return method


class TrainParityMixin:
    """Assertions over trainparity checks, for any `unittest.TestCase` subclass.

    Each `assert*` is the `tp.assert_*` function of its check: the check's arguments plus
    `msg=` (appended to the report, or replacing it when `longMessage` is False; a callable
    receives the report) and `abstain=` ("fail" or "skip"). It returns the result on PASS;
    raises the TestCase's `failureException` with the report on FAIL, and on ABSTAIN unless
    abstain="skip" (then the test is skipped with the reason); re-raises the recipe's error on ERROR.
    """

    if TYPE_CHECKING:  # provided by unittest.TestCase; defining them here would shadow it
        failureException: type[BaseException]
        longMessage: bool

        def skipTest(self, reason: Any) -> None: ...

    def _trainparity_host(self) -> Host:
        return Host(self.failureException, self.skipTest, self.longMessage)

    assertTrainParity = _method(assert_passed)
    assertResumeEquivalent = _method(assert_resume_equivalent)
    assertResumeScriptEquivalent = _method(assert_resume_script_equivalent)
    assertRunsEquivalent = _method(assert_runs_equivalent)
    assertEquivalent = _method(assert_equivalent)
    assertAccumulationEquivalent = _method(assert_accumulation_equivalent)
    assertCoverage = _method(assert_coverage)
    assertParallelEquivalent = _method(assert_parallel_equivalent)
    #: round 3's name: warns once (DeprecationWarning), at the test's line
    assertDataParallelEquivalent = _method(renamed(assert_parallel_equivalent, "self.assertDataParallelEquivalent",
                                                   "self.assertParallelEquivalent", stacklevel=2))
    assertOptimizerCoverage = _method(assert_optimizer_coverage)
    assertMixedPrecisionSafe = _method(assert_mixed_precision_safe)
    assertFrozen = _method(assert_frozen)
    assertTrainMode = _method(assert_train_mode)
    assertLossDecreases = _method(assert_loss_decreases)
    assertOverfitsOneBatch = _method(assert_overfits_one_batch)
    assertTrainingHealthy = _method(assert_training_healthy)
    assertWorkerRandomness = _method(assert_worker_randomness)


class TestCase(expecttest.TestCase, TrainParityMixin):
    """`expecttest.TestCase` (for `assertExpectedInline`) with the trainparity assertions."""
