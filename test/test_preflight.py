"""The preflight checks: optimizer coverage and mixed precision, a clean recipe and one per diagnosis."""

from __future__ import annotations

import json
import math
from typing import Any

import preflight_recipes as recipes
import pytest
import torch

import trainparity as tp
from trainparity._preflight._mixed_precision import PrecisionTrace
from trainparity._preflight._optimizer_coverage import CoverageTrace
from trainparity._process import _session
from trainparity._process._wire import dump, load
from trainparity._records import read

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def found(result: tp.Result) -> list[tuple[str, str, int | None, str | None]]:
    return [(v.kind, v.path, v.step, v.cause) for v in result.violations]


# -- optimizer coverage ----------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", [recipes.MLP, recipes.GPT, recipes.LearnedTemperature])
def test_clean_recipes_pass(recipe: type[tp.Recipe]) -> None:
    result = tp.check_optimizer_coverage(recipe)
    assert isinstance(result, tp.OptimizerCoverageResult) and result.passed, result.report()
    assert result.config == {"recipe": f"preflight_recipes:{recipe.__name__}", "steps": 1, "seed": 0,
                             "isolation": "inprocess"}


def test_tied_weights_are_one_parameter_not_a_parameter_in_several_groups() -> None:
    result = tp.check_optimizer_coverage(recipes.GPT, steps=2)
    assert result.passed, result.report()
    assert result.notes == ["Tied weights are one parameter each: transformer.wte.weight (also lm_head.weight)."]


def test_a_frozen_tied_weight_that_never_moves_is_a_note() -> None:
    result = tp.check_optimizer_coverage(recipes.GPTHeadFrozen, steps=2)
    assert result.passed, result.report()
    assert result.notes == [
        "Tied weights are one parameter each: transformer.wte.weight (also lm_head.weight).",
        "Held but frozen: transformer.wte.weight: torch's optimizers skip a parameter while its .grad is None; "
        "check_frozen verifies it stays put."]


def test_param_not_optimized() -> None:
    result = tp.check_optimizer_coverage(recipes.HeadNotOptimized)
    assert found(result) == [("param_not_optimized", "parameters.2.weight", 0, "param_not_optimized"),
                             ("param_not_optimized", "parameters.2.bias", 0, "param_not_optimized")]
    assert result.report().splitlines()[0] == (
        "trainparity optimizer_coverage check: FAIL at parameters.2.weight (param_not_optimized, step 0)")


@pytest.mark.filterwarnings("ignore:optimizer contains a parameter group with duplicate parameters")
@pytest.mark.parametrize(("recipe", "listings"), [
    (recipes.HeadInTwoOptimizers, "optimizer.param_groups.0, head_optimizer.param_groups.0"),
    (recipes.DuplicateInGroup, "optimizer.param_groups.0, optimizer.param_groups.0"),
])
def test_param_in_several_groups(recipe: type[tp.Recipe], listings: str) -> None:
    result = tp.check_optimizer_coverage(recipe)
    first = result.first_violation
    assert first is not None and (first.kind, first.path, first.cause) == (
        "param_in_several_groups", "parameters.2.weight", "param_in_several_groups")
    assert (first.expected, first.actual) == (1, 2)
    assert f"is listed 2 times right after setup(): in {listings}." in first.message
    assert {v.kind for v in result.violations} == {"param_in_several_groups"}


def test_an_optimizer_holding_every_parameter_is_fine_while_the_frozen_ones_never_move() -> None:
    """mmcv's optimizer builder gives the optimizer every parameter: torch's optimizers skip those whose .grad is
    None, so the frozen ones stay put."""
    result = tp.check_optimizer_coverage(recipes.FrozenInOptimizer, steps=2)
    assert result.passed, result.report()
    assert result.notes == ["Held but frozen: 0.weight, 0.bias: torch's optimizers skip a parameter while its .grad "
                            "is None; check_frozen verifies it stays put."]


def test_a_frozen_parameter_that_an_optimizer_moves_is_frozen_param_changed() -> None:
    result = tp.check_optimizer_coverage(recipes.StaleGradAdamW, steps=2)
    assert found(result) == [("frozen_param_changed", "parameters.0.weight", 1, "frozen_param_changed"),
                             ("frozen_param_changed", "parameters.0.bias", 1, "frozen_param_changed")]
    message = result.violations[0].message
    assert "optimizer 'optimizer' (AdamW) stepped it: its .grad is not None (all zeros" in message
    assert "(exp_avg, exp_avg_sq) and its group's weight_decay=0.01 moved it" in message
    assert message.endswith("Also at step 2.")


