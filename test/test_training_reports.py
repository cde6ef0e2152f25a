"""Snapshots of the training check's reports and tables: the form users read and pin with expecttest. The recipes
train in float64 (the GradScaler's in float16, whose report shows no loss), so the digits are the same on every CPU."""

from __future__ import annotations

import pytest
import training_recipes as recipes

import trainparity as tp

# A faulted recipe steps its scheduler before its optimizer on purpose; torch warns about it.
pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals,
              pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")]


class TestTrainingTables(tp.TestCase):
    def test_a_clipped_loop(self) -> None:
        self.assertExpectedInline(tp.check_training(recipes.Fit(clip=0.5), steps=4).table(), """\
step  loss   grad norm     update/param      lr                  note
1     4.219  1.987 -> 0.5  0.02581, 0.02095  0.003333, 0.003333
2     14.93  4.91 -> 0.5   0.04279, 0.03452  0.006667, 0.006667
3     5.281  2.789 -> 0.5  0.06115, 0.04197  0.01, 0.01
4     7.843  3.505 -> 0.5  0.05836, 0.04004  0.01, 0.01""")

    def test_two_optimizers(self) -> None:
        self.assertExpectedInline(tp.check_training(recipes.TwoOptimizers(), steps=2).table(), """\
step  loss   optimizer         grad norm  update/param  lr     note
1     4.219  first_optimizer   1.987      0.02025       0.05
             second_optimizer  1.713      0.007807      0.001
2     14.92  first_optimizer   4.916      0.05007       0.05
             second_optimizer  4.973      0.006422      0.001""")

    def test_calls_without_an_optimizer_step(self) -> None:
        self.assertExpectedInline(tp.check_training(recipes.Accumulates(), steps=4).table(), """\
step  loss   grad norm  update/param      lr                  note
1     4.219  -          -                 -                   no optimizer step
2     15.19  3.134      0.02581, 0.02095  0.003333, 0.003333
3     5.573  -          -                 -                   no optimizer step
4     8.768  2.842      0.04601, 0.03314  0.006667, 0.006667""")


