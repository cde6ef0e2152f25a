"""Snapshots of the preflight checks' reports: the form users read and pin with expecttest."""

from __future__ import annotations

import warnings

import autocast_recipes
import preflight_recipes as recipes
import pytest

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


class TestPreflightReports(tp.TestCase):
    def test_optimizer_for_another_copy_of_the_model(self) -> None:
        self.assertExpectedInline(tp.check_optimizer_coverage(recipes.OptimizerForCopy).report(), """\
trainparity optimizer_coverage check: FAIL at optimizer (optimizer_for_other_model, step 0)
config: isolation='inprocess', recipe='preflight_recipes:OptimizerForCopy', seed=0, steps=1

First violation: optimizer (step 0, kind: optimizer_for_other_model, cause: optimizer_for_other_model)
  Optimizer 'optimizer' right after setup(): none of its 4 parameters belongs to a module (or is a tensor entry) of the State (optimizer.param_groups.0 positions 0, 1, 2, 3; shapes [16, 8], [16], [1, 16], [1]). Stepping them changes nothing the State trains.
  Its parameters have the shapes of State parameters that no optimizer holds: it was built for another copy of the model (one rebuilt, deep-copied or reloaded after the optimizer was created). Build the optimizer from the model that the State holds.
  expected: 0
  actual:   4

All violations (5):
  1. optimizer (step 0, kind: optimizer_for_other_model, cause: optimizer_for_other_model)
  2. parameters.0.weight (step 0, kind: param_not_optimized, cause: optimizer_for_other_model)
  3. parameters.0.bias (step 0, kind: param_not_optimized, cause: optimizer_for_other_model)
  4. parameters.2.weight (step 0, kind: param_not_optimized, cause: optimizer_for_other_model)
  5. parameters.2.bias (step 0, kind: param_not_optimized, cause: optimizer_for_other_model)""")

    def test_param_without_grad(self) -> None:
        self.assertExpectedInline(tp.check_optimizer_coverage(recipes.UnusedHead, steps=2).report(), """\
trainparity optimizer_coverage check: FAIL at gradients.aux.weight (param_without_grad, step 1)
config: isolation='inprocess', recipe='preflight_recipes:UnusedHead', seed=0, steps=2

First violation: gradients.aux.weight (step 1, kind: param_without_grad, cause: param_without_grad)
  Parameter 'aux.weight' requires grad and an optimizer holds it, but no gradient reached it in steps 1, 2 (of 2 with a backward pass): it took no part in the loss. DistributedDataParallel then fails ('Expected to have finished reduction in the prior iteration') unless find_unused_parameters=True; use it in the loss, freeze it, or remove it from the model.
  expected: 2
  actual:   0

All violations (2):
  1. gradients.aux.weight (step 1, kind: param_without_grad, cause: param_without_grad)
  2. gradients.aux.bias (step 1, kind: param_without_grad, cause: param_without_grad)""")

    def test_skipped_steps_with_the_loss_scale_trace(self) -> None:
        self.assertExpectedInline(tp.check_mixed_precision(recipes.NanLoss).report(), """\
trainparity mixed_precision check: FAIL at loss (nonfinite_loss, step 2)
config: isolation='inprocess', max_skipped_steps=None, recipe='preflight_recipes:NanLoss', seed=0, steps=4

First violation: loss (step 2, kind: nonfinite_loss, cause: nonfinite_loss)
  step() returned a non-finite loss (-inf) at step 2: the forward pass produced an inf or a NaN, so its gradients are not finite either. Find where (torch.autograd.set_detect_anomaly, a log of 0, a division by a zero count, an overflow in float16).
  Also at steps 3, 4.
  expected: 'finite'
  actual:   '-inf'

All violations (2):
  1. loss (step 2, kind: nonfinite_loss, cause: nonfinite_loss)
  2. scaler.scale (step 4, kind: skipped_steps, cause: skipped_steps)

Notes:
  - GradScaler 'scaler': Loss scale at each scaler.step(): 1024 (step 1), 1024 (step 2, skipped), 512 (step 3, skipped), 256 (step 4, skipped); after the last update(): 128.""")

    def test_scaler_step_bypassed(self) -> None:
        self.assertExpectedInline(tp.check_mixed_precision(recipes.StepsOptimizerDirectly, steps=2).report(), """\
trainparity mixed_precision check: FAIL at optimizer (scaler_step_bypassed, step 1)
config: isolation='inprocess', max_skipped_steps=None, recipe='preflight_recipes:StepsOptimizerDirectly', seed=0, steps=2

First violation: optimizer (step 1, kind: scaler_step_bypassed, cause: scaler_step_bypassed)
  Optimizer 'optimizer' stepped in step 1 outside scaler.step(), on gradients GradScaler 'scaler' still scaled by 1024 (an update that many times too large): steps whose gradients hold an inf or a NaN are not skipped, and the loss scale never adapts. Call scaler.step(optimizer) instead of optimizer.step(), then scaler.update().
  Also at step 2.""")

    def test_nonfinite_gradients_stepped_come_before_the_parameters_they_made_nonfinite(self) -> None:
        self.assertExpectedInline(tp.check_mixed_precision(recipes.InfiniteGradientsInClosure, steps=1).report(), """\
trainparity mixed_precision check: FAIL at gradients.0.weight (nonfinite_grads_stepped, step 1)
config: isolation='inprocess', max_skipped_steps=None, recipe='preflight_recipes:InfiniteGradientsInClosure', seed=0, steps=1

First violation: gradients.0.weight (step 1, kind: nonfinite_grads_stepped, cause: nonfinite_grads_stepped)
  Optimizer 'optimizer' stepped in step 1 on gradients holding an inf or a NaN (of 0.weight): the parameters it updates become non-finite; skip such steps (an enabled GradScaler's scaler.step() does), or find where they come from.

All violations (2):
  1. gradients.0.weight (step 1, kind: nonfinite_grads_stepped, cause: nonfinite_grads_stepped)
  2. parameters.0.weight (step 1, kind: nonfinite_params, cause: nonfinite_grads_stepped)

Notes:
  - The State holds no enabled torch.amp.GradScaler: the scaler's contract (scaler_step_bypassed, scaler_update_missing, clip_before_unscale, skipped_steps) was not judged, only non-finite values.""")

    def test_nonfinite_gradients_made_after_unscale_are_named_at_the_step_scaler_step_took(self) -> None:
        report = tp.check_mixed_precision(recipes.NormalizesGradientsAfterUnscale, steps=2).report()
        self.assertExpectedInline(report, """\
trainparity mixed_precision check: FAIL at gradients.branch.weight (nonfinite_grads_stepped, step 1)
config: isolation='inprocess', max_skipped_steps=None, recipe='preflight_recipes:NormalizesGradientsAfterUnscale', seed=0, steps=2

First violation: gradients.branch.weight (step 1, kind: nonfinite_grads_stepped, cause: nonfinite_grads_stepped)
  Optimizer 'optimizer' stepped in step 1 inside scaler.step() on gradients holding an inf or a NaN (of branch.weight, branch.bias): the parameters it updates become non-finite; GradScaler 'scaler' found no inf or NaN when it checked them in scaler.unscale_(), and scaler.step() trusts that check: they became non-finite after it, between scaler.unscale_() and scaler.step() (a division by the norm of an all-zero gradient, say). Keep them finite there (an eps in the division).

All violations (4):
  1. gradients.branch.weight (step 1, kind: nonfinite_grads_stepped, cause: nonfinite_grads_stepped)
  2. parameters.branch.weight (step 1, kind: nonfinite_params, cause: nonfinite_grads_stepped)
  3. parameters.branch.bias (step 1, kind: nonfinite_params, cause: nonfinite_grads_stepped)
  4. loss (step 2, kind: nonfinite_loss, cause: nonfinite_loss)

Notes:
  - GradScaler 'scaler': Loss scale at each scaler.step(): 1024 (step 1), 1024 (step 2, skipped); after the last update(): 512.""")

    def test_autocast_on_the_wrong_device(self) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "CUDA is not available")
            report = tp.check_mixed_precision(autocast_recipes.WrongDevice, steps=2).report()
        self.assertExpectedInline(report, """\
trainparity mixed_precision check: FAIL at autocast.Bf16.loss (autocast_ineffective, step 1)
config: autocast_dtype='torch.bfloat16', isolation='inprocess', max_skipped_steps=None, recipe='autocast_recipes:WrongDevice', seed=0, steps=2

First violation: autocast.Bf16.loss (step 1, kind: autocast_ineffective, cause: autocast_ineffective)
  autocast(device_type='cuda', dtype=torch.float16) entered in Bf16.loss (test/autocast_recipes.py:40) only changes ops on cuda tensors, but its 2 matmul, convolution or attention ops (addmm) ran on cpu tensors, in torch.float32; torch turned the region off (no usable cuda device here). Autocast on the tensors' device: torch.autocast('cpu', dtype=torch.bfloat16), e.g. torch.autocast(x.device.type, ...).
  Also at step 2.
  expected: 'torch.bfloat16'
  actual:   'torch.float32'

Notes:
  - The State holds no enabled torch.amp.GradScaler: the scaler's contract (scaler_step_bypassed, scaler_update_missing, clip_before_unscale, skipped_steps) was not judged, only non-finite values.""")

    def test_autocast_turned_off_for_the_whole_forward(self) -> None:
        self.assertExpectedInline(tp.check_mixed_precision(autocast_recipes.ForwardDecoratedDisabled,
                                                           steps=1).report(), """\
trainparity mixed_precision check: FAIL at autocast.Bf16.loss (autocast_ineffective, step 1)
config: autocast_dtype='torch.bfloat16', isolation='inprocess', max_skipped_steps=None, recipe='autocast_recipes:ForwardDecoratedDisabled', seed=0, steps=1

First violation: autocast.Bf16.loss (step 1, kind: autocast_ineffective, cause: autocast_ineffective)
  autocast(device_type='cpu', dtype=torch.bfloat16) entered in Bf16.loss (test/autocast_recipes.py:40): its 2 matmul, convolution or attention ops (addmm) all ran with autocast turned off inside it, by autocast(device_type='cpu', dtype=torch.bfloat16, enabled=False) applied as a decorator to DisabledForward.forward (test/autocast_recipes.py:173), in torch.float32. Remove the nested region, or narrow it to the op that must run in full precision.
  expected: 'torch.bfloat16'
  actual:   'torch.float32'

All violations (3):
  1. autocast.Bf16.loss (step 1, kind: autocast_ineffective, cause: autocast_ineffective)
  2. modules.0 (step 1, kind: autocast_bypassed, cause: autocast_bypassed)
  3. modules.2 (step 1, kind: autocast_bypassed, cause: autocast_bypassed)

Notes:
  - The State holds no enabled torch.amp.GradScaler: the scaler's contract (scaler_step_bypassed, scaler_update_missing, clip_before_unscale, skipped_steps) was not judged, only non-finite values.""")

    def test_float32_head_inside_autocast(self) -> None:
        self.assertExpectedInline(tp.check_mixed_precision(autocast_recipes.Float32Head, steps=2).report(), """\
trainparity mixed_precision check: FAIL at modules.head (autocast_bypassed, step 1)
config: autocast_dtype='torch.bfloat16', isolation='inprocess', max_skipped_steps=None, recipe='autocast_recipes:Float32Head', seed=0, steps=2

First violation: modules.head (step 1, kind: autocast_bypassed, cause: autocast_bypassed)
  Module 'head' ran 2 calls of addmm in torch.float32 inside autocast(device_type='cpu', dtype=torch.bfloat16) entered in Bf16.loss (test/autocast_recipes.py:40), with autocast turned off by autocast(device_type='cpu', dtype=torch.bfloat16, enabled=False) entered in Net.forward (test/autocast_recipes.py:292): 0.654% of the FLOPs of the matmul, convolution or attention ops in enabled autocast regions (256 of 39168; in all 0.654% ran in full precision). At most 0.0% may run in full precision (max_float32_share=0.0) outside the modules allow_float32 names (none). If it is deliberate (a float32 attention, say), allow it with allow_float32=('head',).
  expected: 0.0
  actual:   0.00653595

Notes:
  - The State holds no enabled torch.amp.GradScaler: the scaler's contract (scaler_step_bypassed, scaler_update_missing, clip_before_unscale, skipped_steps) was not judged, only non-finite values.""")

    def test_float32_head_allowed(self) -> None:
        result = tp.check_mixed_precision(autocast_recipes.Float32Head, steps=2, allow_float32=("head",))
        self.assertExpectedInline(result.report(), """\
trainparity mixed_precision check: PASS
config: allow_float32=['head'], autocast_dtype='torch.bfloat16', isolation='inprocess', max_skipped_steps=None, recipe='autocast_recipes:Float32Head', seed=0, steps=2

Notes:
  - The State holds no enabled torch.amp.GradScaler: the scaler's contract (scaler_step_bypassed, scaler_update_missing, clip_before_unscale, skipped_steps) was not judged, only non-finite values.
  - Full-precision ops in enabled autocast regions: Module 'head' ran 2 calls of addmm in torch.float32 inside autocast(device_type='cpu', dtype=torch.bfloat16) entered in Bf16.loss (test/autocast_recipes.py:40), with autocast turned off by autocast(device_type='cpu', dtype=torch.bfloat16, enabled=False) entered in Net.forward (test/autocast_recipes.py:292) (0.654% of the FLOPs; allowed by allow_float32 'head'). Outside the modules allow_float32 names, 0.0% of the FLOPs ran in full precision (max_float32_share=0.0).""")