def test_a_frozen_parameter_stepped_with_a_stale_gradient_that_did_not_move_is_frozen_param_optimized() -> None:
    result = tp.check_optimizer_coverage(recipes.StaleGradPlainSGD, steps=2)
    assert found(result) == [("frozen_param_optimized", "parameters.0.weight", 1, "frozen_param_optimized"),
                             ("frozen_param_optimized", "parameters.0.bias", 1, "frozen_param_optimized")]
    assert ("is frozen (requires_grad=False) and optimizer.param_groups.0 holds it, but its .grad was not None at "
            "steps 1, 2") in result.violations[0].message


def test_a_parameter_frozen_during_training_is_watched_from_then_on() -> None:
    result = tp.check_optimizer_coverage(recipes.FreezesLaterWithStaleGrad, steps=3)
    assert found(result) == [("frozen_param_changed", "parameters.0.weight", 2, "frozen_param_changed"),
                             ("frozen_param_changed", "parameters.0.bias", 2, "frozen_param_changed")]


def test_a_held_parameter_unfrozen_on_purpose_trains_without_a_finding() -> None:
    result = tp.check_optimizer_coverage(recipes.UnfreezesHeldParameters, steps=2)
    assert result.passed, result.report()


def test_optimizer_for_another_copy_of_the_model() -> None:
    result = tp.check_optimizer_coverage(recipes.OptimizerForCopy)
    assert found(result) == [
        ("optimizer_for_other_model", "optimizer", 0, "optimizer_for_other_model"),
        *[("param_not_optimized", f"parameters.{name}", 0, "optimizer_for_other_model")
          for name in ("0.weight", "0.bias", "2.weight", "2.bias")],
    ]
    first = result.violations[0]
    assert (first.expected, first.actual) == (0, 4)
    assert "it was built for another copy of the model" in first.message
    assert result.notes == []  # no gradient can reach the foreign parameters: nothing to say about gradients


def test_a_module_replaced_after_the_optimizer_was_built() -> None:
    from trainparity.quickstarts.optimizer_coverage import HeadReplacedAfterOptimizer

    result = tp.check_optimizer_coverage(HeadReplacedAfterOptimizer)
    assert found(result) == [
        ("optimizer_for_other_model", "optimizer", 0, "optimizer_for_other_model"),
        ("param_not_optimized", "parameters.1.weight", 0, "param_not_optimized"),
        ("param_not_optimized", "parameters.1.bias", 0, "param_not_optimized"),
    ]
    assert result.notes == ["Held but frozen: 0.0.weight, 0.0.bias, 0.2.weight, 0.2.bias: torch's optimizers skip a "
                            "parameter while its .grad is None; check_frozen verifies it stays put."]
    message = result.violations[0].message
    assert "2 of its 6 parameters belong to no module" in message and "one replaced after the optimizer" in message


def test_param_without_grad_names_the_first_step_and_every_step_without_one() -> None:
    result = tp.check_optimizer_coverage(recipes.UnusedHead, steps=3)
    assert found(result) == [("param_without_grad", "gradients.aux.weight", 1, "param_without_grad"),
                             ("param_without_grad", "gradients.aux.bias", 1, "param_without_grad")]
    first = result.violations[0]
    assert "no gradient reached it in steps 1, 2, 3 (of 3 with a backward pass)" in first.message
    assert "find_unused_parameters=True" in first.message and (first.expected, first.actual) == (3, 0)


def test_steps_zero_judges_setup_only() -> None:
    result = tp.check_optimizer_coverage(recipes.UnusedHead, steps=0)
    assert result.passed and result.notes == ["steps=0: param_without_grad was not judged (no step was taken)."]
    assert not tp.check_optimizer_coverage(recipes.HeadNotOptimized, steps=0).passed


def test_the_parameters_of_an_averaged_copy_are_not_unoptimized_and_are_named_in_a_note() -> None:
    result = tp.check_optimizer_coverage(recipes.WithEma)
    assert result.passed, result.report()
    assert result.notes == ["Averaged copies: the parameters of ema (a torch.optim.swa_utils.AveragedModel) require "
                            "grad and no optimizer holds them: its update_parameters() averages them."]
    beside = tp.check_optimizer_coverage(recipes.WithEmaHeadNotOptimized)
    assert found(beside) == [("param_not_optimized", "parameters.model.2.weight", 0, "param_not_optimized"),
                             ("param_not_optimized", "parameters.model.2.bias", 0, "param_not_optimized")]


