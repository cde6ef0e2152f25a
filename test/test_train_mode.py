"""check_train_mode: modules left in eval mode, evaluations run in train mode, each at its module and step, with
the fixed twins, and the forms that must not be mistaken for them."""

from __future__ import annotations

import json
from typing import Any

import mode_recipes as recipes
import pytest

import trainparity as tp
from trainparity._preflight._train_mode import TrainModeTrace
from trainparity._process import _session
from trainparity._process._wire import dump, load
from trainparity._records import read

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def found(result: tp.Result) -> list[tuple[str, str, int | None, str | None]]:
    return [(v.kind, v.path, v.step, v.cause) for v in result.violations]


def test_a_loop_that_evaluates_and_goes_back_to_train_mode_passes() -> None:
    result = tp.check_train_mode(recipes.Training)
    assert isinstance(result, tp.TrainModeResult) and result.passed, result.report()
    assert result.config == {"recipe": "mode_recipes:Training", "steps": 3, "seed": 0, "isolation": "inprocess",
                             "eval_modules": None}
    assert result.notes == ["Modules whose behaviour depends on their mode: BatchNorm1d 'backbone.1', Dropout "
                            "'head.0'."]


def test_eval_without_train_names_the_evaluation_that_switched_it() -> None:
    result = tp.check_train_mode(recipes.EvalWithoutTrain)
    assert found(result) == [("module_left_in_eval", "modules.backbone.1", 3, "module_left_in_eval"),
                             ("module_left_in_eval", "modules.head.0", 3, "module_left_in_eval")]
    first, second = result.violations
    assert first.message.startswith(
        "BatchNorm1d 'backbone.1' was in eval mode in the forward pass that built the loss at step 3: it normalized "
        "with its running statistics instead of the batch's and did not update them. It was set to eval mode by "
        "model.eval() in EvalWithoutTrain.evaluate (mode_recipes.py:")
    assert ") in step 2, and nothing set it back: call model.train() after evaluating." in first.message
    assert second.message.startswith("Dropout 'head.0' was in eval mode in the forward pass that built the loss at "
                                     "step 3: it dropped nothing.")
    assert (first.expected, first.actual) == ("train", "eval")


def test_a_model_left_in_eval_by_setup() -> None:
    result = tp.check_train_mode(recipes.EvalInSetup, steps=1)
    assert found(result) == [("module_left_in_eval", "modules.backbone.1", 1, "module_left_in_eval"),
                             ("module_left_in_eval", "modules.head.0", 1, "module_left_in_eval")]
    assert "It was already in eval mode right after setup()." in result.violations[0].message


def test_an_evaluation_under_no_grad_in_train_mode_names_the_buffers_and_the_dropout() -> None:
    result = tp.check_train_mode(recipes.NoGradEvaluation)
    assert found(result) == [("eval_in_train_mode", "modules.backbone.1", 2, "eval_in_train_mode")]
    assert result.violations[0].message.startswith(
        "The forward of 'model' at step 2 ran under torch.no_grad() with modules in train mode (BatchNorm1d "
        "'backbone.1', Dropout 'head.0'): it updated the buffers backbone.1.running_mean, backbone.1.running_var, "
        "backbone.1.num_batches_tracked and it drew from torch's RNG stream of training (dropout in head.0).")


def test_an_evaluation_under_inference_mode_in_train_mode() -> None:
    result = tp.check_train_mode(recipes.InferenceModeEvaluation)
    assert found(result) == [("eval_in_train_mode", "modules.backbone.1", 2, "eval_in_train_mode")]
    assert result.violations[0].message.startswith("The forward of 'model' at step 2 ran under torch.inference_mode() "
                                                   "with modules in train mode")


def test_a_forward_whose_output_is_never_back_propagated_is_an_evaluation() -> None:
    result = tp.check_train_mode(recipes.LoggedForward, steps=1)
    assert found(result) == [("eval_in_train_mode", "modules.backbone.1", 1, "eval_in_train_mode")]
    assert "ran with gradients enabled, but its output took no part in a backward pass" in (
        result.violations[0].message)


def test_a_teacher_in_train_mode_is_an_evaluation_in_train_mode() -> None:
    assert tp.check_train_mode(recipes.Distillation).passed
    result = tp.check_train_mode(recipes.Distillation(teacher_in_train_mode=True))
    assert found(result) == [("eval_in_train_mode", "modules.teacher.backbone.1", 1, "eval_in_train_mode")]
    assert result.violations[0].message.endswith("\nAlso at steps 2, 3.")


