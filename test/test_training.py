"""check_training: what it records per step, each verdict on its fault and its clean control, loops of other shapes,
the three assertions and the mixin, JSON, and misuse."""

from __future__ import annotations

import json
import math
import unittest
import warnings
from typing import Any

import pytest
import torch
import training_recipes as recipes

import trainparity as tp
from trainparity._preflight._training_judge import TrainingTrace, judge_training
from trainparity._preflight._training_verdicts import DEFAULT_BAND, Verdicts
from trainparity._recipe._recipe import batch_iterator
from trainparity._results._telemetry import TrainingStep, Update
from trainparity._state._rng import seed_everything

# The faulted recipes step their scheduler before their optimizer on purpose; torch warns about it.
pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals,
              pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")]
HEALTHY: dict[str, Any] = {"max_grad_norm": 20.0, "update_ratio": True, "max_skipped_steps": 0,
                           "lr_schedule": recipes.learning_rate}


def first(result: tp.Result) -> tuple[str, str, int | None, str | None]:
    violation = result.first_violation
    assert violation is not None, result.report()
    return violation.kind, violation.path, violation.step, violation.cause


def test_the_clean_loop_passes_every_verdict_and_records_each_step() -> None:
    result = tp.check_training(recipes.Fit(clip=5.0), steps=12, min_decrease=0.1, **HEALTHY)
    assert isinstance(result, tp.TrainingResult) and result.passed, result.report()
    assert [step.step for step in result.telemetry] == list(range(1, 13))
    assert len(result.losses) == 12 and all(isinstance(loss, float) for loss in result.losses)
    update = result.telemetry[0].updates[0]
    assert (update.optimizer, update.skipped, update.scale, update.nonfinite_grads) == ("optimizer", False, None, [])
    assert update.lr == [recipes.learning_rate(0)] * 2 and update.parameters == [3, 3]
    assert update.without_grad == [0, 0] and update.frozen == [0, 0]
    assert all(ratio is not None and 1e-3 < ratio < 0.1 for ratio in update.update_ratio)
    assert update.grad_norm is not None and update.clip_norm == pytest.approx(update.grad_norm)  # below max_norm
    assert result.config["window"] == 3 and result.config["update_ratio"] == list(DEFAULT_BAND)


def test_the_update_of_a_large_parameter_is_measured_on_a_sample_that_reads_like_the_whole() -> None:
    recipe = recipes.Wide()
    result = tp.check_training(recipe, steps=3)
    seed_everything(0)
    state = recipe.setup()
    with batch_iterator(recipe, state) as batches:
        for step in result.telemetry:
            before = [p.detach().clone() for p in state.model.parameters()]
            recipe.step(state, next(batches))
            changes = [(p.detach() - b).norm() for p, b in zip(state.model.parameters(), before, strict=True)]
            change = torch.stack(changes).norm()
            exact = float(change / torch.stack([b.norm() for b in before]).norm())
            assert step.updates[0].update_ratio[0] == pytest.approx(exact, rel=0.03), step.step
            assert step.updates[0].grad_norm == pytest.approx(
                float(torch.stack([p.grad.norm() for p in state.model.parameters()]).norm()), rel=1e-12)


def test_the_gradient_norm_before_and_after_clipping() -> None:
    result = tp.check_training(recipes.Fit(clip=0.5), steps=3)
    for step in result.telemetry:
        update = step.updates[0]
        assert update.clip_norm is not None and update.grad_norm is not None
        assert update.clip_norm > 0.5 and update.grad_norm == pytest.approx(0.5, rel=1e-6)
    assert result.table().splitlines()[1].split()[2:5] == ["1.987", "->", "0.5"]


def test_the_loss_decreases_and_a_loop_that_does_not_learn_is_named() -> None:
    assert tp.check_training(recipes.Fit(), steps=12, min_decrease=0.1).passed
    result = tp.check_training(recipes.Fit("lr_zero"), steps=12, min_decrease=0.1)
    assert first(result) == ("loss_not_decreasing", "loss", 12, "loss_not_decreasing")
    assert "its median over steps 10-12 is 8.131, not below 5.18 (its median over steps 1-3, 5.756" in (
        result.violations[0].message)
    assert "(optimizer 'optimizer' group 0: its learning rate is 0)" in result.violations[0].message


