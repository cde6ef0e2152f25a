"""The unittest veneer: turn check results into assertions.

The `check_*` functions are the core; the mixin only asserts on their results, the way
expecttest's TestCase is a thin layer over its functions.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import expecttest

from trainparity._accumulation import check_accumulation
from trainparity._coverage import check_coverage
from trainparity._data_parallel import check_data_parallel
from trainparity._result import ChildError, Outcome, Result
from trainparity._resume import check_resume

# Failures point at the user's line, not ours (unittest and pytest both honour these).
__unittest = True

R = TypeVar("R", bound=Result)
Message = str | Callable[[str], str] | None
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


def raise_for_error(result: Result) -> None:
    """Re-raise the user's error: the live exception in-process, or a RecipeError carrying the child's traceback."""
    if result.exception is not None:
        raise result.exception
    assert result.error is not None
    error = result.error
    cls = _recipe_error_type(error.exc_type) if error.kind == "raised" and error.exc_type else RecipeError
    raise cls(result.report(), error)


def _validate_options(msg: object, abstain: object) -> None:
    if abstain not in ABSTAIN_MODES:
        raise ValueError(f"abstain= must be 'fail' or 'skip', got {abstain!r}")
    if not (msg is None or isinstance(msg, str) or callable(msg)):
        raise TypeError(f"msg= must be a string or a callable taking the report, got {type(msg).__name__}")


def _render(result: Result, msg: Message) -> str:
    report = result.report()
    if msg is None:
        return report
    if callable(msg):
        return msg(report)
    return msg


class TrainParityMixin:
    """Assertions over trainparity checks, for any `unittest.TestCase` subclass.

    Each `assert*` takes its check's arguments plus `msg=` (a string replaces the report, a
    callable receives it) and `abstain=` ("fail" or "skip"). It returns the result on PASS;
    raises AssertionError with the report on FAIL, and on ABSTAIN unless abstain="skip"
    (then the test is skipped with the reason); re-raises the recipe's error on ERROR.
    """

    if TYPE_CHECKING:  # provided by unittest.TestCase; defining them here would shadow it
        failureException: type[BaseException]

        def skipTest(self, reason: Any) -> None: ...

    def assertTrainParity(self, result: R, *, msg: Message = None, abstain: str = "fail") -> R:
        """Assert on a result you already have (the shared rule every assert* follows)."""
        __tracebackhide__ = True
        _validate_options(msg, abstain)
        if not isinstance(result, Result):
            raise TypeError(f"expected a trainparity result, got {type(result).__name__}")
        if result.outcome is Outcome.PASS:
            return result
        if result.outcome is Outcome.ERROR:
            raise_for_error(result)
        if result.outcome is Outcome.ABSTAIN and abstain == "skip":
            self.skipTest(f"trainparity {result.check} check abstained: {result.reason}")
            return result
        raise self.failureException(_render(result, msg))

    def _assert_check(self, check: Callable[[], R], msg: Message, abstain: str) -> R:
        __tracebackhide__ = True
        _validate_options(msg, abstain)  # before the check runs: a misspelt option costs no training
        return self.assertTrainParity(check(), msg=msg, abstain=abstain)

    def assertResumeEquivalent(
        self, recipe: object, *, msg: Message = None, abstain: str = "fail", **kwargs: Any
    ) -> Result:
        """`tp.check_resume(recipe, **kwargs)` as an assertion."""
        __tracebackhide__ = True
        return self._assert_check(lambda: check_resume(recipe, **kwargs), msg, abstain)

    def assertAccumulationEquivalent(
        self, recipe: object, *, msg: Message = None, abstain: str = "fail", **kwargs: Any
    ) -> Result:
        """`tp.check_accumulation(recipe, **kwargs)` as an assertion."""
        __tracebackhide__ = True
        return self._assert_check(lambda: check_accumulation(recipe, **kwargs), msg, abstain)

    def assertCoverage(
        self, ranks: Any, *, policy: Any, sample_ids: Any = None, msg: Message = None, abstain: str = "fail",
        **kwargs: Any
    ) -> Result:
        """`tp.check_coverage(ranks, policy=..., sample_ids=..., **kwargs)` as an assertion."""
        __tracebackhide__ = True
        return self._assert_check(
            lambda: check_coverage(ranks, policy=policy, sample_ids=sample_ids, **kwargs), msg, abstain
        )

    def assertDataParallelEquivalent(
        self, recipe: object, *, msg: Message = None, abstain: str = "fail", **kwargs: Any
    ) -> Result:
        """`tp.check_data_parallel(recipe, **kwargs)` as an assertion."""
        __tracebackhide__ = True
        return self._assert_check(lambda: check_data_parallel(recipe, **kwargs), msg, abstain)


class TestCase(expecttest.TestCase, TrainParityMixin):
    """`expecttest.TestCase` (for `assertExpectedInline`) with the trainparity assertions."""
