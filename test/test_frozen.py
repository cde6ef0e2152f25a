"""check_frozen: each way a frozen thing moves, named at its path and step with what moved it, and the fixed twins."""

from __future__ import annotations

import json
from typing import Any

import mode_recipes as recipes
import preflight_recipes
import pytest
import torch
from tensor_kinds import KINDS, changed
from torch import nn

import trainparity as tp
from trainparity._preflight._frozen import FrozenTrace
from trainparity._process._wire import dump, load
from trainparity._records import read

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def found(result: tp.Result) -> list[tuple[str, str, int | None, str | None]]:
    return [(v.kind, v.path, v.step, v.cause) for v in result.violations]


BACKBONE = ["backbone.0.weight", "backbone.0.bias", "backbone.1.weight", "backbone.1.bias"]
STATISTICS = ["backbone.1.running_mean", "backbone.1.running_var", "backbone.1.num_batches_tracked"]


@pytest.mark.parametrize("recipe", [recipes.FrozenBackbone, recipes.HoldsEveryParameter,
                                    recipes.StaleGradientSetToNone])
def test_a_frozen_backbone_that_stays_put_passes(recipe: type[tp.Recipe]) -> None:
    result = tp.check_frozen(recipe)
    assert isinstance(result, tp.FrozenResult) and result.passed, result.report()
    assert result.config == {"recipe": f"mode_recipes:{recipe.__name__}", "steps": 2, "seed": 0,
                             "isolation": "inprocess", "frozen": None}
    assert result.notes == ["Watched 4 parameters (backbone.0.weight, backbone.0.bias, backbone.1.weight, "
                            "backbone.1.bias) and 3 buffers (backbone.1.running_mean, backbone.1.running_var, "
                            "backbone.1.num_batches_tracked)."]


def test_a_stale_gradient_under_adamw_moves_the_frozen_backbone() -> None:
    result = tp.check_frozen(recipes.StaleGradient)
    assert found(result) == [("frozen_param_changed", f"parameters.{name}", 1, "frozen_param_changed")
                             for name in BACKBONE]
    message = result.violations[0].message
    assert message.startswith(
        "Parameter 'backbone.0.weight' (frozen) changed in step 1: optimizer 'optimizer' (AdamW) stepped it: its "
        ".grad is not None (all zeros: a gradient from before it was frozen, which zero_grad(set_to_none=False) "
        "zeroes but keeps), so the optimizer does not skip it, and its optimizer state from before the freeze "
        "(exp_avg, exp_avg_sq) and its group's weight_decay=0.01 moved it.")
    assert "\n\nTensor-likes are not equal!\n\nMismatched elements: 128 / 128 (100.0%)\n" in message
    assert message.endswith("\nAlso at step 2.")


def test_a_frozen_backbone_in_train_mode_updates_its_batchnorm_statistics() -> None:
    result = tp.check_frozen(recipes.BackboneInTrainMode)
    assert found(result) == [("frozen_buffer_changed", f"buffers.{name}", 1, "frozen_module_in_train_mode")
                             for name in STATISTICS]
    assert result.violations[0].message.startswith(
        "Buffer 'backbone.1.running_mean' of frozen BatchNorm1d 'backbone.1' changed in step 1: the module ran its "
        "forward in train mode and updated it")


def test_frozen_stages_applied_only_in_train_are_never_applied() -> None:
    """mmpretrain issue 702: declared frozen, the stage still requires grad, gets gradients and trains."""
    result = tp.check_frozen(recipes.FrozenStagesNeverApplied, frozen="0.stages.0.*")
    assert found(result) == [
        ("frozen_param_trainable", "parameters.0.stages.0.0.weight", 1, "frozen_param_trainable"),
        ("frozen_param_trainable", "parameters.0.stages.0.0.bias", 1, "frozen_param_trainable"),
        ("frozen_param_changed", "parameters.0.stages.0.0.weight", 1, "frozen_param_trainable"),
        ("frozen_param_changed", "parameters.0.stages.0.0.bias", 1, "frozen_param_trainable"),
    ]
    assert "a freeze applied only in train() never runs when nothing calls model.train()" in (
        result.violations[0].message)
    assert "it requires grad (requires_grad=True), so it is not frozen" in result.violations[2].message
    fixed = tp.check_frozen(recipes.FrozenStagesAppliedInInit, frozen="0.stages.0.*")
    assert fixed.passed, fixed.report()