@pytest.mark.parametrize(("fault", "why"), [
    ("lr_zero", "its learning rate is 0"),
    ("detached_loss", "none of its 3 parameters had a gradient (.grad is None): the loss does not reach them"),
    ("frozen_model", "all 3 of its parameters have requires_grad=False: they are frozen"),
    ("no_optimizer_step", "No optimizer of the State stepped: call optimizer.step()"),
])
def test_overfitting_one_batch_fails_on_a_loop_that_cannot_learn(fault: str, why: str) -> None:
    result = tp.check_training(recipes.Fit(fault), steps=30, overfit=True)
    assert first(result) == ("not_overfitting", "loss", 30, "not_overfitting")
    assert why in result.violations[0].message


def test_overfitting_one_batch_passes_on_the_clean_loop_and_says_when() -> None:
    result = tp.check_training(recipes.Fit(), steps=30, overfit=True)
    assert result.passed, result.report()
    assert result.notes == ["On one batch repeated, the loss fell from 4.219 to 0.415 (below 0.1 of its start) at "
                            "step 20."]
    # the first batch, every time: the same loss as long as nothing is updated
    frozen = tp.check_training(recipes.Fit("lr_zero"), steps=3, overfit=True, overfit_fraction=0.5)
    assert len(set(frozen.losses)) == 1


def test_a_learning_rate_too_high_diverges_and_its_updates_are_too_large() -> None:
    result = tp.check_training(recipes.Fit("lr_too_high"), steps=3, update_ratio=True)
    assert first(result) == ("update_too_large", "optimizer.param_groups.0.update_ratio", 1, "update_too_large")
    assert result.violations[0].actual == pytest.approx(25.81, rel=1e-3)
    assert [v.path for v in result.violations] == ["optimizer.param_groups.0.update_ratio",
                                                   "optimizer.param_groups.1.update_ratio"]
    diverged = tp.check_training(recipes.Fit("lr_too_high"), steps=12, min_decrease=0.1)
    assert first(diverged)[0] == "loss_not_decreasing"


@pytest.mark.parametrize(("fault", "why"), [
    ("lr_zero", "its learning rate is 0"),
    ("detached_loss", "none of its 3 parameters had a gradient"),
    ("frozen_model", "all 3 of its parameters have requires_grad=False"),
])
def test_updates_too_small_say_why(fault: str, why: str) -> None:
    result = tp.check_training(recipes.Fit(fault), steps=2, update_ratio=(1e-4, 1.0))
    assert first(result) == ("update_too_small", "optimizer.param_groups.0.update_ratio", 1, "update_too_small")
    assert result.violations[0].actual == 0.0 and why in result.violations[0].message
    assert result.violations[0].message.endswith("\nAlso at step 2.")


def test_an_optimizer_that_never_steps_is_an_update_too_small_and_a_note() -> None:
    result = tp.check_training(recipes.Fit("no_optimizer_step"), steps=3, update_ratio=True)
    assert first(result) == ("update_too_small", "optimizer.param_groups.0.update_ratio", 3, "update_too_small")
    assert result.notes == ["Optimizer 'optimizer' never stepped in 3 calls of step()."]


def test_an_open_side_of_the_band_judges_the_other_alone() -> None:
    assert tp.check_training(recipes.Fit("lr_zero"), steps=2, update_ratio=(None, 0.1)).passed
    assert first(tp.check_training(recipes.Fit("lr_zero"), steps=2, update_ratio=(1e-6, None)))[0] == (
        "update_too_small")