class TestTrainingReports(tp.TestCase):
    def test_a_loss_that_does_not_decrease(self) -> None:
        result = tp.check_training(recipes.Fit("lr_zero"), steps=12, min_decrease=0.1)
        self.assertExpectedInline(result.report(), """\
trainparity training check: FAIL at loss (loss_not_decreasing, step 12)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=None, max_skipped_steps=None, min_decrease=0.1, overfit=False, overfit_fraction=0.1, recipe="training_recipes:Fit('lr_zero')", seed=0, steps=12, update_ratio=None, window=3

First violation: loss (step 12, kind: loss_not_decreasing, cause: loss_not_decreasing)
  The loss did not decrease over 12 steps: its median over steps 10-12 is 8.131, not below 5.18 (its median over steps 1-3, 5.756, less min_decrease=0.1 of it). No optimizer step changed a parameter (optimizer 'optimizer' group 0: its learning rate is 0).
  Losses at steps 1-3: 4.219, 15.19, 5.756; at steps 10-12: 8.131, 7.343, 10.18.
  expected: 5.18039
  actual:   8.13138

Notes:
  - Loss: median 5.756 over steps 1-3, 8.131 over steps 10-12.""")

    def test_not_overfitting_one_batch(self) -> None:
        result = tp.check_training(recipes.Fit("detached_loss"), steps=30, overfit=True)
        self.assertExpectedInline(result.report(), """\
trainparity training check: FAIL at loss (not_overfitting, step 30)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=None, max_skipped_steps=None, min_decrease=None, overfit=True, overfit_fraction=0.1, recipe="training_recipes:Fit('detached_loss')", seed=0, steps=30, update_ratio=None, window=None

First violation: loss (step 30, kind: not_overfitting, cause: not_overfitting)
  On one batch repeated (the recipe's first) for 30 steps, the loss never fell below 0.1 of its value at step 1 (4.219, target 0.4219): it is 4.219 at step 30, lowest 4.219 at step 1. A model that trains memorizes one batch. No optimizer step changed a parameter (optimizer 'optimizer' group 0: none of its 3 parameters had a gradient (.grad is None): the loss does not reach them, as when it is detached from the model (.detach(), .item(), torch.no_grad(), requires_grad_() on the loss)). Or take more steps.
  expected: 0.421901
  actual:   4.21901""")

    def test_overfitting_one_batch(self) -> None:
        result = tp.check_training(recipes.Fit(), steps=30, overfit=True, min_decrease=0.5)
        self.assertExpectedInline(result.report(), """\
trainparity training check: PASS
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=None, max_skipped_steps=None, min_decrease=0.5, overfit=True, overfit_fraction=0.1, recipe='training_recipes:Fit', seed=0, steps=30, update_ratio=None, window=7

Notes:
  - Loss: median 3.266 over steps 1-7, 0.208 over steps 24-30.
  - On one batch repeated, the loss fell from 4.219 to 0.415 (below 0.1 of its start) at step 20.""")

    def test_updates_too_small(self) -> None:
        result = tp.check_training(recipes.Fit("frozen_model"), steps=2, update_ratio=True)
        self.assertExpectedInline(result.report(), """\
trainparity training check: FAIL at optimizer.param_groups.0.update_ratio (update_too_small, step 1)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=None, max_skipped_steps=None, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe="training_recipes:Fit('frozen_model')", seed=0, steps=2, update_ratio=[1e-05, 0.1], window=None

First violation: optimizer.param_groups.0.update_ratio (step 1, kind: update_too_small, cause: update_too_small)
  The update of optimizer 'optimizer' group 0 at step 1 is 0.0 times its parameters' norm (||update|| / ||parameters||, the classic heuristic wants about 1e-3), below update_ratio's lower bound 1e-05: all 3 of its parameters have requires_grad=False: they are frozen.
  Also at step 2.
  expected: 1e-05
  actual:   0.0

All violations (2):
  1. optimizer.param_groups.0.update_ratio (step 1, kind: update_too_small, cause: update_too_small)
  2. optimizer.param_groups.1.update_ratio (step 1, kind: update_too_small, cause: update_too_small)""")

    def test_updates_too_large(self) -> None:
        result = tp.check_training(recipes.Fit("lr_too_high"), steps=2, update_ratio=(1e-4, 1e-2))
        self.assertExpectedInline(result.report(), """\
trainparity training check: FAIL at optimizer.param_groups.0.update_ratio (update_too_large, step 1)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=None, max_skipped_steps=None, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe="training_recipes:Fit('lr_too_high')", seed=0, steps=2, update_ratio=[0.0001, 0.01], window=None

First violation: optimizer.param_groups.0.update_ratio (step 1, kind: update_too_large, cause: update_too_large)
  The update of optimizer 'optimizer' group 0 at step 1 is 25.81 times its parameters' norm (||update|| / ||parameters||, the classic heuristic wants about 1e-3), above update_ratio's upper bound 0.01: a learning rate too high (lr=3.333) for parameters of this scale.
  Also at step 2.
  expected: 0.01
  actual:   25.8127

All violations (2):
  1. optimizer.param_groups.0.update_ratio (step 1, kind: update_too_large, cause: update_too_large)
  2. optimizer.param_groups.1.update_ratio (step 1, kind: update_too_large, cause: update_too_large)""")

    def test_a_schedule_one_step_ahead(self) -> None:
        result = tp.check_training(recipes.Fit("scheduler_before_optimizer"), steps=4, lr_schedule=recipes.learning_rate)
        self.assertExpectedInline(result.report(), """\
trainparity training check: FAIL at optimizer.param_groups.0.lr (lr_mismatch, step 1)
config: isolation='inprocess', lr_schedule='learning_rate', max_grad_norm=None, max_loss_growth=None, max_skipped_steps=None, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe="training_recipes:Fit('scheduler_before_optimizer')", seed=0, steps=4, update_ratio=None, window=None

First violation: optimizer.param_groups.0.lr (step 1, kind: lr_mismatch, cause: lr_mismatch)
  The learning rate of optimizer 'optimizer' group 0 at step 1 (its optimizer step 1, lr_schedule index 0) is 0.006667, where lr_schedule says 0.003333 (within a relative 1e-06). At every optimizer step the learning rate is the schedule's for the next one: the scheduler runs one step ahead, as when scheduler.step() is called before optimizer.step() (or once more before training starts); call it after optimizer.step(). (Or lr_schedule counts optimizer steps from 1: its index 0 is the first.)
  Learning rates at its first optimizer steps: 0.006667, 0.01, 0.01, 0.01; lr_schedule: 0.003333, 0.006667, 0.01, 0.01.
  Also at step 2.
  expected: 0.00333333
  actual:   0.00666667

All violations (2):
  1. optimizer.param_groups.0.lr (step 1, kind: lr_mismatch, cause: lr_mismatch)
  2. optimizer.param_groups.1.lr (step 1, kind: lr_mismatch, cause: lr_mismatch)""")

    def test_a_gradscaler_that_skips_every_step(self) -> None:
        result = tp.check_training(recipes.StaticScale(), steps=3, max_skipped_steps=1)
        self.assertExpectedInline(result.report(), """\
trainparity training check: FAIL at scaler.scale (skipped_updates, step 2)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=None, max_skipped_steps=1, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe='training_recipes:StaticScale', seed=0, steps=3, update_ratio=None, window=None

First violation: scaler.scale (step 2, kind: skipped_updates, cause: skipped_updates)
  GradScaler 'scaler' skipped 3 of 3 optimizer steps (steps 1, 2, 3) because their gradients held an inf or a NaN, at most 1 allowed (max_skipped_steps=1): a skipped step updates nothing. Loss scale at the skipped steps: 16777216 (step 1), 16777216 (step 2), 16777216 (step 3). A scale that never backs off (a static loss scale passed to scaler.update(new_scale)) or a model that overflows at every scale skips every step.
  expected: 1
  actual:   3""")

    def test_a_gradient_norm_above_the_bound(self) -> None:
        result = tp.check_training(recipes.Fit(clip=0.5), steps=2, max_grad_norm=2.0)
        self.assertExpectedInline(result.report(), """\
trainparity training check: FAIL at optimizer.grad_norm (grad_norm_exceeded, step 2)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=2.0, max_loss_growth=None, max_skipped_steps=None, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe='training_recipes:Fit(clip=0.5)', seed=0, steps=2, update_ratio=None, window=None

First violation: optimizer.grad_norm (step 2, kind: grad_norm_exceeded, cause: grad_norm_exceeded)
  The gradient norm of optimizer 'optimizer' at step 2 (the L2 norm of its parameters' gradients together, unscaled, before clipping) is 4.91, above max_grad_norm=2.0; the largest is 4.weight's. The loop clipped it to 0.5 before the step. Gradients that grow this large explode: a learning rate too high, a loss summed instead of averaged, or an unnormalized input.
  expected: 2.0
  actual:   4.91011""")

    def test_a_nan_in_a_batch(self) -> None:
        self.assertExpectedInline(tp.check_training(recipes.Fit("nan_batch"), steps=4).report(), """\
trainparity training check: FAIL at loss (nonfinite, step 3)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=None, max_skipped_steps=None, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe="training_recipes:Fit('nan_batch')", seed=0, steps=4, update_ratio=None, window=None

First violation: loss (step 3, kind: nonfinite, cause: nonfinite)
  step() returned a non-finite loss (nan) at step 3: the forward pass produced an inf or a NaN.
  Also at step 4.
  expected: 'finite'
  actual:   'nan'

All violations (3):
  1. loss (step 3, kind: nonfinite, cause: nonfinite)
  2. gradients.0.weight (step 3, kind: nonfinite, cause: nonfinite)
  3. parameters.0.weight (step 3, kind: nonfinite, cause: nonfinite)""")

    def test_a_loss_that_diverges_under_the_health_defaults(self) -> None:
        with self.assertRaises(AssertionError) as failed:
            tp.assert_training_healthy(recipes.Regression(lr=1e3), steps=3)
        self.assertExpectedInline(str(failed.exception), """\
trainparity training check: FAIL at optimizer.param_groups.0.update_ratio (update_too_large, step 1)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=100.0, max_skipped_steps=0, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe='training_recipes:Regression(lr=1000.0)', seed=0, steps=3, update_ratio=[None, 1.0], window=None

First violation: optimizer.param_groups.0.update_ratio (step 1, kind: update_too_large, cause: update_too_large)
  The update of optimizer 'optimizer' group 0 at step 1 is 5593.0 times its parameters' norm (||update|| / ||parameters||, the classic heuristic wants about 1e-3), above update_ratio's upper bound 1.0: a learning rate too high (lr=1000.0) for parameters of this scale.
  Also at step 3.
  expected: 1.0
  actual:   5593.24

All violations (2):
  1. optimizer.param_groups.0.update_ratio (step 1, kind: update_too_large, cause: update_too_large)
  2. loss (step 2, kind: loss_diverged, cause: loss_diverged)""")
        diverged = tp.check_training(recipes.Regression(lr=1e3), steps=3, max_loss_growth=100.0)
        self.assertExpectedInline(diverged.report(), """\
trainparity training check: FAIL at loss (loss_diverged, step 2)
config: isolation='inprocess', lr_schedule=None, max_grad_norm=None, max_loss_growth=100.0, max_skipped_steps=None, min_decrease=None, overfit=False, overfit_fraction=0.1, recipe='training_recipes:Regression(lr=1000.0)', seed=0, steps=3, update_ratio=None, window=None

First violation: loss (step 2, kind: loss_diverged, cause: loss_diverged)
  The loss diverged: it is 1.032e+07 at step 2, above 51.62 (max_loss_growth=100.0 times its start, 0.5162 at step 1). It followed updates of up to 5593.0 times the parameters' norm (step 1): a learning rate too high.
  Losses at steps 1, 2: 0.5162, 1.032e+07.
  Also above it at step 3.
  expected: 51.6181
  actual:   1.03178e+07""")