def test_nothing_frozen_abstains_and_says_how_to_declare_it() -> None:
    result = tp.check_frozen(recipes.FrozenStagesNeverApplied)
    assert result.outcome is tp.Outcome.ABSTAIN
    assert result.reason == ("nothing is frozen: no parameter of the State has requires_grad=False right after "
                             "setup(), and frozen= declares none; declare what is meant to stay frozen, e.g. "
                             "frozen='backbone.*'")


def test_the_recipes_own_code_writing_a_frozen_weight() -> None:
    result = tp.check_frozen(recipes.WritesFrozenWeights)
    assert found(result) == [("frozen_param_changed", "parameters.backbone.0.weight", 1, "frozen_param_changed")]
    assert "outside any optimizer step of the State: the recipe's code wrote it" in result.violations[0].message


def test_the_recipes_own_code_resetting_frozen_statistics() -> None:
    result = tp.check_frozen(recipes.ResetsFrozenStatistics)
    assert found(result)[0] == ("frozen_buffer_changed", "buffers.backbone.1.running_mean", 1,
                                "frozen_buffer_changed")
    assert "outside a train-mode forward of its module: the recipe's code wrote it" in result.violations[0].message


def test_an_optimizer_step_on_a_stale_gradient_that_moved_nothing_is_a_note() -> None:
    result = tp.check_frozen(preflight_recipes.StaleGradPlainSGD)
    assert result.passed, result.report()
    assert result.notes[1] == ("Optimizers stepped frozen parameters whose .grad was not None without moving them "
                               "(0.weight at steps 1, 2, 0.bias at steps 1, 2): with weight decay or momentum they "
                               "would move; set their gradients to None.")


def test_a_frozen_teacher_in_the_state_is_watched_under_its_entry() -> None:
    result = tp.check_frozen(recipes.Distillation)
    assert result.passed, result.report()
    assert "teacher.backbone.1.running_mean" in result.notes[0]


#: kinds of tensor a frozen module's buffer may be
BUFFER_KINDS = ["sparse_coo", "nested", "quantized", "dtype_float8_e4m3fn", "dtype_bool", "dtype_uint32",
                "dtype_complex64", "empty", "zero_dim", "noncontiguous"]


class FrozenKinds(recipes.FrozenBackbone):
    """The frozen backbone holds buffers of many kinds; `change` replaces one of them by assignment in step()."""

    def __init__(self, change: str | None = None) -> None:
        self.change = change

    def model(self) -> nn.Module:
        model = super().model()
        for kind in BUFFER_KINDS:
            model.backbone.register_buffer(f"kind_{kind}", KINDS[kind](0))
        return model

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        if self.change is not None:
            setattr(state.model.backbone, f"kind_{self.change}", changed(KINDS[self.change](0))[0])
        return super().step(state, batch)


@pytest.mark.parametrize("change", [None, *BUFFER_KINDS])
def test_frozen_buffers_of_every_kind_are_read_as_every_check_reads_them(change: str | None) -> None:
    result = tp.check_frozen(FrozenKinds(change), steps=1)
    if change is None:
        assert result.passed, result.report()
        assert "and 13 buffers" in result.notes[0]
    else:
        assert found(result) == [("frozen_buffer_changed", f"buffers.backbone.kind_{change}", 1,
                                  "frozen_buffer_changed")], result.report()
        assert result.report().isascii()


def test_declared_globs_select_parameters_and_buffers() -> None:
    result = tp.check_frozen(recipes.BackboneInTrainMode, frozen=["backbone.0.*"])
    assert result.passed, result.report()  # the BatchNorm is not declared frozen
    result = tp.check_frozen(recipes.BackboneInTrainMode, frozen=("backbone.0.*", "backbone.1.running_*"))
    assert [v.path for v in result.violations] == ["buffers.backbone.1.running_mean", "buffers.backbone.1.running_var"]
    assert result.config["frozen"] == ["backbone.0.*", "backbone.1.running_*"]


def test_in_a_child_process_the_result_is_the_same() -> None:
    inprocess = tp.check_frozen(recipes.StaleGradient)
    child = tp.check_frozen(recipes.StaleGradient, isolation="process", timeout=60)
    assert child.report() == inprocess.report().replace("isolation='inprocess'", "isolation='process'")


def test_the_trace_survives_the_wire_format(tmp_path: Any) -> None:
    from trainparity._preflight._frozen import FrozenPayload
    from trainparity._process._engine import Job, run_jobs
    from trainparity._process._options import Deadline
    from trainparity._recipe._reference import resolve_recipe

    job = Job("trainparity._preflight._frozen:frozen_run", FrozenPayload(resolve_recipe(recipes.StaleGradient), 2, 0),
              "training", record=FrozenTrace)
    output = run_jobs([job], deadline=Deadline.after(60), isolation="inprocess")[0].output
    assert isinstance(output, FrozenTrace) and output.watch.events
    dump(output, tmp_path / "trace")
    assert repr(read(FrozenTrace, load(tmp_path / "trace"), "trace")) == repr(output)


