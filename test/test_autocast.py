"""Autocast coverage in `check_mixed_precision`: each everyday form of autocast that does nothing FAILs naming its
region and cause, its fixed twin PASSes, and the watch leaves nothing behind."""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import autocast_recipes as recipes
import preflight_recipes
import pytest
import torch
from autocast_lm import FAULTS, AutocastLM

import trainparity as tp
from trainparity._observe._autocast import AUTOCAST, AutocastUse, AutocastWatch, Bypass, RegionRequests, _display
from trainparity._preflight._autocast import AutocastRules, _bypass_violations, _Group
from trainparity._preflight._mixed_precision import PrecisionTrace
from trainparity._process._wire import dump, load
from trainparity._records import read

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals,
              pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")]


def at(function: Any, text: str) -> str:
    """`test/autocast_recipes.py:N`: where `text` first appears in `function`'s source (a region's `with` line)."""
    lines, start = inspect.getsourcelines(function)
    return f"test/autocast_recipes.py:{start + next(i for i, line in enumerate(lines) if text in line)}"


def first(result: tp.Result) -> tuple[str, str, int | None]:
    violation = result.first_violation
    assert violation is not None, result.report()
    return violation.path, violation.kind, violation.step


def autocast_notes(result: tp.Result) -> list[str]:
    return [note for note in result.notes if "GradScaler" not in note]


@pytest.mark.parametrize("recipe", [
    recipes.Bf16, recipes.DeclaredBf16, recipes.DeclaredBf16Model, recipes.FloatInputs, recipes.Checkpointed,
    recipes.CustomFwdKeepsAutocast, recipes.NetBf16, AutocastLM, preflight_recipes.Amp, preflight_recipes.MLP,
])
def test_clean_recipes_and_fixed_twins_pass_without_an_autocast_note(recipe: type[tp.Recipe]) -> None:
    result = tp.check_mixed_precision(recipe, steps=2)
    assert result.passed, result.report()
    assert autocast_notes(result) == []


@pytest.mark.parametrize(("recipe", "path", "says"), [
    (recipes.WrongDevice, "autocast.Bf16.loss",
     f"autocast(device_type='cuda', dtype=torch.float16) entered in Bf16.loss ({at(recipes.Bf16.loss, 'with')}) only "
     "changes ops on cuda tensors, but its 2 matmul, convolution or attention ops (addmm) ran on cpu tensors, in "
     "torch.float32; torch turned the region off (no usable cuda device here)"),
    # made once in setup(), entered by each step(): judged as the same region made in step()
    (recipes.WrongDeviceMadeInSetup, "autocast.Bf16.loss",
     f"autocast(device_type='cuda', dtype=torch.float16) entered in Bf16.loss ({at(recipes.Bf16.loss, 'with')}) only "
     "changes ops on cuda tensors, but its 2 matmul, convolution or attention ops (addmm) ran on cpu tensors, in "
     "torch.float32; torch turned the region off (no usable cuda device here)"),
    # made when its class was defined: the declared dtype judges it, and its message claims nothing about `enabled`
    (recipes.CudaDecoratedForwardDeclared, "autocast.CudaAutocastForward.forward",
     "autocast(device_type='cuda', dtype=torch.float16) applied as a decorator to CudaAutocastForward.forward ("
     f"{at(recipes.CudaAutocastForward.forward, '@torch.autocast')}) only changes ops on cuda tensors, but its 2 "
     "matmul, convolution or attention ops (addmm) ran on cpu tensors, in torch.float32; torch turned the region off"),
    (recipes.FlagOff, "autocast.Bf16.loss", "is disabled as written (enabled=False, often read from a config flag), "
     "while the recipe declares autocast_dtype=torch.bfloat16"),
    (recipes.DeclaredWithoutAutocast, "autocast", "The recipe declares autocast_dtype=torch.bfloat16, but none of the "
     "2 matmul, convolution or attention ops of step() ran in a low dtype (torch.float32): step() entered no "
     "autocast region."),
    (recipes.ForwardDecoratedDisabled, "autocast.Bf16.loss", "all ran with autocast turned off inside it, by "
     "autocast(device_type='cpu', dtype=torch.bfloat16, enabled=False) applied as a decorator to "
     "DisabledForward.forward"),
    (recipes.CustomFwdFloat32, "autocast.Bf16.loss", "all ran with autocast turned off inside it, by "
     "custom_fwd(cast_inputs=torch.float32) on CastsToFloat32.forward"),
    (recipes.Float64, "autocast.Float64.loss", "ran in torch.float64; autocast never lowers float64 inputs"),
])
def test_autocast_that_does_nothing_is_ineffective(recipe: type[tp.Recipe], path: str, says: str) -> None:
    result = tp.check_mixed_precision(recipe, steps=2)
    assert result.outcome is tp.Outcome.FAIL
    assert first(result) == (path, "autocast_ineffective", 1)
    violation = result.violations[0]
    assert says in violation.message, violation.message
    assert violation.cause == "autocast_ineffective" and violation.message.endswith("Also at step 2.")
    # the declared dtype, else the region's own
    assert violation.expected == ("torch.float16" if recipe is recipes.WrongDeviceMadeInSetup else "torch.bfloat16")