def test_an_optimizer_built_in_the_first_step_is_judged_after_it() -> None:
    result = tp.check_optimizer_coverage(recipes.LazyOptimizer)
    assert result.passed, result.report()
    assert result.notes == ["Right after setup() the State held no optimizer: the optimizers were judged after step 1, "
                            "and param_without_grad was not judged (its gradient hooks sit on the parameters that the "
                            "optimizers hold right after setup())."]


def test_a_finding_that_appears_during_training_is_reported_after_its_step() -> None:
    result = tp.check_optimizer_coverage(recipes.UnfreezesWithoutOptimizing)
    assert found(result) == [("param_not_optimized", "parameters.0.weight", 1, "param_not_optimized"),
                             ("param_not_optimized", "parameters.0.bias", 1, "param_not_optimized")]
    assert "no optimizer of the State holds it after step 1" in result.violations[0].message


def test_a_finding_present_from_setup_on_is_reported_once() -> None:
    result = tp.check_optimizer_coverage(recipes.HeadInTwoOptimizers, steps=2)
    assert [v.step for v in result.violations] == [0, 0]
    assert all("Also at" not in v.message for v in result.violations)


def test_abstains_without_an_optimizer_or_a_model_in_the_state() -> None:
    result = tp.check_optimizer_coverage(recipes.NoOptimizer)
    assert result.outcome is tp.Outcome.ABSTAIN
    assert result.reason == ("the State holds no optimizer, right after setup() nor after step 1: put the optimizer "
                             "in the State")


def test_a_recipe_that_raises_is_an_error_with_the_live_exception() -> None:
    result = tp.check_optimizer_coverage(recipes.Raises)
    assert result.outcome is tp.Outcome.ERROR and isinstance(result.exception, ValueError)
    assert result.error is not None and result.error.phase == "training"
    with pytest.raises(ValueError, match="the data pipeline broke"):
        tp.assert_optimizer_coverage(recipes.Raises)


def test_in_a_child_process_the_result_is_the_same() -> None:
    inprocess = tp.check_optimizer_coverage(recipes.OptimizerForCopy)
    child = tp.check_optimizer_coverage(recipes.OptimizerForCopy, isolation="process", timeout=60)
    assert child.report() == inprocess.report().replace("isolation='inprocess'", "isolation='process'")


# -- mixed precision -------------------------------------------------------------------------------


def test_clean_mixed_precision_passes_with_the_loss_scale_in_the_notes() -> None:
    result = tp.check_mixed_precision(recipes.Amp)
    assert isinstance(result, tp.MixedPrecisionResult) and result.passed, result.report()
    assert result.notes == ["GradScaler 'scaler': Loss scale at each scaler.step(): 1024 (step 1), 1024 (step 2), "
                            "1024 (step 3), 1024 (step 4); after the last update(): 1024."]
    assert result.config == {"recipe": "preflight_recipes:Amp", "steps": 4, "seed": 0, "isolation": "inprocess",
                             "max_skipped_steps": None}


@pytest.mark.parametrize(("recipe", "how"), [
    (recipes.StepsOptimizerDirectly, "on gradients GradScaler 'scaler' still scaled by 1024"),
    (recipes.StepsAfterUnscale, "after scaler.unscale_():"),
])
def test_scaler_step_bypassed(recipe: type[tp.Recipe], how: str) -> None:
    result = tp.check_mixed_precision(recipe)
    assert found(result) == [("scaler_step_bypassed", "optimizer", 1, "scaler_step_bypassed")]
    message = result.violations[0].message
    assert how in message and message.endswith("\nAlso at steps 2, 3, 4.")


def test_scaler_step_bypassed_then_update_raising_is_a_fail_not_an_error() -> None:
    result = tp.check_mixed_precision(recipes.StepsDirectlyThenUpdates)
    assert found(result) == [("scaler_step_bypassed", "optimizer", 1, "scaler_step_bypassed")]
    assert result.notes == ["Step 1 then raised AssertionError: No inf checks were recorded prior to update. "
                            "(scaler.update() after no scaler.step()); the run ended there."]


def test_another_error_after_a_bypass_is_the_recipes_error() -> None:
    result = tp.check_mixed_precision(recipes.StepsDirectlyThenRaises)
    assert result.outcome is tp.Outcome.ERROR and isinstance(result.exception, ValueError)