def test_a_dropout_that_ignores_the_mode_draws_in_an_evaluation() -> None:
    """transformers PR 33844: F.dropout(x, p) without training=self.training drops in eval mode."""
    result = tp.check_train_mode(recipes.DropoutIgnoresMode)
    assert found(result) == [("eval_in_train_mode", "modules.1", 2, "eval_in_train_mode")]
    assert ("ExplicitDropout '1' is in eval mode, but its forward called F.dropout with training=True: pass "
            "training=self.training (transformers PR 33844).") in result.violations[0].message


@pytest.mark.parametrize(("recipe", "path", "effect"), [
    (recipes.NoisyEvalWithoutTrain, "modules.0", "NoisyLinear '0' was in eval mode in the forward pass that built "
     "the loss at step 3: its forward reads self.training."),
    (recipes.AttentionEvalWithoutTrain, "modules.2", "Attention '2' was in eval mode in the forward pass that built "
     "the loss at step 3: its forward reads self.training."),
])
def test_any_module_whose_forward_reads_its_mode(recipe: type[tp.Recipe], path: str, effect: str) -> None:
    result = tp.check_train_mode(recipe)
    assert found(result) == [("module_left_in_eval", path, 3, "module_left_in_eval")]
    assert result.violations[0].message.startswith(effect)


def test_spectral_norm_power_iteration_in_an_evaluation() -> None:
    """pytorch issue 51800: spectral_norm's power iteration (its buffers _u, _v) runs in every train-mode forward."""
    result = tp.check_train_mode(recipes.SpectralNormNoGradEvaluation)
    assert found(result) == [("eval_in_train_mode", "modules.0.parametrizations.weight.0", 2, "eval_in_train_mode")]
    assert ("it updated the buffers 0.parametrizations.weight.0._u, 0.parametrizations.weight.0._v"
            in result.violations[0].message)


def test_modules_declared_in_eval_pass_and_are_named() -> None:
    undeclared = tp.check_train_mode(recipes.FrozenBackbone)
    assert found(undeclared) == [("module_left_in_eval", "modules.backbone.1", 1, "module_left_in_eval")]
    assert "declare it: eval_modules=['backbone.1']." in undeclared.violations[0].message
    for eval_modules in ("backbone", "backbone.*", ["backbone.1"]):
        result = tp.check_train_mode(recipes.FrozenBackbone, eval_modules=eval_modules)
        assert result.passed, result.report()
        assert result.notes[-1] == "In eval mode as eval_modules declares: backbone.1."
        assert result.config["eval_modules"] == ([eval_modules] if isinstance(eval_modules, str) else eval_modules)


def test_activation_checkpointing_recomputes_without_a_finding() -> None:
    assert tp.check_train_mode(recipes.Checkpointed).passed


def test_a_model_never_called_abstains() -> None:
    result = tp.check_train_mode(recipes.NoForward)
    assert result.outcome is tp.Outcome.ABSTAIN
    assert result.reason == ("no forward pass of a module of the State ran in the 3 steps: call the model the State "
                             "holds")


def test_in_a_child_process_the_result_is_the_same() -> None:
    inprocess = tp.check_train_mode(recipes.EvalWithoutTrain)
    child = tp.check_train_mode(recipes.EvalWithoutTrain, isolation="process", timeout=60)
    assert child.report() == inprocess.report().replace("isolation='inprocess'", "isolation='process'")


def test_the_trace_survives_the_wire_format(tmp_path: Any) -> None:
    from trainparity._preflight._train_mode import TrainModePayload
    from trainparity._process._engine import Job, run_jobs
    from trainparity._process._options import Deadline
    from trainparity._recipe._reference import resolve_recipe

    job = Job("trainparity._preflight._train_mode:train_mode_run",
              TrainModePayload(resolve_recipe(recipes.NoGradEvaluation), 2, 0), "training", record=TrainModeTrace)
    output = run_jobs([job], deadline=Deadline.after(60), isolation="inprocess")[0].output
    assert isinstance(output, TrainModeTrace) and output.calls
    dump(output, tmp_path / "trace")
    assert repr(read(TrainModeTrace, load(tmp_path / "trace"), "trace")) == repr(output)