def test_a_scheduler_stepped_before_the_optimizer_runs_the_schedule_one_step_ahead() -> None:
    result = tp.check_training(recipes.Fit("scheduler_before_optimizer"), steps=6, lr_schedule=recipes.learning_rate)
    assert first(result) == ("lr_mismatch", "optimizer.param_groups.0.lr", 1, "lr_mismatch")
    violation = result.violations[0]
    assert (violation.expected, violation.actual) == (pytest.approx(1e-2 / 3), pytest.approx(2e-2 / 3))
    assert "the scheduler runs one step ahead, as when scheduler.step() is called before optimizer.step()" in (
        violation.message)
    assert violation.message.endswith("\nAlso at step 2.")  # from step 3 on the warmup is over
    as_list = [recipes.learning_rate(index) for index in range(6)]
    assert first(tp.check_training(recipes.Fit("scheduler_before_optimizer"), steps=6, lr_schedule=as_list)) == (
        first(result))
    assert tp.check_training(recipes.Fit(), steps=6, lr_schedule=as_list).passed


def test_a_schedule_counted_from_one_and_one_a_step_behind() -> None:
    from_one = tp.check_training(recipes.Fit(), steps=4, lr_schedule=lambda step: recipes.learning_rate(step - 1))
    assert "runs one step ahead" in from_one.violations[0].message
    assert "(Or lr_schedule counts optimizer steps from 1: its index 0 is the first.)" in from_one.violations[0].message
    behind = tp.check_training(recipes.Fit(), steps=4, lr_schedule=lambda step: recipes.learning_rate(step + 1))
    assert "the scheduler runs one step behind" in behind.violations[0].message


def test_a_schedule_per_group_and_one_shorter_than_the_run() -> None:
    per_group = [[recipes.learning_rate(index)] * 2 for index in range(3)]
    result = tp.check_training(recipes.Fit(), steps=5, lr_schedule=per_group)
    assert result.passed, result.report()
    assert result.notes == ["lr_schedule holds fewer learning rates than optimizer 'optimizer' took steps: its "
                            "optimizer steps 4-5 were not judged."]


def test_a_gradient_norm_above_the_bound_is_judged_before_clipping() -> None:
    result = tp.check_training(recipes.Fit(clip=0.5), steps=2, max_grad_norm=1.0)
    assert first(result) == ("grad_norm_exceeded", "optimizer.grad_norm", 1, "grad_norm_exceeded")
    assert result.violations[0].actual == pytest.approx(1.987, rel=1e-3)
    assert "The loop clipped it to 0.5 before the step." in result.violations[0].message
    assert tp.check_training(recipes.Fit(clip=0.5), steps=2, max_grad_norm=20.0).passed


def test_a_nan_in_a_batch_is_named_at_the_loss_the_gradients_and_the_parameters() -> None:
    result = tp.check_training(recipes.Fit("nan_batch"), steps=4)
    assert [(v.path, v.step) for v in result.violations] == [
        ("loss", 3), ("gradients.0.weight", 3), ("parameters.0.weight", 3)]
    assert {v.cause for v in result.violations} == {"nonfinite"}
    # in the optimizer's order: the weights' group, then the biases'
    assert result.telemetry[2].nonfinite_params == ["0.weight", "2.weight", "4.weight", "0.bias", "2.bias", "4.bias"]


def test_a_gradscaler_that_skips_every_step() -> None:
    result = tp.check_training(recipes.StaticScale(), steps=4, max_skipped_steps=0)
    assert first(result) == ("skipped_updates", "scaler.scale", 1, "skipped_updates")
    assert (result.violations[0].expected, result.violations[0].actual) == (0, 4)
    assert all(step.updates[0].skipped and step.updates[0].scale == 2.0**24 for step in result.telemetry)
    allowed = tp.check_training(recipes.StaticScale(), steps=4, max_skipped_steps=3)
    assert first(allowed)[2] == 4  # the fourth skip is the one past the allowance
    assert tp.check_training(recipes.StaticScale(2.0**10), steps=4, max_skipped_steps=0).passed
    unjudged = tp.check_training(recipes.StaticScale(), steps=2)
    assert unjudged.passed and unjudged.notes == [
        "GradScaler 'scaler' skipped 2 optimizer steps (steps 1, 2): not judged (max_skipped_steps=None)."]