def test_scaler_update_missing_ends_the_run_before_the_scaler_raises() -> None:
    result = tp.check_mixed_precision(recipes.UpdateMissing)
    assert found(result) == [("scaler_update_missing", "scaler", 1, "scaler_update_missing")]
    assert result.notes[0] == ("The run ended after step 1 of 4: the next scaler.step() would raise without "
                               "scaler.update().")


def test_clip_before_unscale() -> None:
    result = tp.check_mixed_precision(recipes.ClipsBeforeUnscale, steps=2)
    assert found(result) == [("clip_before_unscale", "gradients.0.weight", 1, "clip_before_unscale")]
    assert "clip_grad_norm_() clipped gradients that GradScaler 'scaler' still scaled by 1024" in (
        result.violations[0].message)


def test_nonfinite_grads_stepped_without_a_scaler() -> None:
    result = tp.check_mixed_precision(recipes.InfiniteGradientsNoScaler, steps=1)
    assert found(result) == [("nonfinite_grads_stepped", "gradients.0.weight", 1, "nonfinite_grads_stepped"),
                             ("nonfinite_params", "parameters.0.weight", 1, "nonfinite_grads_stepped")]
    assert result.notes[0].startswith("The State holds no enabled torch.amp.GradScaler: the scaler's contract")


def test_gradients_a_closure_computes_inside_the_step_are_the_ones_judged() -> None:
    """`optimizer.step(closure)` computes its gradients inside the step: read before it, they would be the last
    step's, and the parameters the step made non-finite would be named first, a consequence before its cause."""
    result = tp.check_mixed_precision(recipes.InfiniteGradientsInClosure, steps=2)
    assert found(result)[:2] == [("nonfinite_grads_stepped", "gradients.0.weight", 1, "nonfinite_grads_stepped"),
                                 ("nonfinite_params", "parameters.0.weight", 1, "nonfinite_grads_stepped")]


@pytest.mark.parametrize("recipe", [recipes.NormalizesGradientsAfterUnscale,
                                    recipes.NormalizesGradientsAfterUnscaleFused])
def test_nonfinite_grads_stepped_inside_scaler_step_is_named_before_the_parameters(recipe: type[tp.Recipe]) -> None:
    """A NaN made after scaler.unscale_() (a gradient divided by its zero norm): scaler.step() trusts the inf check
    unscale_() made and steps on it. The step that consumed it is the cause, named ahead of the parameters it made
    non-finite, and it is a step taken, not a skipped one."""
    result = tp.check_mixed_precision(recipe)
    assert found(result)[:3] == [
        ("nonfinite_grads_stepped", "gradients.branch.weight", 1, "nonfinite_grads_stepped"),
        ("nonfinite_params", "parameters.branch.weight", 1, "nonfinite_grads_stepped"),
        ("nonfinite_params", "parameters.branch.bias", 1, "nonfinite_grads_stepped")]
    message = result.violations[0].message
    assert "inside scaler.step()" in message and "(of branch.weight, branch.bias)" in message
    assert "Loss scale at each scaler.step(): 1024 (step 1), 1024 (step 2, skipped)" in result.report()


def test_nonfinite_grads_stepped_without_a_scaler_whatever_made_them() -> None:
    result = tp.check_mixed_precision(recipes.NormalizesGradientsNoScaler, steps=1)
    assert found(result) == [
        ("nonfinite_grads_stepped", "gradients.branch.weight", 1, "nonfinite_grads_stepped"),
        ("nonfinite_params", "parameters.branch.weight", 1, "nonfinite_grads_stepped"),
        ("nonfinite_params", "parameters.branch.bias", 1, "nonfinite_grads_stepped")]


def test_a_fused_optimizer_told_of_an_inf_skips_the_step_itself() -> None:
    """scaler.step() always calls a fused optimizer, on the gradients it found an inf in, with `found_inf` set: the
    optimizer skips the update, so it is a skipped step, not nonfinite_grads_stepped."""
    result = tp.check_mixed_precision(recipes.InfiniteGradientsFused)
    assert found(result) == [("skipped_steps", "scaler.scale", 3, "skipped_steps")]


