"""The assertion functions, the mixin over them, and results that cannot be misread."""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import unittest
from collections.abc import Callable
from typing import Any, NamedTuple

import mode_recipes
import preflight_recipes
import pytest
import test_accumulation_recipes as accumulation_recipes

import trainparity as tp
from trainparity._process import _session

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

HERE = pathlib.Path(__file__).parent
FAILING = {0: [[0, 1]], 1: [[1, 2]]}  # sample 1 twice, sample 3 never
UNIVERSE = tp.ExactlyOnce(range(4))

#: each assertion function and the check it asserts
PAIRS: list[tuple[Callable[..., Any], Callable[..., Any]]] = [
    (tp.assert_resume_equivalent, tp.check_resume),
    (tp.assert_accumulation_equivalent, tp.check_accumulation),
    (tp.assert_coverage, tp.check_coverage),
    (tp.assert_parallel_equivalent, tp.check_parallel),
    (tp.assert_optimizer_coverage, tp.check_optimizer_coverage),
    (tp.assert_mixed_precision_safe, tp.check_mixed_precision),
    (tp.assert_resume_script_equivalent, tp.check_resume_script),
    (tp.assert_runs_equivalent, tp.check_runs_equivalent),
    (tp.assert_equivalent, tp.check_equivalent),
    (tp.assert_worker_randomness, tp.check_worker_randomness),
]
METHODS = {
    tp.assert_resume_equivalent: tp.TestCase.assertResumeEquivalent,
    tp.assert_accumulation_equivalent: tp.TestCase.assertAccumulationEquivalent,
    tp.assert_coverage: tp.TestCase.assertCoverage,
    tp.assert_parallel_equivalent: tp.TestCase.assertParallelEquivalent,
    tp.assert_optimizer_coverage: tp.TestCase.assertOptimizerCoverage,
    tp.assert_mixed_precision_safe: tp.TestCase.assertMixedPrecisionSafe,
    tp.assert_resume_script_equivalent: tp.TestCase.assertResumeScriptEquivalent,
    tp.assert_runs_equivalent: tp.TestCase.assertRunsEquivalent,
    tp.assert_equivalent: tp.TestCase.assertEquivalent,
    tp.assert_worker_randomness: tp.TestCase.assertWorkerRandomness,
}


@pytest.mark.parametrize(("assertion", "check"), PAIRS)
def test_an_assertion_takes_its_checks_arguments_plus_msg_and_abstain(
    assertion: Callable[..., Any], check: Callable[..., Any]
) -> None:
    check_signature, signature = inspect.signature(check, eval_str=True), inspect.signature(assertion, eval_str=True)
    *own, msg, abstain = signature.parameters.values()
    assert own == list(check_signature.parameters.values())
    assert (msg.name, msg.default, msg.kind) == ("msg", None, inspect.Parameter.KEYWORD_ONLY)
    assert (abstain.name, abstain.default, abstain.kind) == ("abstain", "fail", inspect.Parameter.KEYWORD_ONLY)
    assert signature.return_annotation == check_signature.return_annotation


@pytest.mark.parametrize("assertion", list(METHODS))
def test_a_mixin_method_is_its_assertion_function_with_self(assertion: Callable[..., Any]) -> None:
    method = METHODS[assertion]
    self_parameter, *parameters = inspect.signature(method).parameters.values()
    assert self_parameter.name == "self"
    assert parameters == list(inspect.signature(assertion).parameters.values())
    assert method.__doc__ == assertion.__doc__