@pytest.mark.parametrize(("fault", "path", "kind"), [
    ("autocast_on_wrong_device", "autocast.AutocastLM.step", "autocast_ineffective"),
    ("amp_flag_off", "autocast.AutocastLM.step", "autocast_ineffective"),
    ("forward_autocast_disabled", "autocast.AutocastLM.step", "autocast_ineffective"),
    ("custom_fwd_float32", "autocast.AutocastLM.step", "autocast_ineffective"),
    ("attention_in_float32", "modules.attn", "autocast_bypassed"),
])
def test_the_example_language_models_faults(fault: str, path: str, kind: str) -> None:
    assert fault in FAULTS
    result = tp.check_mixed_precision(AutocastLM(fault=fault), steps=2)
    assert first(result) == (path, kind, 1)


def test_a_nested_region_that_covers_everything_also_names_each_module() -> None:
    result = tp.check_mixed_precision(recipes.ForwardDecoratedDisabled, steps=2)
    assert [(v.path, v.kind) for v in result.violations] == [
        ("autocast.Bf16.loss", "autocast_ineffective"), ("modules.0", "autocast_bypassed"),
        ("modules.2", "autocast_bypassed")]


def test_float32_inside_a_region_is_a_bypass_named_by_module() -> None:
    result = tp.check_mixed_precision(recipes.Float32Head, steps=2)
    assert [(v.path, v.kind, v.step) for v in result.violations] == [("modules.head", "autocast_bypassed", 1)]
    violation = result.violations[0]
    assert violation.message.startswith(
        "Module 'head' ran 2 calls of addmm in torch.float32 inside autocast(device_type='cpu', dtype=torch.bfloat16) "
        f"entered in Bf16.loss ({at(recipes.Bf16.loss, 'with')}), with autocast turned off by "
        "autocast(device_type='cpu', dtype=torch.bfloat16, enabled=False) entered in Net.forward")
    assert "If it is deliberate (a float32 attention, say), allow it with allow_float32=('head',)." in violation.message
    assert violation.expected == 0.0 and 0.0 < violation.actual < 0.1  # type: ignore[operator]
    attention = tp.check_mixed_precision(recipes.Float32Attention, steps=2)
    assert first(attention) == ("modules.model", "autocast_bypassed", 1)
    assert "calls of _scaled_dot_product_flash_attention_for_cpu in torch.float32" in attention.violations[0].message


def test_allow_float32_and_max_float32_share_turn_a_bypass_into_a_note() -> None:
    allowed = tp.check_mixed_precision(recipes.Float32Head, steps=2, allow_float32=("he*",))
    assert allowed.passed, allowed.report()
    assert allowed.config["allow_float32"] == ["he*"]
    [note] = autocast_notes(allowed)
    assert "; allowed by allow_float32 'he*')" in note and note.endswith(
        "Outside the modules allow_float32 names, 0.0% of the FLOPs ran in full precision (max_float32_share=0.0).")
    within = tp.check_mixed_precision(recipes.Float32Head, steps=2, max_float32_share=0.5)
    assert within.passed and within.config["max_float32_share"] == 0.5
    assert "(max_float32_share=0.5)" in autocast_notes(within)[0]
    assert not tp.check_mixed_precision(recipes.Float32Head, steps=2, max_float32_share=0.001).passed
    # a glob that names a module allows its submodules too
    assert tp.check_mixed_precision(AutocastLM(fault="attention_in_float32"), steps=1, allow_float32="att*").passed