def test_nonfinite_flags_names_every_inf_and_nan_and_no_finite_value_whose_norm_overflows() -> None:
    from trainparity._observe._hooks import nonfinite_flags

    tensors = [torch.full((10,), 6e4, dtype=torch.float16), torch.full((4,), 1e38), torch.empty(0), torch.randn(3)]
    assert nonfinite_flags(tensors) == [False, False, False, False]
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64):
        for value in (math.nan, math.inf, -math.inf):
            for position in (0, 500, 1008):
                tensor = torch.randn(1009).to(dtype)
                tensor[position] = value
                assert nonfinite_flags([torch.randn(3), tensor]) == [False, True], (dtype, value, position)
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, math.nan], (5,), check_invariants=True)
    assert nonfinite_flags([sparse, sparse.to_dense().nan_to_num()]) == [True, False]


def test_skipped_steps_with_the_loss_scale_trace() -> None:
    result = tp.check_mixed_precision(recipes.InfiniteGradients)
    assert found(result) == [("skipped_steps", "scaler.scale", 3, "skipped_steps")]
    skipped = result.violations[0]
    assert (skipped.expected, skipped.actual) == (2, 4)
    assert skipped.message.endswith(
        "\nLoss scale at each scaler.step(): 1024 (step 1, skipped), 512 (step 2, skipped), 256 (step 3, skipped), "
        "128 (step 4, skipped); after the last update(): 64.")
    assert "At most 2 allowed (by default at most half of the scaler steps)" in skipped.message


def test_max_skipped_steps_is_declared() -> None:
    assert tp.check_mixed_precision(recipes.InfiniteGradients, steps=2, max_skipped_steps=2).passed
    result = tp.check_mixed_precision(recipes.InfiniteGradients, steps=2, max_skipped_steps=0)
    assert found(result) == [("skipped_steps", "scaler.scale", 1, "skipped_steps")]
    assert "At most 0 allowed (max_skipped_steps=0)" in result.violations[0].message


def test_nonfinite_loss_comes_before_the_steps_it_made_the_scaler_skip() -> None:
    result = tp.check_mixed_precision(recipes.NanLoss)
    assert found(result) == [("nonfinite_loss", "loss", 2, "nonfinite_loss"),
                             ("skipped_steps", "scaler.scale", 4, "skipped_steps")]
    assert result.violations[0].actual == "-inf" and result.violations[0].message.endswith("\nAlso at steps 3, 4.")
    assert "the loss itself was not finite in steps 2, 3, 4" in result.violations[1].message


def test_nonfinite_params_right_after_setup() -> None:
    result = tp.check_mixed_precision(recipes.NanInit, steps=1)
    assert found(result)[0] == ("nonfinite_params", "parameters.2.bias", 0, "nonfinite_params")
    assert result.violations[0].message == ("Parameter '2.bias' holds an inf or a NaN right after setup().\n"
                                            "Also at step 1.")


def test_a_disabled_scaler_is_not_held_to_its_contract() -> None:
    result = tp.check_mixed_precision(recipes.DisabledScaler)
    assert result.passed, result.report()
    assert "(disabled: scaler)" in result.notes[0]


def test_mixed_precision_abstains_without_an_optimizer_in_the_state() -> None:
    result = tp.check_mixed_precision(recipes.NoOptimizer)
    assert result.outcome is tp.Outcome.ABSTAIN and "holds no optimizer" in str(result.reason)


def test_mixed_precision_in_a_child_process_keeps_non_finite_values() -> None:
    inprocess = tp.check_mixed_precision(recipes.NanLoss)
    child = tp.check_mixed_precision(recipes.NanLoss, isolation="process", timeout=60)
    assert child.report() == inprocess.report().replace("isolation='inprocess'", "isolation='process'")


# -- traces, misuse, assertions, session ------------------------------------------------------------


def test_traces_survive_the_wire_format(tmp_path: Any) -> None:
    from trainparity._preflight._run import PreflightPayload
    from trainparity._process._engine import Job, run_jobs
    from trainparity._process._options import Deadline
    from trainparity._recipe._reference import resolve_recipe

    for task, recipe, record in [
        ("trainparity._preflight._optimizer_coverage:optimizer_coverage_run", recipes.GPT, CoverageTrace),
        ("trainparity._preflight._mixed_precision:mixed_precision_run", recipes.NanLoss, PrecisionTrace),
    ]:
        job = Job(task, PreflightPayload(resolve_recipe(recipe), 2, 0), "training", record=record)
        output = run_jobs([job], deadline=Deadline.after(60), isolation="inprocess")[0].output
        assert isinstance(output, record)
        dump(output, tmp_path / "trace")
        assert repr(read(record, load(tmp_path / "trace"), "trace")) == repr(output)
    assert output.steps[1].loss == -math.inf