def test_two_optimizers_each_with_its_schedule() -> None:
    result = tp.check_training(recipes.TwoOptimizers(), steps=3, update_ratio=True,
                               lr_schedule={"first_optimizer": [0.05] * 3, "second_optimizer": lambda index: 1e-3})
    assert result.passed, result.report()
    assert [u.optimizer for u in result.telemetry[0].updates] == ["first_optimizer", "second_optimizer"]
    assert result.table().splitlines()[0].split() == ["step", "loss", "optimizer", "grad", "norm", "update/param",
                                                      "lr", "note"]
    with pytest.raises(ValueError, match=r"lr_schedule= names 'critic', not an optimizer of the State \(they are "
                                         r"'first_optimizer', 'second_optimizer'\)"):
        tp.check_training(recipes.TwoOptimizers(), steps=1, lr_schedule={"critic": [0.05]})
    # found once setup() built the State, before a step: a step that raises is never reached
    with pytest.raises(ValueError, match=r"lr_schedule= names 'critic'"):
        tp.check_training(NeverSteps(), steps=3, lr_schedule={"critic": [0.05] * 3})


class NeverSteps(recipes.TwoOptimizers):
    def step(self, state: tp.State, batch: Any) -> Any:
        raise RuntimeError("a check with a misused lr_schedule trained")


def test_accumulation_counts_optimizer_steps_for_the_schedule() -> None:
    result = tp.check_training(recipes.Accumulates(), steps=6, lr_schedule=recipes.learning_rate)
    assert result.passed, result.report()
    assert [len(step.updates) for step in result.telemetry] == [0, 1, 0, 1, 0, 1]
    assert result.table().splitlines()[1].endswith("no optimizer step")


def test_an_optimizer_that_computes_its_gradients_in_a_closure() -> None:
    result = tp.check_training(recipes.Closure(), steps=3, max_grad_norm=100.0)
    assert result.passed, result.report()
    assert all(step.updates[0].grad_norm and step.updates[0].update_ratio[0] for step in result.telemetry)


def test_an_optimizer_outside_the_state_abstains_on_what_it_needs() -> None:
    result = tp.check_training(recipes.OptimizerOutsideState(), steps=3, max_skipped_steps=0)
    assert result.outcome is tp.Outcome.ABSTAIN
    assert result.reason is not None and result.reason.startswith("the State holds no optimizer")
    assert tp.check_training(recipes.OptimizerOutsideState(), steps=12, min_decrease=0.1).passed


def test_a_step_that_returns_no_loss_abstains_on_the_loss() -> None:
    result = tp.check_training(recipes.ReturnsNothing(), steps=2, min_decrease=0.1)
    assert (result.outcome, result.reason) == (
        tp.Outcome.ABSTAIN, "step() returned no loss at step 1: return it, so that the loss can be judged")
    assert tp.check_training(recipes.ReturnsNothing(), steps=2).passed


def test_the_assertions_enable_their_verdicts() -> None:
    assert isinstance(tp.assert_loss_decreases(recipes.Fit, steps=12), tp.TrainingResult)
    with pytest.raises(AssertionError, match=r"^trainparity training check: FAIL at loss \(loss_not_decreasing, "):
        tp.assert_loss_decreases(recipes.Fit("lr_zero"), steps=12)
    assert tp.assert_overfits_one_batch(recipes.Fit, steps=30).config["overfit"] is True
    with pytest.raises(AssertionError, match=r"FAIL at loss \(not_overfitting, step 30\)"):
        tp.assert_overfits_one_batch(recipes.Fit("detached_loss"), steps=30)
    healthy = tp.assert_training_healthy(recipes.Fit, steps=4, **HEALTHY)
    assert healthy.config["max_skipped_steps"] == 0
    with pytest.raises(AssertionError, match=r"FAIL at scaler.scale \(skipped_updates, step 1\)"):
        tp.assert_training_healthy(recipes.StaticScale(), steps=2)  # no skipped updates unless allowed
    with pytest.raises(AssertionError, match=r"\n\nafter the refactoring$"):
        tp.assert_training_healthy(recipes.Fit("lr_zero"), steps=2, update_ratio=True, msg="after the refactoring")