def test_a_disabled_region_without_a_declared_dtype_is_a_note() -> None:
    result = tp.check_mixed_precision(recipes.FlagOffUndeclared, steps=2)
    assert result.passed
    assert autocast_notes(result) == [
        "autocast(device_type='cpu', dtype=torch.bfloat16, enabled=False) entered in Bf16.loss "
        f"({at(recipes.Bf16.loss, 'with')}) is disabled (enabled=False): its 2 matmul, convolution or attention ops "
        "(addmm) ran in torch.float32. Declare autocast_dtype on the recipe to fail runs in which autocast does "
        "nothing."]


def test_a_region_that_runs_no_matmul_is_a_note() -> None:
    result = tp.check_mixed_precision(recipes.LossOnlyRegion, steps=1)
    assert result.passed
    assert autocast_notes(result) == [
        "autocast(device_type='cpu', dtype=torch.bfloat16) entered in LossOnlyRegion.loss "
        f"({at(recipes.LossOnlyRegion.loss, 'with')}) ran no matmul, convolution or attention op that autocast lowers: "
        "it changed nothing there."]


def test_autocast_comes_before_the_scaler_findings_of_the_same_step() -> None:
    result = tp.check_mixed_precision(recipes.WrongDeviceClipsBeforeUnscale, steps=1)
    assert [(v.kind, v.step) for v in result.violations] == [("autocast_ineffective", 1),
                                                             ("clip_before_unscale", 1)]


def test_in_a_child_process_the_result_is_the_same() -> None:
    inprocess = tp.check_mixed_precision(recipes.FlagOff, steps=2)
    child = tp.check_mixed_precision(recipes.FlagOff, steps=2, isolation="process", timeout=120)
    assert child.violations == inprocess.violations and child.notes == inprocess.notes


@pytest.mark.parametrize("recipe", [recipes.RaisesInRegion, recipes.RaisesInAModuleForward])
def test_the_watch_leaves_nothing_behind_when_the_recipe_raises_inside_a_region(recipe: type[tp.Recipe]) -> None:
    methods = {name: vars(AUTOCAST)[name] for name in ("__init__", "__enter__", "__exit__")}
    result = tp.check_mixed_precision(recipe, steps=1)
    assert result.outcome is tp.Outcome.ERROR and isinstance(result.exception, ValueError)
    assert {name: vars(AUTOCAST)[name] for name in methods} == methods
    assert torch._C._len_torch_dispatch_stack() == 0
    assert not torch.is_autocast_enabled("cpu")


def test_a_region_made_before_the_check_and_turned_off_by_torch_is_a_note_without_a_declared_dtype() -> None:
    result = tp.check_mixed_precision(recipes.CudaDecoratedForward, steps=2)
    assert result.passed, result.report()
    assert autocast_notes(result) == [
        "autocast(device_type='cuda', dtype=torch.float16) applied as a decorator to CudaAutocastForward.forward "
        f"({at(recipes.CudaAutocastForward.forward, '@torch.autocast')}) was made before the check started and torch "
        "turned it off (no usable cuda device, or torch.float16 unsupported there), so whether it is enabled as "
        "written cannot be told: its 2 matmul, convolution or attention ops (addmm) ran in torch.float32. Declare "
        "autocast_dtype on the recipe to fail runs in which autocast does nothing."]