@pytest.mark.parametrize(("check", "kwargs", "error", "message"), [
    (tp.check_optimizer_coverage, {"steps": -1}, ValueError, "steps= must be an int >= 0"),
    (tp.check_mixed_precision, {"steps": 0}, ValueError, "steps= must be an int >= 1"),
    (tp.check_mixed_precision, {"steps": True}, ValueError, "steps= must be an int >= 1"),
    (tp.check_mixed_precision, {"max_skipped_steps": -1}, ValueError, "max_skipped_steps= must be None"),
    (tp.check_optimizer_coverage, {"seed": "0"}, TypeError, "seed= must be an int"),
    (tp.check_optimizer_coverage, {"isolation": "thread"}, ValueError, "isolation= must be one of"),
    (tp.check_mixed_precision, {"timeout": 0}, ValueError, "timeout= must be a positive number"),
])
def test_misuse_raises_naming_the_fix(check: Any, kwargs: dict[str, Any], error: type[Exception],
                                      message: str) -> None:
    with pytest.raises(error, match=message):
        check(recipes.MLP, **kwargs)


def test_a_recipe_defined_in_a_function_is_refused() -> None:
    class Local(recipes.MLP):
        pass

    with pytest.raises(TypeError, match="define it at module level"):
        tp.check_mixed_precision(Local)


def test_assertions_raise_with_the_report_and_return_the_result_on_pass() -> None:
    assert tp.assert_optimizer_coverage(recipes.GPT).passed
    assert tp.assert_mixed_precision_safe(recipes.Amp).passed
    with pytest.raises(AssertionError) as caught:
        tp.assert_mixed_precision_safe(recipes.ClipsBeforeUnscale, msg="the AMP loop")
    text = str(caught.value)
    assert text.startswith(
        "trainparity mixed_precision check: FAIL at gradients.0.weight (clip_before_unscale, step 1)")
    assert text.endswith("\n\nthe AMP loop")
    with pytest.raises(AssertionError, match="param_without_grad"):
        tp.assert_optimizer_coverage(recipes.UnusedHead)


def test_the_session_default_isolation_applies() -> None:
    from trainparity._preflight._run import Preflight

    _session.set_defaults(_session.Defaults(isolation="spawn"))
    try:
        assert Preflight.prepare(recipes.MLP, steps=1, minimum_steps=0, seed=0, isolation=None,
                                 timeout=None).isolation == "spawn"
    finally:
        _session.set_defaults(_session.BUILTIN)
    assert Preflight.prepare(recipes.MLP, steps=1, minimum_steps=0, seed=0, isolation=None,
                             timeout=None).isolation == "inprocess"


def test_json_is_deterministic() -> None:
    document = json.loads(tp.check_mixed_precision(recipes.NanLoss).to_json())
    assert document["check"] == "mixed_precision" and document["first_violation"]["path"] == "loss"
    assert document["counts"] == {"nonfinite_loss": 1, "skipped_steps": 1}


@pytest.mark.parametrize(("argv", "status", "headline"), [
    (["optimizer-coverage", "preflight_recipes:GPT", "--steps", "2"], 0,
     "trainparity optimizer_coverage check: PASS"),
    (["optimizer-coverage", "preflight_recipes:NoOptimizer"], 2, "trainparity optimizer_coverage check: ABSTAIN"),
    (["optimizer-coverage", "preflight_recipes:Raises"], 3, "trainparity optimizer_coverage check: ERROR"),
    (["mixed-precision", "preflight_recipes:UpdateMissing"], 1,
     "trainparity mixed_precision check: FAIL at scaler (scaler_update_missing, step 1)"),
    (["mixed-precision", "preflight_recipes:InfiniteGradients", "--steps", "2", "--max-skipped-steps", "2"], 0,
     "trainparity mixed_precision check: PASS"),
])
def test_command_line(argv: list[str], status: int, headline: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(argv) == status
    assert capsys.readouterr().out.startswith(headline + "\n")


def test_command_line_misuse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(["mixed-precision", "preflight_recipes:Amp", "--max-skipped-steps", "-1"]) == 4
    assert "max_skipped_steps= must be None" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["optimizer-coverage", "preflight_recipes:MLP", "--rtol", "1e-3"])  # nothing is compared
    assert caught.value.code == 4