class TestMixin(tp.TrainParityMixin, unittest.TestCase):
    def test_the_methods_report_through_the_test_case(self) -> None:
        self.assertLossDecreases(recipes.Fit, steps=12)
        self.assertOverfitsOneBatch(recipes.Fit, steps=30)
        self.assertTrainingHealthy(recipes.Fit, steps=4, update_ratio=True)
        with self.assertRaises(self.failureException):
            self.assertTrainingHealthy(recipes.Fit("frozen_model"), steps=2, update_ratio=True)
        with self.assertRaises(unittest.SkipTest):
            self.assertLossDecreases(recipes.ReturnsNothing, steps=4, abstain="skip")


def test_the_json_carries_the_telemetry() -> None:
    result = tp.check_training(recipes.Fit("nan_batch"), steps=3, update_ratio=True)
    document = json.loads(result.to_json())
    assert document["check"] == "training" and len(document["telemetry"]) == 3
    assert document["telemetry"][2]["loss"] == "nan"  # JSON has no NaN: the string, as elsewhere
    assert document["telemetry"][0]["updates"][0]["lr"] == [recipes.learning_rate(0)] * 2
    assert result.to_json() == tp.check_training(recipes.Fit("nan_batch"), steps=3, update_ratio=True).to_json()


def test_the_run_in_a_child_process_is_the_same() -> None:
    here = tp.check_training(recipes.Fit(clip=0.5), steps=3, update_ratio=True, lr_schedule=recipes.learning_rate)
    there = tp.check_training(recipes.Fit(clip=0.5), steps=3, update_ratio=True, lr_schedule=recipes.learning_rate,
                              isolation="process", timeout=120)
    assert there.config.pop("isolation") == "process" and here.config.pop("isolation") == "inprocess"
    assert (there.outcome, there.telemetry, there.config) == (here.outcome, here.telemetry, here.config)


def test_the_schedule_is_judged_in_this_process_whatever_the_isolation() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = tp.check_training(recipes.Fit, steps=2, isolation="process", lr_schedule=lambda index: 1.0,
                                   timeout=120)
    assert first(result) == ("lr_mismatch", "optimizer.param_groups.0.lr", 1, "lr_mismatch")
    with pytest.raises(TypeError, match=r"lr_schedule\(0\) must be a learning rate"):
        tp.check_training(recipes.Fit, steps=1, lr_schedule=lambda index: "0.1")
    warmup = [0.1, 0.05]
    with pytest.raises(ValueError, match=r"^lr_schedule\(2\) raised IndexError: list index out of range; "
                                         r"lr_schedule= must give the learning rate of every optimizer step"):
        tp.check_training(recipes.Fit, steps=3, lr_schedule=lambda index: warmup[index])
    # One exactly as long as the run: probing the step after the last (is the scheduler a step ahead?) is no error.
    rates = [1.0, 1.0]
    assert first(tp.check_training(recipes.Fit, steps=2, lr_schedule=lambda index: rates[index])) == (
        "lr_mismatch", "optimizer.param_groups.0.lr", 1, "lr_mismatch")


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"steps": 0}, ValueError, "steps= must be an int >= 1"),
    ({"min_decrease": 10}, ValueError, r"min_decrease= is a fraction of the first window's median loss in \[0, 1\)"),
    ({"min_decrease": "0.1"}, TypeError, "min_decrease= must be a finite number such as 0.1"),
    ({"window": 3}, ValueError, "window= sizes the windows min_decrease= compares: set min_decrease="),
    ({"min_decrease": 0.1, "window": 0}, ValueError,
     r"window= must be None \(steps // 4 calls of step\(\) per window\) or an int >= 1, got 0"),
    ({"min_decrease": 0.1, "window": 11}, ValueError, "steps= must be at least 22, got 20"),
    ({"steps": 1, "min_decrease": 0.1}, ValueError, "steps= must be at least 2, got 1"),
    ({"overfit": "yes"}, TypeError, "overfit= must be True or False"),
    ({"overfit": True, "steps": 1}, ValueError, "overfit=True judges the loss of the later steps against step 1's: "
                                                "steps= must be at least 2, got 1"),
    ({"overfit_fraction": 1.5}, ValueError, r"overfit_fraction= must be in \(0, 1\)"),
    ({"max_grad_norm": 0}, ValueError, "max_grad_norm= must be > 0"),
    ({"max_grad_norm": math.inf}, TypeError, "max_grad_norm= must be a finite number"),
    ({"update_ratio": 1e-3}, TypeError, r"update_ratio= must be \(low, high\), True for the default band"),
    ({"update_ratio": (0.1, 0.01)}, ValueError, r"update_ratio= must be \(low, high\) with 0 <= low < high"),
    ({"update_ratio": (None, None)}, ValueError, r"None leaves a side open"),
    ({"lr_schedule": 0.1}, TypeError, "lr_schedule= must be a function of the optimizer step's index"),
    ({"lr_schedule": []}, TypeError, "lr_schedule= must be a function"),
    ({"lr_schedule": [0.1, "fast"]}, TypeError, r"lr_schedule=\[1\] must be a learning rate"),
    ({"lr_schedule": {"optimizer": 0.1}}, TypeError, r"lr_schedule\['optimizer'\] must be a function"),
    ({"max_skipped_steps": -1}, ValueError, "max_skipped_steps= must be None"),
    ({"isolation": "thread"}, ValueError, "isolation"),
    ({"max_loss_growth": 1.0}, ValueError, r"max_loss_growth= is how many times its start the loss may reach, > 1"),
    ({"max_loss_growth": "100"}, TypeError, "max_loss_growth= must be a finite number"),
    ({"max_loss_growth": True}, TypeError, "max_loss_growth= must be a finite number"),
])
def test_misuse_names_the_fix_before_anything_runs(arguments: dict[str, Any], error: type[Exception],
                                                    message: str) -> None:
    with pytest.raises(error, match=message):
        tp.check_training(recipes.Fit, **arguments)