def test_a_region_disabled_as_written_beside_one_that_lowers_is_judged_as_a_nested_one() -> None:
    # the "loss in float32" form: the head's ops are bypasses, as under a nested autocast(enabled=False) ...
    head = tp.check_mixed_precision(recipes.Float32Loss, steps=2)
    assert [(v.path, v.kind, v.step) for v in head.violations] == [("modules.2", "autocast_bypassed", 1)]
    assert head.violations[0].message.startswith(
        "Module '2' ran 2 calls of addmm in torch.float32 inside autocast(device_type='cpu', dtype=torch.bfloat16, "
        f"enabled=False) entered in Float32Loss.loss ({at(recipes.Float32Loss.loss, 'enabled=False')}), a region "
        "disabled as written in a step whose other ops ran in a low dtype: ")
    assert "ops in enabled autocast regions and in the regions disabled as written beside them" in \
        head.violations[0].message
    # ... so a deliberate one is allowed by name
    allowed = tp.check_mixed_precision(recipes.Float32Loss, steps=2, allow_float32="2")
    assert allowed.passed, allowed.report()
    # and the flag-off form beside a lowered head fails on the body it left in float32
    body = tp.check_mixed_precision(recipes.FlagOffBesideLoweredHead, steps=2)
    assert [(v.path, v.kind, v.step) for v in body.violations] == [("modules.0", "autocast_bypassed", 1)]
    # the same region as the only one of a declared recipe's step is ineffective (the flag-off form)
    assert first(tp.check_mixed_precision(recipes.FlagOff, steps=1)) == ("autocast.Bf16.loss", "autocast_ineffective",
                                                                          1)


def test_a_module_reached_from_two_entries_is_named_once() -> None:
    aliased = tp.check_mixed_precision(recipes.Float32AttentionAliased, steps=2)
    plain = tp.check_mixed_precision(recipes.Float32Attention, steps=2)
    assert [(v.path, v.kind, v.step) for v in aliased.violations] == [
        (v.path, v.kind, v.step) for v in plain.violations] == [("modules.model", "autocast_bypassed", 1)]


def test_at_the_default_maximum_a_bypass_of_uncounted_flops_still_fails() -> None:
    # torch's FLOP formula cannot always read an op's arguments: such a bypass has 0 FLOPs, a share of 0
    bypass = Bypass("head", "a region", "Recipe.loss", None, "torch.float32", ["mm"], calls=1, flops=0)
    rules = AutocastRules.validate(torch.bfloat16, None, 0.0)
    violations, notes = _bypass_violations([_Group(bypass, 1)], 0, rules)
    assert [(v.path, v.kind) for v in violations] == [("modules.head", "autocast_bypassed")] and notes == []
    assert "ran 1 call of mm in torch.float32 inside a region; its inputs were torch.float64, which autocast never " \
           "lowers: FLOPs that torch's formula cannot count, so at max_float32_share=0 they fail whatever the share." \
           in violations[0].message
    allowed = AutocastRules.validate(torch.bfloat16, None, 0.5)
    assert _bypass_violations([_Group(bypass, 1)], 0, allowed)[0] == []


def test_locations_follow_the_working_directory(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    source = str(tmp_path / "train.py")
    monkeypatch.chdir(tmp_path)
    assert _display(source, 3) == "train.py:3"
    monkeypatch.chdir(tmp_path.parent)
    assert _display(source, 3) == f"{tmp_path.name}{os.sep}train.py:3"


def test_the_watch_records_regions_ops_and_modules_and_take_starts_afresh() -> None:
    model = recipes.Net(float32_head=True)
    with RegionRequests() as requests, AutocastWatch(tp.State(model=model), None, requests) as watch:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(4, 8))
        use = watch.take()
        assert watch.take() == AutocastUse()
    assert [(r.function, r.requested, r.enabled, r.outermost) for r in use.regions] == [
        ("test_the_watch_records_regions_ops_and_modules_and_take_starts_afresh", True, True, True),
        ("Net.forward", True, True, False), ("Net.forward", False, False, False)]
    outer = use.regions[0]
    assert (outer.ops, outer.low_ops, outer.op_names) == (4, 3, [
        "convolution", "mm", "_scaled_dot_product_flash_attention_for_cpu", "addmm"])
    assert [(b.module, b.ops, b.calls, b.dtype) for b in use.bypasses] == [("head", ["addmm"], 1, "torch.float32")]
    assert use.low_flops > 0 and use.flops_by_dtype["torch.float32"] == use.bypasses[0].flops == 2 * 4 * 8
    assert torch._C._len_torch_dispatch_stack() == 0