# -- misuse, errors, surfaces -------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"steps": 0}, ValueError, "steps= must be an int >= 1"),
    ({"steps": 1.5}, ValueError, "steps= must be an int >= 1"),
    ({"eval_modules": 1}, TypeError, "eval_modules= must be a glob or a list of globs"),
    ({"eval_modules": {"backbone"}}, TypeError, "eval_modules= must be a glob or a list of globs"),
    ({"eval_modules": [""]}, ValueError, "eval_modules= must hold at least one non-empty glob"),
    ({"eval_modules": "bakbone"}, ValueError,
     "eval_modules=: 'bakbone' matches no module of the State; the closest are 'backbone'"),
    ({"timeout": -1}, ValueError, "timeout= must be a positive number"),
])
def test_misuse_raises_naming_the_fix(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        tp.check_train_mode(recipes.Training, **kwargs)


def test_a_state_without_a_module_is_refused() -> None:
    with pytest.raises(ValueError, match=r"the State holds no nn.Module: put the model in the State"):
        tp.check_train_mode(recipes.NoModule)


def test_a_recipe_that_raises_is_an_error_with_the_live_exception() -> None:
    result = tp.check_train_mode(recipes.Raises)
    assert result.outcome is tp.Outcome.ERROR and isinstance(result.exception, ValueError)
    with pytest.raises(ValueError, match="the data pipeline broke"):
        tp.assert_train_mode(recipes.Raises)
    child = tp.check_train_mode(recipes.Raises, isolation="spawn", timeout=60)
    assert child.outcome is tp.Outcome.ERROR and "the data pipeline broke" in child.report()


def test_assertions_and_json() -> None:
    assert tp.assert_train_mode(recipes.Training).passed
    with pytest.raises(AssertionError) as caught:
        tp.assert_train_mode(recipes.EvalWithoutTrain, msg="the evaluation hook")
    text = str(caught.value)
    assert text.startswith("trainparity train_mode check: FAIL at modules.backbone.1 (module_left_in_eval, step 3)")
    assert text.endswith("\n\nthe evaluation hook")
    document = json.loads(tp.check_train_mode(recipes.NoGradEvaluation).to_json())
    assert document["check"] == "train_mode" and document["first_violation"]["path"] == "modules.backbone.1"
    assert document["counts"] == {"eval_in_train_mode": 1}


def test_nothing_is_left_patched_and_modes_are_the_recipes() -> None:
    import torch.nn.functional as F
    from torch import nn

    result = tp.check_train_mode(recipes.EvalWithoutTrain)
    assert not result.passed
    assert "training" not in vars(nn.Module) and F.dropout.__module__ == "torch.nn.functional"
    model = nn.Sequential(nn.Dropout(0.5))
    assert model.train().training and not model.eval()[0].training


@pytest.mark.parametrize(("argv", "status", "headline"), [
    (["train-mode", "mode_recipes:Training"], 0, "trainparity train_mode check: PASS"),
    (["train-mode", "mode_recipes:FrozenBackbone", "--eval-modules", "backbone"], 0,
     "trainparity train_mode check: PASS"),
    (["train-mode", "mode_recipes:EvalWithoutTrain"], 1,
     "trainparity train_mode check: FAIL at modules.backbone.1 (module_left_in_eval, step 3)"),
    (["train-mode", "mode_recipes:NoGradEvaluation", "--steps", "2", "--isolation", "process"], 1,
     "trainparity train_mode check: FAIL at modules.backbone.1 (eval_in_train_mode, step 2)"),
    (["train-mode", "mode_recipes:NoForward"], 2, "trainparity train_mode check: ABSTAIN"),
    (["train-mode", "mode_recipes:Raises"], 3, "trainparity train_mode check: ERROR"),
])
def test_command_line(argv: list[str], status: int, headline: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(argv) == status
    assert capsys.readouterr().out.startswith(headline + "\n")


def test_command_line_misuse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(["train-mode", "mode_recipes:NoModule"]) == 4
    assert "the State holds no nn.Module" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["train-mode", "mode_recipes:Training", "--atol", "1e-3"])  # nothing is compared
    assert caught.value.code == 4


def test_the_pytest_plugins_defaults_apply_to_both_checks() -> None:
    """--trainparity-isolation and --trainparity-timeout set the session's defaults; an argument wins."""
    _session.set_defaults(_session.Defaults(isolation="process", timeout=60.0))
    try:
        results = [tp.check_train_mode(recipes.Training, steps=1), tp.check_frozen(recipes.FrozenBackbone, steps=1),
                   tp.check_frozen(recipes.FrozenBackbone, steps=1, isolation="inprocess")]
    finally:
        _session.set_defaults(_session.BUILTIN)
    assert [r.config["isolation"] for r in results] == ["process", "process", "inprocess"]
    assert all(r.passed for r in results), [r.report() for r in results]