def test_a_schedule_with_a_rate_per_group_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match=r"lr_schedule\[0\] holds 3 learning rates, but optimizer 'optimizer' has 2 "
                                         r"parameter groups: give one per group, or one float for all"):
        tp.check_training(recipes.Fit, steps=1, lr_schedule=[[0.1, 0.1, 0.1]])


# -- the health assertion's defaults (issue 37): no update as large as the weights, no loss 100 times its start ------


def test_the_unbounded_health_assertion_fails_adam_at_lr_1e3() -> None:
    with pytest.raises(AssertionError, match=r"^trainparity training check: FAIL at optimizer.param_groups.0."
                                             r"update_ratio \(update_too_large, step 1\)") as failed:
        tp.assert_training_healthy(recipes.Regression(lr=1e3), steps=3)
    assert "2. loss (step 2, kind: loss_diverged, cause: loss_diverged)" in str(failed.value)
    # Each default on its own, and each turned off or changed.
    diverged = tp.check_training(recipes.Regression(lr=1e3), steps=3, max_loss_growth=100.0)
    assert first(diverged) == ("loss_diverged", "loss", 2, "loss_diverged")
    assert len(diverged.violations) == 1
    with pytest.raises(AssertionError, match=r"FAIL at loss \(loss_diverged, step 2\)"):
        tp.assert_training_healthy(recipes.Regression(lr=1e3), steps=3, update_ratio=None)
    with pytest.raises(AssertionError, match=r"FAIL at optimizer.param_groups.0.update_ratio \(update_too_large"):
        tp.assert_training_healthy(recipes.Regression(lr=1e3), steps=3, max_loss_growth=None)
    assert tp.assert_training_healthy(recipes.Regression(lr=1e3), steps=3, update_ratio=None,
                                      max_loss_growth=1e8).passed
    assert tp.assert_training_healthy(recipes.Regression(lr=1e3), steps=3, update_ratio=(None, 1e4),
                                      max_loss_growth=None).passed