def test_traces_survive_the_wire_format(tmp_path: Any) -> None:
    from trainparity._preflight._mixed_precision import mixed_precision_run
    from trainparity._preflight._run import Preflight

    preflight = Preflight.prepare(recipes.Float32Head, steps=1, minimum_steps=1, seed=0, isolation=None,
                                  timeout=None)
    run = mixed_precision_run(preflight.payload, tmp_path)
    dump(run, tmp_path / "trace")
    trace = read(PrecisionTrace, load(tmp_path / "trace"), "trace")
    assert trace.steps[0].autocast == run.steps[0].autocast
    assert trace.steps[0].autocast.bypasses[0].module == "head"


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"allow_float32": 3}, TypeError, "allow_float32= must be None or module-name globs"),
    ({"allow_float32": ["attn", ""]}, TypeError, "allow_float32= must be None or module-name globs"),
    ({"max_float32_share": 1.5}, ValueError, r"max_float32_share= must be a number in \[0, 1\]"),
    ({"max_float32_share": True}, ValueError, r"max_float32_share= must be a number in \[0, 1\]"),
])
def test_misuse_raises_naming_the_fix(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        tp.check_mixed_precision(recipes.Bf16, **kwargs)


def test_a_declared_dtype_that_is_not_a_low_one_is_refused_before_anything_runs() -> None:
    with pytest.raises(TypeError, match=r"BadDeclaration.autocast_dtype must be None or the low dtype autocast should "
                                        r"run matmuls in \(torch.bfloat16 or torch.float16\), got torch.float32"):
        tp.check_mixed_precision(recipes.BadDeclaration)


def test_assertions_and_the_mixin_take_the_new_arguments() -> None:
    with pytest.raises(AssertionError, match="^trainparity mixed_precision check: FAIL at modules.head "
                                             r"\(autocast_bypassed, step 1\)"):
        tp.assert_mixed_precision_safe(recipes.Float32Head, steps=1)
    assert tp.assert_mixed_precision_safe(recipes.Float32Head, steps=1, allow_float32=["head"]).passed

    class Case(tp.TestCase):
        def runTest(self) -> None:
            self.assertMixedPrecisionSafe(recipes.Float32Head, steps=1, max_float32_share=0.5)
            with self.assertRaises(self.failureException):
                self.assertMixedPrecisionSafe(recipes.WrongDevice, steps=1)

    outcome = Case().run()
    assert outcome is not None and outcome.wasSuccessful(), outcome.failures + outcome.errors


def test_json_carries_the_new_kinds() -> None:
    document = json.loads(tp.check_mixed_precision(recipes.ForwardDecoratedDisabled, steps=1).to_json())
    assert document["counts"] == {"autocast_bypassed": 2, "autocast_ineffective": 1}
    assert document["first_violation"]["path"] == "autocast.Bf16.loss"
    assert document["config"]["autocast_dtype"] == "torch.bfloat16"


@pytest.mark.parametrize(("argv", "status", "headline"), [
    (["mixed-precision", "autocast_recipes:Float32Head", "--steps", "1"], 1,
     "trainparity mixed_precision check: FAIL at modules.head (autocast_bypassed, step 1)"),
    (["mixed-precision", "autocast_recipes:Float32Head", "--steps", "1", "--allow-float32", "x", "--allow-float32",
      "head"], 0, "trainparity mixed_precision check: PASS"),
    (["mixed-precision", "autocast_recipes:Float32Head", "--steps", "1", "--max-float32-share", "0.5"], 0,
     "trainparity mixed_precision check: PASS"),
])
def test_command_line(argv: list[str], status: int, headline: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(argv) == status
    assert capsys.readouterr().out.startswith(headline + "\n")


def test_command_line_misuse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(["mixed-precision", "autocast_recipes:Bf16", "--max-float32-share", "2"]) == 4
    assert "max_float32_share= must be a number in [0, 1]" in capsys.readouterr().err
