"""Snapshots of accumulation reports: one per diagnosis code, plus no-cause, ABSTAIN and PASS-with-notes.

Accept changes with `EXPECTTEST_ACCEPT=1 python -m pytest test/test_accumulation_reports.py`.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import test_accumulation_recipes as recipes

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def report(recipe: Any, **kwargs: Any) -> str:
    kwargs.setdefault("comparison", recipes.TOLERANCE)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Detected call of", UserWarning)
        return tp.check_accumulation(recipe, **kwargs).report()


class AccumulationReports(tp.TestCase):
    def test_loss_not_scaled(self) -> None:
        self.assertExpectedInline(report(recipes.NotScaled), """\
trainparity accumulation check: FAIL at gradients.0.weight (loss_not_scaled, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:NotScaled', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 1.24689 at index (1, 2) (up to 1e-12 allowed)
  Greatest relative difference: 3.0 at index (0, 0) (up to 1e-09 allowed)

  Diagnosis (loss_not_scaled): the candidate's gradients are 4x the reference's: each micro-batch loss was back-propagated without dividing by the number of micro-batches (4).
  Losses returned by step(): reference 2.47382; candidate micro-batches 0.468366, 2.09288, 6.83517, 0.498846 (sum 9.89527).
  expected: -0.415629
  actual:   -1.66252

All violations (12):
  1. gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  2. gradients.0.bias (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  3. gradients.2.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  4. gradients.2.bias (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  5. parameters.0.weight (step 1, kind: parameter_mismatch)
  6. parameters.0.bias (step 1, kind: parameter_mismatch)
  7. parameters.2.weight (step 1, kind: parameter_mismatch)
  8. parameters.2.bias (step 1, kind: parameter_mismatch)
  9. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  10. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  ... and 2 more (result.violations has them all)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_loss_not_scaled_uneven_sizes(self) -> None:
        self.assertExpectedInline(report(recipes.NotScaled, microbatches=(3, 3, 2)), """\
trainparity accumulation check: FAIL at gradients.0.weight (loss_not_scaled, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=[3, 3, 2], precision='float64', recipe='test_accumulation_recipes:NotScaled', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.652887 at index (1, 2) (up to 1e-12 allowed)
  Greatest relative difference: 12.3724 at index (3, 0) (up to 1e-09 allowed)

  Diagnosis (loss_not_scaled): the reference's gradient equals the gradients of the micro-batches (3, 3, 2 samples) weighted by [0.375, 0.375, 0.25], adding up to 1 instead of 3: the micro-batch losses were summed without dividing by the number of micro-batches (3).
  Losses returned by step(): reference 2.47382; candidate micro-batches 1.1511, 5.11318, 0.498846 (sum 6.76313).
  expected: -0.415629
  actual:   -1.06852

All violations (12):
  1. gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  2. gradients.0.bias (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  3. gradients.2.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  4. gradients.2.bias (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  5. parameters.0.weight (step 1, kind: parameter_mismatch)
  6. parameters.0.bias (step 1, kind: parameter_mismatch)
  7. parameters.2.weight (step 1, kind: parameter_mismatch)
  8. parameters.2.bias (step 1, kind: parameter_mismatch)
  9. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  10. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  ... and 2 more (result.violations has them all)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_loss_scaled_twice(self) -> None:
        self.assertExpectedInline(report(recipes.ScaledTwice), """\
trainparity accumulation check: FAIL at gradients.0.weight (loss_scaled_twice, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:ScaledTwice', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_scaled_twice)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.311722 at index (1, 2) (up to 1e-12 allowed)
  Greatest relative difference: 0.75 at index (0, 0) (up to 1e-09 allowed)

  Diagnosis (loss_scaled_twice): the candidate's gradients are 1/4 of the reference's: the loss was divided by the number of micro-batches twice.
  Losses returned by step(): reference 2.47382; candidate micro-batches 0.117092, 0.523221, 1.70879, 0.124711 (sum 2.47382).
  expected: -0.415629
  actual:   -0.103907

All violations (12):
  1. gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_scaled_twice)
  2. gradients.0.bias (step 1, kind: gradient_mismatch, cause: loss_scaled_twice)
  3. gradients.2.weight (step 1, kind: gradient_mismatch, cause: loss_scaled_twice)
  4. gradients.2.bias (step 1, kind: gradient_mismatch, cause: loss_scaled_twice)
  5. parameters.0.weight (step 1, kind: parameter_mismatch)
  6. parameters.0.bias (step 1, kind: parameter_mismatch)
  7. parameters.2.weight (step 1, kind: parameter_mismatch)
  8. parameters.2.bias (step 1, kind: parameter_mismatch)
  9. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  10. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  ... and 2 more (result.violations has them all)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_grads_not_reset(self) -> None:
        self.assertExpectedInline(report(recipes.NoZeroGrad), """\
trainparity accumulation check: FAIL at gradients.0.weight (grads_not_reset, step 2)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:NoZeroGrad', seed=0, split='split_batch'

First violation: gradients.0.weight (step 2, kind: gradient_mismatch, cause: grads_not_reset)
  The gradient at the step of optimizer 'optimizer' in window 2 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.415629 at index (1, 2) (up to 1e-12 allowed)
  Greatest relative difference: 152.083 at index (5, 0) (up to 1e-09 allowed)

  Diagnosis (grads_not_reset): the candidate's gradients at the step are this window's micro-batch gradients plus the gradients of the previous step: they were not reset after the optimizer step (call optimizer.zero_grad() after stepping).
  Losses returned by step(): reference 1.25548; candidate micro-batches 0.300347, 0.434227, 0.204709, 0.316194 (sum 1.25548).
  expected: -0.0292066
  actual:   -0.444836

All violations (12):
  1. gradients.0.weight (step 2, kind: gradient_mismatch, cause: grads_not_reset)
  2. gradients.0.bias (step 2, kind: gradient_mismatch, cause: grads_not_reset)
  3. gradients.2.weight (step 2, kind: gradient_mismatch, cause: grads_not_reset)
  4. gradients.2.bias (step 2, kind: gradient_mismatch, cause: grads_not_reset)
  5. parameters.0.weight (step 2, kind: parameter_mismatch)
  6. parameters.0.bias (step 2, kind: parameter_mismatch)
  7. parameters.2.weight (step 2, kind: parameter_mismatch)
  8. parameters.2.bias (step 2, kind: parameter_mismatch)
  9. optimizer.state.0.weight.momentum_buffer (step 2, kind: optimizer_state_mismatch)
  10. optimizer.state.0.bias.momentum_buffer (step 2, kind: optimizer_state_mismatch)
  ... and 2 more (result.violations has them all)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)""")

    def test_premature_step(self) -> None:
        self.assertExpectedInline(report(recipes.Premature), """\
trainparity accumulation check: FAIL at optimizer_steps (premature_step, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:Premature', seed=0, split='split_batch'

First violation: optimizer_steps (step 1, position 0, kind: step_count_mismatch, cause: premature_step)
  Optimizer 'optimizer' stepped before the last micro-batch in window 1: steps per micro-batch [1, 0, 0, 0], expected [0, 0, 0, 1] (the reference steps once per full batch, so the candidate must step after the last of its 4 micro-batches, micro-batch 3).
  Diagnosis (premature_step): the optimizer stepped at micro-batch 0, before the window's gradients were complete.
  expected: [0, 0, 0, 1]
  actual:   [1, 0, 0, 0]

All violations (9):
  1. optimizer_steps (step 1, position 0, kind: step_count_mismatch, cause: premature_step)
  2. parameters.0.weight (step 1, kind: parameter_mismatch)
  3. parameters.0.bias (step 1, kind: parameter_mismatch)
  4. parameters.2.weight (step 1, kind: parameter_mismatch)
  5. parameters.2.bias (step 1, kind: parameter_mismatch)
  6. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  7. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  8. optimizer.state.2.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  9. optimizer.state.2.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_missing_step(self) -> None:
        self.assertExpectedInline(report(recipes.SamplesPerStep), """\
trainparity accumulation check: FAIL at optimizer_steps (missing_step, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:SamplesPerStep', seed=0, split='split_batch'

First violation: optimizer_steps (step 1, position 3, kind: step_count_mismatch, cause: missing_step)
  Optimizer 'optimizer' stepped 0 times where the reference steps once in window 1: steps per micro-batch [0, 0, 0, 0], expected [0, 0, 0, 1] (the reference steps once per full batch, so the candidate must step after the last of its 4 micro-batches, micro-batch 3).
  Diagnosis (missing_step): the optimizer did not step at the end of the window of micro-batches.
  expected: [0, 0, 0, 1]
  actual:   [0, 0, 0, 0]

All violations (9):
  1. optimizer_steps (step 1, position 3, kind: step_count_mismatch, cause: missing_step)
  2. parameters.0.weight (step 1, kind: parameter_mismatch)
  3. parameters.0.bias (step 1, kind: parameter_mismatch)
  4. parameters.2.weight (step 1, kind: parameter_mismatch)
  5. parameters.2.bias (step 1, kind: parameter_mismatch)
  6. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  7. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  8. optimizer.state.2.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  9. optimizer.state.2.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_extra_step(self) -> None:
        self.assertExpectedInline(report(recipes.StepsEveryMicrobatch), """\
trainparity accumulation check: FAIL at optimizer_steps (extra_step, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:StepsEveryMicrobatch', seed=0, split='split_batch'

First violation: optimizer_steps (step 1, position 0, kind: step_count_mismatch, cause: extra_step)
  Optimizer 'optimizer' stepped 4 times where the reference steps once in window 1: steps per micro-batch [1, 1, 1, 1], expected [0, 0, 0, 1] (the reference steps once per full batch, so the candidate must step after the last of its 4 micro-batches, micro-batch 3).
  Diagnosis (extra_step): the optimizer stepped more often than once per window of micro-batches.
  expected: [0, 0, 0, 1]
  actual:   [1, 1, 1, 1]

All violations (9):
  1. optimizer_steps (step 1, position 0, kind: step_count_mismatch, cause: extra_step)
  2. parameters.0.weight (step 1, kind: parameter_mismatch)
  3. parameters.0.bias (step 1, kind: parameter_mismatch)
  4. parameters.2.weight (step 1, kind: parameter_mismatch)
  5. parameters.2.bias (step 1, kind: parameter_mismatch)
  6. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  7. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  8. optimizer.state.2.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  9. optimizer.state.2.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_scheduler_per_microbatch(self) -> None:
        self.assertExpectedInline(report(recipes.SchedulerPerMicrobatch), """\
trainparity accumulation check: FAIL at optimizer.param_groups.0.lr (scheduler_per_microbatch, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:SchedulerPerMicrobatch', seed=0, split='split_batch'

First violation: optimizer.param_groups.0.lr (step 1, kind: learning_rate_mismatch, cause: scheduler_per_microbatch)
  The learning rate at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Scalars are not close!

  Expected 0.1 but got 0.0125.
  Absolute difference: 0.0875 (up to 1e-12 allowed)
  Relative difference: 0.875 (up to 1e-09 allowed)

  Diagnosis (scheduler_per_microbatch): the candidate stepped its scheduler 4 times in window 1 (at micro-batches 0, 1, 2, 3) where the reference steps it once: step the scheduler once per optimizer step.
  Observed: optimizer 'optimizer' stepped with learning rates [0.0125] where the reference used [0.1].
  expected: 0.1
  actual:   0.0125

All violations (9):
  1. optimizer.param_groups.0.lr (step 1, kind: learning_rate_mismatch, cause: scheduler_per_microbatch)
  2. parameters.0.weight (step 1, kind: parameter_mismatch)
  3. parameters.0.bias (step 1, kind: parameter_mismatch)
  4. parameters.2.weight (step 1, kind: parameter_mismatch)
  5. parameters.2.bias (step 1, kind: parameter_mismatch)
  6. optimizer.param_groups.0.lr (step 1, kind: optimizer_state_mismatch)
  7. scheduler.last_epoch (step 1, kind: scheduler_state_mismatch, cause: scheduler_per_microbatch)
  8. scheduler._step_count (step 1, kind: scheduler_state_mismatch, cause: scheduler_per_microbatch)
  9. scheduler._last_lr (step 1, kind: scheduler_state_mismatch, cause: scheduler_per_microbatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_clip_per_microbatch(self) -> None:
        self.assertExpectedInline(report(recipes.ClipPerMicrobatch), """\
trainparity accumulation check: FAIL at gradients.0.weight (clip_per_microbatch, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:ClipPerMicrobatch', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: clip_per_microbatch)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.0151729 at index (7, 0) (up to 1e-12 allowed)
  Greatest relative difference: 108.504 at index (3, 0) (up to 1e-09 allowed)

  Diagnosis (clip_per_microbatch): the candidate called clip_grad_norm_() at micro-batches 0, 1, 2, before the window's gradients were complete; clip once per optimizer step, after the last micro-batch's backward.
  Losses returned by step(): reference 2.47382; candidate micro-batches 0.117092, 0.523221, 1.70879, 0.124711 (sum 2.47382).
  expected: 0.00360668
  actual:   -0.0115662

All violations (12):
  1. gradients.0.weight (step 1, kind: gradient_mismatch, cause: clip_per_microbatch)
  2. gradients.0.bias (step 1, kind: gradient_mismatch, cause: clip_per_microbatch)
  3. gradients.2.weight (step 1, kind: gradient_mismatch, cause: clip_per_microbatch)
  4. gradients.2.bias (step 1, kind: gradient_mismatch, cause: clip_per_microbatch)
  5. parameters.0.weight (step 1, kind: parameter_mismatch)
  6. parameters.0.bias (step 1, kind: parameter_mismatch)
  7. parameters.2.weight (step 1, kind: parameter_mismatch)
  8. parameters.2.bias (step 1, kind: parameter_mismatch)
  9. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  10. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  ... and 2 more (result.violations has them all)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_mean_of_means_declared(self) -> None:
        self.assertExpectedInline(report(recipes.MeanOfMeans), """\
trainparity accumulation check: FAIL at loss_accounting (mean_of_means, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:MeanOfMeans', seed=0, split='split_batch'

First violation: loss_accounting (step 1, kind: loss_accounting_mismatch, cause: mean_of_means)
  The micro-batches' LossAccounting values add up to 1.59432 but the full batch's loss is 1.62438.
  Scalars are not close!

  Expected 1.62438 but got 1.59432.
  Absolute difference: 0.0300615 (up to 1e-12 allowed)
  Relative difference: 0.0185064 (up to 1e-09 allowed)

  Diagnosis (mean_of_means): each micro-batch's loss is its own mean divided by 4: a mean of means, where the full batch is normalized by the whole window's denominator (24.0).
  expected: 1.62438
  actual:   1.59432

All violations (5):
  1. loss_accounting (step 1, kind: loss_accounting_mismatch, cause: mean_of_means)
  2. gradients.weight (step 1, kind: gradient_mismatch, cause: mean_of_means)
  3. gradients.bias (step 1, kind: gradient_mismatch, cause: mean_of_means)
  4. parameters.weight (step 1, kind: parameter_mismatch)
  5. parameters.bias (step 1, kind: parameter_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - windows after window 1 not judged: they start from the diverged state""")

    def test_mean_of_means_from_gradients(self) -> None:
        self.assertExpectedInline(report(recipes.MeanOfMeansBareLoss), """\
trainparity accumulation check: FAIL at gradients.weight (mean_of_means, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:MeanOfMeansBareLoss', seed=0, split='split_batch'

First violation: gradients.weight (step 1, kind: gradient_mismatch, cause: mean_of_means)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 3 / 3 (100.0%)
  Greatest absolute difference: 0.27511 at index (0, 1) (up to 1e-12 allowed)
  Greatest relative difference: 4.09135 at index (0, 2) (up to 1e-09 allowed)

  Diagnosis (mean_of_means): the reference's gradient equals the gradients of the micro-batches (2, 2, 2, 2 samples) weighted by [1.17, 0.667, 1.17, 1.0] instead of all 1: each micro-batch was normalized by its own count and the results averaged, where the full batch is normalized by the whole window's count.
  Losses returned by step(): reference 1.62438; candidate micro-batches 0.344952, 0.358003, 0.551422, 0.339941 (sum 1.59432).
  expected: 0.287815
  actual:   0.012705

All violations (4):
  1. gradients.weight (step 1, kind: gradient_mismatch, cause: mean_of_means)
  2. gradients.bias (step 1, kind: gradient_mismatch, cause: mean_of_means)
  3. parameters.weight (step 1, kind: parameter_mismatch)
  4. parameters.bias (step 1, kind: parameter_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_unscale_before_clip_missing(self) -> None:
        self.assertExpectedInline(report(recipes.ClipBeforeUnscale), """\
trainparity accumulation check: FAIL at gradients.0.weight (unscale_before_clip_missing, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:ClipBeforeUnscale', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: clip_on_scaled_gradients, cause: unscale_before_clip_missing)
  In the reference run, clip_grad_norm_() clipped gradients that the GradScaler still scaled (scale 1024): the clipping threshold applies to scaled gradients.
  Diagnosis (unscale_before_clip_missing): call scaler.unscale_(optimizer) before clipping.

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_no_known_cause(self) -> None:
        self.assertExpectedInline(report(recipes.ZeroGradEveryCall), """\
trainparity accumulation check: FAIL at gradients.0.weight (gradient_mismatch, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:ZeroGradEveryCall', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.445501 at index (1, 2) (up to 1e-12 allowed)
  Greatest relative difference: 11.5293 at index (3, 0) (up to 1e-09 allowed)

  No diagnosis code fits. Observed: the gradients at the step hold only the last micro-batch's gradient: they were reset between micro-batches, e.g. by a zero_grad() before each backward.
  Losses returned by step(): reference 2.47382; candidate micro-batches 0.117092, 0.523221, 1.70879, 0.124711 (sum 2.47382).
  expected: -0.415629
  actual:   0.0298718

All violations (12):
  1. gradients.0.weight (step 1, kind: gradient_mismatch)
  2. gradients.0.bias (step 1, kind: gradient_mismatch)
  3. gradients.2.weight (step 1, kind: gradient_mismatch)
  4. gradients.2.bias (step 1, kind: gradient_mismatch)
  5. parameters.0.weight (step 1, kind: parameter_mismatch)
  6. parameters.0.bias (step 1, kind: parameter_mismatch)
  7. parameters.2.weight (step 1, kind: parameter_mismatch)
  8. parameters.2.bias (step 1, kind: parameter_mismatch)
  9. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  10. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  ... and 2 more (result.violations has them all)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_float32_rounding_under_exact_comparison(self) -> None:
        # Float32Rounding rounds the same way on every CPU by construction (see its docstring).
        self.assertExpectedInline(report(recipes.Float32Rounding, comparison=None, cycles=1, precision="native"), """\
trainparity accumulation check: FAIL at gradients.weight (gradient_mismatch, step 1)
config: batch_dependent='fail', comparison='exact', cycles=1, disable_dropout=True, isolation='inprocess', microbatches=4, precision='native', recipe='test_accumulation_recipes:Float32Rounding', seed=0, split='split_batch'

First violation: gradients.weight (step 1, kind: gradient_mismatch)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not equal!

  Mismatched elements: 2 / 4 (50.0%)
  Greatest absolute difference: 2.98023e-08 at index (0, 3)
  Greatest relative difference: 1.19209e-07 at index (0, 3)

  No known cause fits; this is the first observed divergence, not a root cause. The difference is at the level of floating-point rounding (normwise relative difference 4e-08): accumulating micro-batch gradients adds the same numbers in another order; to accept that, judge it with precision='float64' (the default) or declare a tolerance (see docs/api.md, Accumulation equivalence).
  Losses returned by step(): reference -0.166667; candidate micro-batches -0.333333, 0.166667, -0.166667, 0.166667 (sum -0.166667).
  expected: -0.25
  actual:   -0.25

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)""")

    def test_batch_dependent_layer(self) -> None:
        self.assertExpectedInline(report(recipes.WithBatchNorm, cycles=1), """\
trainparity accumulation check: FAIL at gradients.0.weight (batch_dependent_layer, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=1, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:WithBatchNorm', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: batch_dependent_layer)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 17.6356 at index (7, 3) (up to 1e-12 allowed)
  Greatest relative difference: 352.357 at index (7, 3) (up to 1e-09 allowed)

  Diagnosis (batch_dependent_layer): model.1 (BatchNorm1d) normalizes by the statistics of the batch it sees in training mode, and a micro-batch has other statistics than the full batch: accumulated training really differs from one full-batch step. If that is accepted, pass batch_dependent='eval' to run those layers in eval mode (running statistics) and judge the accumulation loop alone.
  Losses returned by step(): reference 2.2759; candidate micro-batches 0.265426, 0.562174, 1.5005, 0.0178272 (sum 2.34593).
  expected: 0.0500504
  actual:   -17.5856

All violations (15):
  1. gradients.0.weight (step 1, kind: gradient_mismatch, cause: batch_dependent_layer)
  2. gradients.1.weight (step 1, kind: gradient_mismatch, cause: batch_dependent_layer)
  3. gradients.1.bias (step 1, kind: gradient_mismatch, cause: batch_dependent_layer)
  4. gradients.3.weight (step 1, kind: gradient_mismatch, cause: batch_dependent_layer)
  5. gradients.3.bias (step 1, kind: gradient_mismatch, cause: batch_dependent_layer)
  6. parameters.0.weight (step 1, kind: parameter_mismatch)
  7. parameters.1.weight (step 1, kind: parameter_mismatch)
  8. parameters.1.bias (step 1, kind: parameter_mismatch)
  9. parameters.3.weight (step 1, kind: parameter_mismatch)
  10. parameters.3.bias (step 1, kind: parameter_mismatch)
  ... and 5 more (result.violations has them all)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)""")

    def test_scaled_gradients_stepped(self) -> None:
        self.assertExpectedInline(report(recipes.ScalerStepBypassed, cycles=1), """\
trainparity accumulation check: FAIL at gradients.0.weight (scaled_gradients_stepped, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=1, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:ScalerStepBypassed', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: step_on_scaled_gradients, cause: scaled_gradients_stepped)
  In the reference run, optimizer 'optimizer' stepped on gradients that the GradScaler still scaled (scale 1024): the update is that many times too large, and steps with non-finite gradients are not skipped.
  Diagnosis (scaled_gradients_stepped): call scaler.step(optimizer) (it unscales, and skips the step when the gradients are not finite) instead of optimizer.step(), then scaler.update().

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)""")

    def test_lr_schedule_per_microbatch(self) -> None:
        self.assertExpectedInline(report(recipes.LrFromCounter(per_microbatch=True)), """\
trainparity accumulation check: FAIL at optimizer.param_groups.0.lr (lr_schedule_per_microbatch, step 2)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, precision='float64', recipe='test_accumulation_recipes:LrFromCounter(per_microbatch=True)', seed=0, split='split_batch'

First violation: optimizer.param_groups.0.lr (step 2, kind: learning_rate_mismatch, cause: lr_schedule_per_microbatch)
  The learning rate at the step of optimizer 'optimizer' in window 2 differs from the full-batch reference.
  Scalars are not close!

  Expected 0.02 but got 0.05.
  Absolute difference: 0.03 (up to 1e-12 allowed)
  Relative difference: 1.5 (up to 1e-09 allowed)

  Diagnosis (lr_schedule_per_microbatch): both runs stepped the optimizer as often, but with other learning rates, and no LR scheduler stepped between the candidate's steps: a learning rate computed from a counter that advances per micro-batch (such as iter_num += 1 inside the micro-batch loop, then get_lr(iter_num)); count optimizer steps instead.
  Observed: optimizer 'optimizer' stepped with learning rates [0.05] where the reference used [0.02].
  expected: 0.02
  actual:   0.05

All violations (6):
  1. optimizer.param_groups.0.lr (step 2, kind: learning_rate_mismatch, cause: lr_schedule_per_microbatch)
  2. parameters.0.weight (step 2, kind: parameter_mismatch)
  3. parameters.0.bias (step 2, kind: parameter_mismatch)
  4. parameters.2.weight (step 2, kind: parameter_mismatch)
  5. parameters.2.bias (step 2, kind: parameter_mismatch)
  6. optimizer.param_groups.0.lr (step 2, kind: optimizer_state_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)""")

    def test_mean_of_means_declared_denominators(self) -> None:
        self.assertExpectedInline(report(recipes.MeanOfMeansDeclared, microbatches=(3, 3, 2), cycles=1), """\
trainparity accumulation check: FAIL at loss_accounting (mean_of_means, step 1)
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=1, disable_dropout=True, isolation='inprocess', microbatches=[3, 3, 2], precision='float64', recipe='test_accumulation_recipes:MeanOfMeansDeclared', seed=0, split='split_batch'

First violation: loss_accounting (step 1, kind: loss_accounting_mismatch, cause: mean_of_means)
  The micro-batches' LossAccounting denominators add up to 72.0 but the full batch's is 24.0.
  Scalars are not close!

  Expected 24.0 but got 72.0.
  Absolute difference: 48.0 (up to 1e-12 allowed)
  Relative difference: 2.0 (up to 1e-09 allowed)

  Diagnosis (mean_of_means): the micro-batches' denominators add up to 3x the full batch's: each micro-batch was normalized by its own count times 3, a mean of means, where the full batch is normalized by the whole window's count.
  expected: 24.0
  actual:   72.0

All violations (6):
  1. loss_accounting (step 1, kind: loss_accounting_mismatch, cause: mean_of_means)
  2. loss_accounting (step 1, kind: loss_accounting_mismatch, cause: mean_of_means)
  3. gradients.weight (step 1, kind: gradient_mismatch, cause: mean_of_means)
  4. gradients.bias (step 1, kind: gradient_mismatch, cause: mean_of_means)
  5. parameters.weight (step 1, kind: parameter_mismatch)
  6. parameters.bias (step 1, kind: parameter_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active""")

    def test_pass_with_notes(self) -> None:
        self.assertExpectedInline(report(recipes.TokenWeightedUnscaledValue, microbatches=(3, 3, 2)), """\
trainparity accumulation check: PASS
config: batch_dependent='fail', comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=[3, 3, 2], precision='float64', recipe='test_accumulation_recipes:TokenWeightedUnscaledValue', seed=0, split='split_batch'

Notes:
  - dropout disabled in both runs (disable_dropout=True): nothing was active
  - loss_accounting differs in windows 1, 2 (it would be diagnosed loss_not_scaled) but gradients, parameters, optimizer and scheduler state agree with the reference: LossAccounting.value should be the loss back-propagated by that call; not failed""")