class Call(NamedTuple):
    """A mixin method's arguments: the recipe (or data) and keywords."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = {}


#: each check's mixin method with a call that passes, one that fails (and a text of its report) and one that abstains
#: (and a text of its reason); the check's name, as the session hears it
MIXIN_TABLE = [
    pytest.param("assertAccumulationEquivalent", "accumulation",
                 Call((accumulation_recipes.MLP,), {"comparison": accumulation_recipes.TOLERANCE}),
                 Call((accumulation_recipes.NotScaled,), {"comparison": accumulation_recipes.TOLERANCE}),
                 "cause: loss_not_scaled",
                 Call((accumulation_recipes.NoisyStep,), {"comparison": accumulation_recipes.TOLERANCE}),
                 "draws random numbers", id="accumulation"),
    pytest.param("assertCoverage", "coverage", Call(({0: [[0, 1]], 1: [[2, 3]]},), {"policy": UNIVERSE}),
                 Call((FAILING,), {"policy": UNIVERSE}), "First violation: coverage.cross_rank_duplicate",
                 Call(({0: [[0]]},), {"policy": tp.ExactlyOnce(None)}), "the universe", id="coverage"),
    pytest.param("assertOptimizerCoverage", "optimizer_coverage", Call((preflight_recipes.MLP,)),
                 Call((preflight_recipes.HeadNotOptimized,)), "(param_not_optimized, step 0)",
                 Call((preflight_recipes.NoOptimizer,)),
                 "holds no optimizer", id="optimizer_coverage"),
    pytest.param("assertMixedPrecisionSafe", "mixed_precision", Call((preflight_recipes.Amp,), {"steps": 2}),
                 Call((preflight_recipes.UpdateMissing,)), "(scaler_update_missing, step 1)",
                 Call((preflight_recipes.NoOptimizer,)),
                 "holds no optimizer", id="mixed_precision"),
    pytest.param("assertFrozen", "frozen", Call((mode_recipes.HoldsEveryParameter,)),
                 Call((mode_recipes.BackboneInTrainMode,)), "(frozen_module_in_train_mode, step 1)",
                 Call((mode_recipes.NothingFrozen,)), "nothing is frozen",
                 id="frozen"),
    pytest.param("assertTrainMode", "train_mode", Call((mode_recipes.FrozenBackbone,), {"eval_modules": "backbone"}),
                 Call((mode_recipes.EvalInSetup,), {"steps": 1}), "(module_left_in_eval, step 1)",
                 Call((mode_recipes.NoForward,)), "no forward pass of a module of the State ran",
                 id="train_mode"),
]


@pytest.mark.parametrize(("method", "check", "passing", "failing", "failure", "abstaining", "reason"), MIXIN_TABLE)
def test_each_mixin_method_returns_a_pass_fails_a_fail_and_skips_an_abstain_on_request(
        method: str, check: str, passing: Call, failing: Call, failure: str, abstaining: Call, reason: str) -> None:
    """The mixin of every check, one table: the session hears the check once; a FAIL is the case's
    failureException with the report; an ABSTAIN fails, or raises unittest.SkipTest with its reason under
    abstain="skip"."""
    assertion = getattr(tp.TestCase(), method)
    heard: list[tp.Result] = []
    _session.add_listener(heard.append)
    try:
        result = assertion(*passing.args, **passing.kwargs)
    finally:
        _session.remove_listener(heard.append)
    assert result.passed, result.report()
    assert [r.check for r in heard] == [check]
    with pytest.raises(AssertionError, match=re.escape(failure)):
        assertion(*failing.args, **failing.kwargs)
    with pytest.raises(AssertionError, match="ABSTAIN"):
        assertion(*abstaining.args, **abstaining.kwargs)
    with pytest.raises(unittest.SkipTest, match=re.escape(reason)):
        assertion(*abstaining.args, **abstaining.kwargs, abstain="skip")


def test_pass_returns_the_result() -> None:
    result = tp.assert_coverage({0: [[0, 1]], 1: [[2, 3]]}, policy=UNIVERSE)
    assert isinstance(result, tp.CoverageResult) and result.passed


def test_fail_raises_assertion_error_whose_first_line_names_the_first_violation() -> None:
    with pytest.raises(AssertionError) as caught:
        tp.assert_coverage(FAILING, policy=UNIVERSE)
    message = str(caught.value)
    assert message == tp.check_coverage(FAILING, policy=UNIVERSE).report()
    assert message.splitlines()[0] == (
        "trainparity coverage check: FAIL at coverage.cross_rank_duplicate (epoch 0, rank 0, sample 1)"
    )


def test_msg_is_appended_and_a_callable_receives_the_report() -> None:
    report = tp.check_coverage(FAILING, policy=UNIVERSE).report()
    with pytest.raises(AssertionError) as caught:
        tp.assert_coverage(FAILING, policy=UNIVERSE, msg="after the sampler refactoring")
    assert str(caught.value) == f"{report}\n\nafter the sampler refactoring"
    with pytest.raises(AssertionError) as caught:
        tp.assert_coverage(FAILING, policy=UNIVERSE, msg=lambda text: text.upper())
    assert str(caught.value) == report.upper()


def test_abstain_fails_unless_skipped_with_unittest_skiptest() -> None:
    with pytest.raises(AssertionError, match="^trainparity coverage check: ABSTAIN\n"):
        tp.assert_coverage(FAILING, policy=tp.ExactlyOnce(None))
    with pytest.raises(unittest.SkipTest, match="trainparity coverage check abstained: ExactlyOnce: the universe"):
        tp.assert_coverage(FAILING, policy=tp.ExactlyOnce(None), abstain="skip")


def test_error_reraises_the_users_exception() -> None:
    with pytest.raises(KeyError, match="idx"):
        tp.assert_coverage({0: [{"id": 0}]}, policy=UNIVERSE, sample_ids=lambda batch: batch["idx"])


def test_options_are_checked_before_the_check_runs() -> None:
    def never(batch: object) -> object:
        raise AssertionError("the check ran")

    with pytest.raises(TypeError, match="msg= must be a string or a callable taking the report, got int"):
        tp.assert_coverage({0: [[0]]}, policy=UNIVERSE, sample_ids=never, msg=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="abstain= must be 'fail' or 'skip', got 'ignore'"):
        tp.assert_coverage({0: [[0]]}, policy=UNIVERSE, sample_ids=never, abstain="ignore")  # type: ignore[arg-type]


class MixinConventions(tp.TestCase):
    def test_msg_follows_the_report_under_long_message(self) -> None:
        with self.assertRaises(AssertionError) as caught:
            self.assertCoverage(FAILING, policy=UNIVERSE, msg="mine")
        self.assertTrue(str(caught.exception).startswith("trainparity coverage check: FAIL at "))
        self.assertTrue(str(caught.exception).endswith("\n\nmine"))

    def test_a_callable_msg_receives_the_report(self) -> None:
        with self.assertRaisesRegex(AssertionError, "^PREFIX trainparity coverage check: FAIL at "):
            self.assertCoverage(FAILING, policy=UNIVERSE, msg=lambda report: "PREFIX " + report)

    def test_assert_train_parity_on_a_result_you_have(self) -> None:
        passed = tp.check_coverage({0: [[0, 1]], 1: [[2, 3]]}, policy=UNIVERSE)
        self.assertIs(self.assertTrainParity(passed), passed)
        with self.assertRaisesRegex(AssertionError, "\n\nsample 3 was never read$"):
            self.assertTrainParity(tp.check_coverage(FAILING, policy=UNIVERSE), msg="sample 3 was never read")


class ShortMessages(tp.TrainParityMixin, unittest.TestCase):
    longMessage = False

    class Failure(Exception):
        pass

    failureException = Failure

    def test_msg_replaces_the_report_without_long_message(self) -> None:
        with self.assertRaises(self.Failure) as caught:
            self.assertCoverage(FAILING, policy=UNIVERSE, msg="mine")
        self.assertEqual(str(caught.exception), "mine")

    def test_skip_goes_through_the_test_case(self) -> None:
        with self.assertRaises(unittest.SkipTest):
            self.assertCoverage(FAILING, policy=tp.ExactlyOnce(None), abstain="skip")


def test_a_result_has_no_truth_value() -> None:
    result = tp.check_coverage(FAILING, policy=UNIVERSE)
    with pytest.raises(TypeError, match=r"no truth value \(it is FAIL\): test `result.passed`, or assert with "
                                        r"tp.assert_coverage, which raises"):
        bool(result)
    with pytest.raises(TypeError):
        assert result  # the mistake this prevents: a FAIL that passes


def test_repr_is_one_informative_line() -> None:
    assert repr(tp.check_coverage(FAILING, policy=UNIVERSE)) == (
        "<CoverageResult FAIL at coverage.cross_rank_duplicate (epoch 0, rank 0, sample 1), 2 violations>"
    )
    assert repr(tp.check_coverage({0: [[0, 1]], 1: [[2, 3]]}, policy=UNIVERSE)) == "<CoverageResult PASS>"
    assert repr(tp.check_coverage(FAILING, policy=tp.ExactlyOnce(None))).startswith(
        "<CoverageResult ABSTAIN: ExactlyOnce: the universe is unknown")
    failed = tp.Violation("state_mismatch", "scheduler.last_epoch", "m", step=3, cause="not_restored")
    many = tp.ResumeResult(tp.Outcome.FAIL, [failed] * 66)
    assert repr(many) == "<ResumeResult FAIL at scheduler.last_epoch (not_restored, step 3), 66 violations>"
    assert repr(tp.ResumeResult(tp.Outcome.FAIL, [failed])).endswith(", 1 violation>")
    assert "\n" not in repr(tp.ResumeResult(tp.Outcome.ERROR, reason="first\nsecond"))


def test_session_defaults_apply_where_an_argument_is_left_at_none() -> None:
    def isolation(result: tp.Result) -> object:
        return result.config["isolation"]

    from resume_recipes import ResumeRecipe

    _session.set_defaults(_session.Defaults(isolation="inprocess", timeout=30.0, precision="native"))
    try:
        assert isolation(tp.check_resume(ResumeRecipe, steps=2)) == "inprocess"
        assert isolation(tp.check_resume(ResumeRecipe, steps=2, isolation="process")) == "process"
        assert _session.timeout(None) == 30.0 and _session.timeout(5) == 5.0
        assert _session.precision(None) == "native" and _session.precision("float64") == "float64"
        # a check that cannot run in-process keeps its own default
        assert _session.isolation(None, "process", runs=("process", "spawn")) == "process"
    finally:
        _session.set_defaults(_session.BUILTIN)
    assert isolation(tp.check_resume(ResumeRecipe, steps=2, isolation="inprocess")) == "inprocess"
    assert _session.isolation(None, "inprocess") == "inprocess" and _session.timeout(None) == 120.0


def test_listeners_hear_each_check_once_not_the_checks_it_runs_itself() -> None:
    heard: list[tp.Result] = []

    @_session.recorded
    def outer() -> tp.CoverageResult:
        tp.check_coverage(FAILING, policy=UNIVERSE)  # a check run by a check is part of it
        return tp.check_coverage({0: [[0, 1]], 1: [[2, 3]]}, policy=UNIVERSE)

    _session.add_listener(heard.append)
    try:
        direct = tp.check_coverage(FAILING, policy=UNIVERSE)
        nested = outer()
    finally:
        _session.remove_listener(heard.append)
    assert heard == [direct, nested]


FRAMES_TEST = '''
import unittest
import trainparity as tp

def test_plain():
    tp.assert_coverage({0: [[0]], 1: [[0]]}, policy=tp.ExactlyOnce(range(2)))

class TestMixin(tp.TestCase):
    def test_mixin(self):
        self.assertCoverage({0: [[0]], 1: [[0]]}, policy=tp.ExactlyOnce(range(2)))

if __name__ == "__main__":
    unittest.main()
'''


def _run(args: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_failures_point_at_the_users_line_under_pytest(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_frames.py").write_text(FRAMES_TEST)
    done = _run(["-m", "pytest", "-p", "no:cacheprovider", "-rf", "test_frames.py"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "trainparity/_" not in done.stdout, done.stdout  # no frame of ours is shown
    assert done.stdout.count("test_frames.py:6: AssertionError") == 1, done.stdout
    assert done.stdout.count("test_frames.py:10: AssertionError") == 1, done.stdout
    summary = done.stdout.split("short test summary info", 1)[1]
    headline = "AssertionError: trainparity coverage check: FAIL at coverage.cross_rank_duplicate (epoch 0, rank 1"
    assert summary.count(headline) == 2, summary


def test_failures_point_at_the_users_line_under_unittest(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_frames.py").write_text(FRAMES_TEST)
    done = _run(["-m", "unittest", "test_frames"], tmp_path)
    assert done.returncode == 1, done.stderr
    traceback = done.stderr.split("Traceback (most recent call last):", 1)[1].split("AssertionError:", 1)[0]
    assert textwrap.dedent(traceback).strip().splitlines() == [
        f'File "{tmp_path / "test_frames.py"}", line 10, in test_mixin',
        "  self.assertCoverage({0: [[0]], 1: [[0]]}, policy=tp.ExactlyOnce(range(2)))",
    ]
