"""Snapshots of the frozen and train-mode checks' reports (and the optimizer coverage note on frozen parameters):
the form users read and pin with expecttest. Mode switches are quoted with their line in mode_recipes.py."""

from __future__ import annotations

import mode_recipes as recipes
import pytest

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


class TestFrozenReports(tp.TestCase):
    def test_a_stale_gradient_under_adamw(self) -> None:
        # The BatchNorm's affine parameters: their AdamW steps are the same to the last digit shown on every CPU
        # (a Linear weight near 0 has a relative change that rounding moves).
        result = tp.check_frozen(recipes.StaleGradient, frozen="backbone.1.*", steps=1)
        self.assertExpectedInline(result.report(), """\
trainparity frozen check: FAIL at parameters.backbone.1.weight (frozen_param_changed, step 1)
config: frozen=['backbone.1.*'], isolation='inprocess', recipe='mode_recipes:StaleGradient', seed=0, steps=1

First violation: parameters.backbone.1.weight (step 1, kind: frozen_param_changed, cause: frozen_param_changed)
  Parameter 'backbone.1.weight' (declared frozen) changed in step 1: optimizer 'optimizer' (AdamW) stepped it: its .grad is not None (all zeros: a gradient from before it was frozen, which zero_grad(set_to_none=False) zeroes but keeps), so the optimizer does not skip it, and its optimizer state from before the freeze (exp_avg, exp_avg_sq) and its group's weight_decay=0.01 moved it. Set its gradient to None when freezing it (p.grad = None, or optimizer.zero_grad() with the default set_to_none=True), or build the optimizer from the trainable parameters only.

  Tensor-likes are not equal!

  Mismatched elements: 16 / 16 (100.0%)
  Greatest absolute difference: 0.00679957 at index (1,)
  Greatest relative difference: 0.00686895 at index (1,)

All violations (2):
  1. parameters.backbone.1.weight (step 1, kind: frozen_param_changed, cause: frozen_param_changed)
  2. parameters.backbone.1.bias (step 1, kind: frozen_param_changed, cause: frozen_param_changed)

Notes:
  - Watched 2 parameters (backbone.1.weight, backbone.1.bias) and 3 buffers (backbone.1.running_mean, backbone.1.running_var, backbone.1.num_batches_tracked).""")

    def test_a_frozen_batchnorm_in_train_mode(self) -> None:
        self.assertExpectedInline(tp.check_frozen(recipes.BackboneInTrainMode, steps=1).report(), """\
trainparity frozen check: FAIL at buffers.backbone.1.running_mean (frozen_module_in_train_mode, step 1)
config: frozen=None, isolation='inprocess', recipe='mode_recipes:BackboneInTrainMode', seed=0, steps=1

First violation: buffers.backbone.1.running_mean (step 1, kind: frozen_buffer_changed, cause: frozen_module_in_train_mode)
  Buffer 'backbone.1.running_mean' of frozen BatchNorm1d 'backbone.1' changed in step 1: the module ran its forward in train mode and updated it (a BatchNorm's running statistics). Keep a frozen module in eval mode: call .eval() on it after every model.train(), or override the model's train() to do so (mmcv's norm_eval).

  Tensor-likes are not equal!

  Mismatched elements: 16 / 16 (100.0%)
  Greatest absolute difference: 0.0549414 at index (13,)
  Greatest relative difference: inf at index (0,)

All violations (3):
  1. buffers.backbone.1.running_mean (step 1, kind: frozen_buffer_changed, cause: frozen_module_in_train_mode)
  2. buffers.backbone.1.running_var (step 1, kind: frozen_buffer_changed, cause: frozen_module_in_train_mode)
  3. buffers.backbone.1.num_batches_tracked (step 1, kind: frozen_buffer_changed, cause: frozen_module_in_train_mode)

Notes:
  - Watched 4 parameters (backbone.0.weight, backbone.0.bias, backbone.1.weight, backbone.1.bias) and 3 buffers (backbone.1.running_mean, backbone.1.running_var, backbone.1.num_batches_tracked).""")

    def test_frozen_stages_never_applied(self) -> None:
        result = tp.check_frozen(recipes.FrozenStagesNeverApplied, frozen="0.stages.0.*", steps=1)
        self.assertExpectedInline(result.report(), """\
trainparity frozen check: FAIL at parameters.0.stages.0.0.weight (frozen_param_trainable, step 1)
config: frozen=['0.stages.0.*'], isolation='inprocess', recipe='mode_recipes:FrozenStagesNeverApplied', seed=0, steps=1

First violation: parameters.0.stages.0.0.weight (step 1, kind: frozen_param_trainable, cause: frozen_param_trainable)
  Parameter '0.stages.0.0.weight' is declared frozen, but it requires grad and held a gradient in step 1: nothing froze it. Freeze it where the model is built (requires_grad_(False)): a freeze applied only in train() never runs when nothing calls model.train() (mmpretrain issue 702).

All violations (4):
  1. parameters.0.stages.0.0.weight (step 1, kind: frozen_param_trainable, cause: frozen_param_trainable)
  2. parameters.0.stages.0.0.bias (step 1, kind: frozen_param_trainable, cause: frozen_param_trainable)
  3. parameters.0.stages.0.0.weight (step 1, kind: frozen_param_changed, cause: frozen_param_trainable)
  4. parameters.0.stages.0.0.bias (step 1, kind: frozen_param_changed, cause: frozen_param_trainable)

Notes:
  - Watched 2 parameters (0.stages.0.0.weight, 0.stages.0.0.bias).""")

    def test_the_optimizer_holds_every_parameter(self) -> None:
        self.assertExpectedInline(tp.check_optimizer_coverage(recipes.HoldsEveryParameter).report(), """\
trainparity optimizer_coverage check: PASS
config: isolation='inprocess', recipe='mode_recipes:HoldsEveryParameter', seed=0, steps=1

Notes:
  - Held but frozen: backbone.0.weight, backbone.0.bias, backbone.1.weight, backbone.1.bias: torch's optimizers skip a parameter while its .grad is None; check_frozen verifies it stays put.""")