def test_a_healthy_run_passes_the_defaults_with_no_bounds_given() -> None:
    result = tp.assert_training_healthy(recipes.Regression(), steps=4)
    assert result.config["update_ratio"] == [None, 1.0] and result.config["max_loss_growth"] == 100.0
    assert tp.check_training(recipes.Regression(), steps=2).config["max_loss_growth"] is None  # records only
    assert tp.assert_training_healthy(recipes.Fit(clip=5.0), steps=4).passed
    assert tp.assert_training_healthy(recipes.Regression(lr=0.1, zero_init=True), steps=3).passed


def _trace(losses: list[float | None], ratios: list[float | None] | None = None) -> TrainingTrace:
    ratios = ratios or [1e-3] * len(losses)
    return TrainingTrace({"optimizer": 1}, None, [], [TrainingStep(
        n, loss, [Update("optimizer", False, None, 1.0, None, [], [0.1], [ratio], [1], [0], [0], "w")], [])
        for n, (loss, ratio) in enumerate(zip(losses, ratios, strict=True), start=1)])


def _judged(trace: TrainingTrace, **verdicts: Any) -> tp.TrainingResult:
    arguments: dict[str, Any] = {"min_decrease": None, "window": None, "overfit": False, "overfit_fraction": 0.1,
                                 "max_grad_norm": None, "update_ratio": None, "lr_schedule": None,
                                 "max_skipped_steps": None, **verdicts}
    validated = Verdicts.validate(steps=len(trace.steps), **arguments)
    return judge_training(trace, validated.config(), validated)


@pytest.mark.parametrize(("losses", "diverged_at"), [
    ([0.5, 40.0, 49.0], None),  # 98 times its start: within 100
    ([0.5, 51.0, 2.0], 2),
    ([0.0, 0.9, 0.5], None),  # a start of about 0 counts as 0.01: the bound is 1
    ([0.0, 1.5], 2),
    ([-0.5, -3.0, 45.0], None),  # a negative start: the bound is 100 times its size, above it
    ([-0.5, -3.0, 51.0], 3),
    ([None, 0.5, 60.0], 3),  # the first loss returned is the start
    ([0.5, math.nan, 60.0], 3),  # a non-finite loss is nonfinite's, not compared
])
def test_the_growth_of_the_loss_is_judged_against_its_start(losses: list[float | None],
                                                            diverged_at: int | None) -> None:
    result = _judged(_trace(losses), max_loss_growth=100.0)
    found = [v for v in result.violations if v.kind == "loss_diverged"]
    assert [v.step for v in found] == ([] if diverged_at is None else [diverged_at]), result.report()


def test_loss_diverged_is_named_after_an_update_too_large_at_its_step_or_before_and_before_later_ones() -> None:
    at_one = _judged(_trace([0.5, 30.0, 90.0], [2.0, 0.1, 0.1]), max_loss_growth=100.0, update_ratio=(None, 1.0))
    assert [(v.kind, v.step) for v in at_one.violations] == [("update_too_large", 1), ("loss_diverged", 3)]
    later = _judged(_trace([0.5, 80.0, 9.0], [0.1, 0.1, 2.0]), max_loss_growth=10.0, update_ratio=(None, 1.0))
    assert [(v.kind, v.step) for v in later.violations] == [("loss_diverged", 2), ("update_too_large", 3)]
    assert "It followed updates" not in later.violations[0].message
    assert "It followed updates of up to 2.0 times the parameters' norm (step 1)" in at_one.violations[1].message
    nothing = _judged(_trace([None, None]), max_loss_growth=100.0)
    assert nothing.passed and "step() returned no loss" in nothing.notes[0]


def test_the_update_after_parameters_all_zero_is_not_held_to_the_upper_bound() -> None:
    # SGD with momentum from zero weights: the second update is 1.9 times the first, which is all the weights are.
    result = _judged(_trace([0.5, 0.4, 0.3], [None, 1.9, 0.66]), update_ratio=(None, 1.0))
    assert result.passed and "was not held to update_ratio's upper bound" in result.report()
    assert first(_judged(_trace([0.5, 0.4, 0.3], [0.1, 1.9, 0.66]), update_ratio=(None, 1.0)))[0] == "update_too_large"