# -- misuse, errors, surfaces -------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"steps": 0}, ValueError, "steps= must be an int >= 1"),
    ({"frozen": 3}, TypeError, "frozen= must be a glob or a list of globs"),
    ({"frozen": ["backbone.*", None]}, TypeError, "frozen= must be a glob or a list of globs"),
    ({"frozen": []}, ValueError, "frozen= must hold at least one non-empty glob"),
    ({"frozen": "backbone"}, ValueError,
     r"frozen=: 'backbone' matches no parameter or buffer of the State; did you mean 'backbone\.\*' \(it matches 7\)"),
    ({"frozen": "backbon.0.wieght"}, ValueError, "the closest are 'backbone.0.weight'"),
    ({"seed": "0"}, TypeError, "seed= must be an int"),
    ({"isolation": "thread"}, ValueError, "isolation= must be one of"),
])
def test_misuse_raises_naming_the_fix(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        tp.check_frozen(recipes.FrozenBackbone, **kwargs)


def test_a_state_without_a_module_is_refused() -> None:
    with pytest.raises(ValueError, match=r"the State holds no nn.Module: put the model in the State"):
        tp.check_frozen(recipes.NoModule)
    with pytest.raises(ValueError, match=r"the State holds no nn.Module"):
        tp.check_frozen(recipes.NoModule, isolation="process", timeout=60)


def test_a_recipe_that_raises_is_an_error_with_the_live_exception() -> None:
    result = tp.check_frozen(recipes.Raises)
    assert result.outcome is tp.Outcome.ERROR and isinstance(result.exception, ValueError)
    assert result.error is not None and result.error.phase == "training"
    with pytest.raises(ValueError, match="the data pipeline broke"):
        tp.assert_frozen(recipes.Raises)
    child = tp.check_frozen(recipes.Raises, isolation="process", timeout=60)
    assert child.outcome is tp.Outcome.ERROR and "the data pipeline broke" in child.report()
    assert "Traceback from the recipe:" in child.report()


def test_assertions_and_json() -> None:
    assert tp.assert_frozen(recipes.FrozenBackbone).passed
    with pytest.raises(AssertionError) as caught:
        tp.assert_frozen(recipes.StaleGradient, msg="the fine-tuning loop")
    text = str(caught.value)
    assert text.startswith(
        "trainparity frozen check: FAIL at parameters.backbone.0.weight (frozen_param_changed, step 1)")
    assert text.endswith("\n\nthe fine-tuning loop")
    document = json.loads(tp.check_frozen(recipes.BackboneInTrainMode).to_json())
    assert document["check"] == "frozen" and document["first_violation"]["cause"] == "frozen_module_in_train_mode"
    assert document["counts"] == {"frozen_buffer_changed": 3}


def test_nothing_is_left_patched_after_the_check() -> None:
    from torch import nn

    tp.check_frozen(recipes.BackboneInTrainMode)
    assert "training" not in vars(nn.Module)
    import torch.nn.functional as F

    assert F.dropout.__module__ == "torch.nn.functional"


@pytest.mark.parametrize(("argv", "status", "headline"), [
    (["frozen", "mode_recipes:FrozenBackbone"], 0, "trainparity frozen check: PASS"),
    (["frozen", "mode_recipes:StaleGradient", "--steps", "1"], 1,
     "trainparity frozen check: FAIL at parameters.backbone.0.weight (frozen_param_changed, step 1)"),
    (["frozen", "mode_recipes:FrozenStagesNeverApplied", "--frozen", "0.stages.0.*", "--frozen", "1.*"], 1,
     "trainparity frozen check: FAIL at parameters.0.stages.0.0.weight (frozen_param_trainable, step 1)"),
    (["frozen", "mode_recipes:NothingFrozen"], 2, "trainparity frozen check: ABSTAIN"),
    (["frozen", "mode_recipes:Raises"], 3, "trainparity frozen check: ERROR"),
])
def test_command_line(argv: list[str], status: int, headline: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(argv) == status
    assert capsys.readouterr().out.startswith(headline + "\n")


def test_command_line_misuse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(["frozen", "mode_recipes:FrozenBackbone", "--frozen", "head"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("python -m trainparity frozen: error: frozen=: 'head' matches no parameter") and (
        err.count("\n") == 1)
    assert main(["frozen", "mode_recipes:FrozenBackbone", "--steps", "0"]) == 4