class TestTrainModeReports(tp.TestCase):
    def test_eval_without_train(self) -> None:
        self.assertExpectedInline(tp.check_train_mode(recipes.EvalWithoutTrain).report(), """\
trainparity train_mode check: FAIL at modules.backbone.1 (module_left_in_eval, step 3)
config: eval_modules=None, isolation='inprocess', recipe='mode_recipes:EvalWithoutTrain', seed=0, steps=3

First violation: modules.backbone.1 (step 3, kind: module_left_in_eval, cause: module_left_in_eval)
  BatchNorm1d 'backbone.1' was in eval mode in the forward pass that built the loss at step 3: it normalized with its running statistics instead of the batch's and did not update them. It was set to eval mode by model.eval() in EvalWithoutTrain.evaluate (mode_recipes.py:246) in step 2, and nothing set it back: call model.train() after evaluating. If it is meant to stay in eval mode (a frozen BatchNorm), declare it: eval_modules=['backbone.1'].
  expected: 'train'
  actual:   'eval'

All violations (2):
  1. modules.backbone.1 (step 3, kind: module_left_in_eval, cause: module_left_in_eval)
  2. modules.head.0 (step 3, kind: module_left_in_eval, cause: module_left_in_eval)

Notes:
  - Modules whose behaviour depends on their mode: BatchNorm1d 'backbone.1', Dropout 'head.0'.""")

    def test_an_evaluation_under_no_grad_in_train_mode(self) -> None:
        self.assertExpectedInline(tp.check_train_mode(recipes.NoGradEvaluation, steps=2).report(), """\
trainparity train_mode check: FAIL at modules.backbone.1 (eval_in_train_mode, step 2)
config: eval_modules=None, isolation='inprocess', recipe='mode_recipes:NoGradEvaluation', seed=0, steps=2

First violation: modules.backbone.1 (step 2, kind: eval_in_train_mode, cause: eval_in_train_mode)
  The forward of 'model' at step 2 ran under torch.no_grad() with modules in train mode (BatchNorm1d 'backbone.1', Dropout 'head.0'): it updated the buffers backbone.1.running_mean, backbone.1.running_var, backbone.1.num_batches_tracked and it drew from torch's RNG stream of training (dropout in head.0). An evaluation in train mode changes the training that follows it (other running statistics, other dropout masks): call model.eval() before evaluating and model.train() after.
  expected: 'eval'
  actual:   'train'

Notes:
  - Modules whose behaviour depends on their mode: BatchNorm1d 'backbone.1', Dropout 'head.0'.""")

    def test_a_dropout_that_ignores_the_mode(self) -> None:
        self.assertExpectedInline(tp.check_train_mode(recipes.DropoutIgnoresMode, steps=2).report(), """\
trainparity train_mode check: FAIL at modules.1 (eval_in_train_mode, step 2)
config: eval_modules=None, isolation='inprocess', recipe='mode_recipes:DropoutIgnoresMode', seed=0, steps=2

First violation: modules.1 (step 2, kind: eval_in_train_mode, cause: eval_in_train_mode)
  The forward of 'model' at step 2 ran under torch.no_grad(): it drew from torch's RNG stream of training (dropout in 1). ExplicitDropout '1' is in eval mode, but its forward called F.dropout with training=True: pass training=self.training (transformers PR 33844). An evaluation that draws from it changes the dropout masks of the training that follows it.

Notes:
  - No module of the State read its mode (self.training) in a forward pass: nothing depends on it.""")
