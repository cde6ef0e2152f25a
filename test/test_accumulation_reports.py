"""Snapshots of accumulation reports: one per diagnosis code, plus no-cause, ABSTAIN and PASS-with-notes.

Accept changes with `EXPECTTEST_ACCEPT=1 python -m pytest test/test_accumulation_reports.py`.
"""

from __future__ import annotations

import warnings
from typing import Any

import test_accumulation_recipes as recipes

import trainparity as tp


def report(recipe: Any, **kwargs: Any) -> str:
    kwargs.setdefault("comparison", recipes.TOLERANCE)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Detected call of", UserWarning)
        return tp.check_accumulation(recipe, **kwargs).report()


class AccumulationReports(tp.TestCase):
    def test_loss_not_scaled(self) -> None:
        self.assertExpectedInline(report(recipes.NotScaled), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:NotScaled', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.489122 at index (3, 1) (up to 1e-12 allowed)
  Greatest relative difference: 3 at index (3, 1) (up to 1e-09 allowed)

  Diagnosis (loss_not_scaled): the candidate's gradients are 4x the reference's: each micro-batch loss was back-propagated without dividing by the number of micro-batches (4).
  Losses returned by step(): reference 1.01877; candidate micro-batches 1.40266, 0.316981, 1.31485, 1.04057 (sum 4.07506).
  expected: -0.163041
  actual:   -0.652162

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_loss_not_scaled_uneven_sizes(self) -> None:
        self.assertExpectedInline(report(recipes.NotScaled, microbatches=(3, 3, 2)), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=[3, 3, 2], recipe='test_accumulation_recipes:NotScaled', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_not_scaled)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.59499 at index (3, 2) (up to 1e-12 allowed)
  Greatest relative difference: 4.68283 at index (3, 2) (up to 1e-09 allowed)

  Diagnosis (loss_not_scaled): the reference's gradient equals the gradients of the micro-batches (3, 3, 2 samples) weighted by [0.375, 0.375, 0.25], adding up to 1 instead of 3: the micro-batch losses were summed without dividing by the number of micro-batches (3).
  Losses returned by step(): reference 1.01877; candidate micro-batches 1.14593, 0.877066, 1.04057 (sum 3.06357).
  expected: -0.127058
  actual:   -0.722047

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_loss_scaled_twice(self) -> None:
        self.assertExpectedInline(report(recipes.ScaledTwice), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:ScaledTwice', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: loss_scaled_twice)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.12228 at index (3, 1) (up to 1e-12 allowed)
  Greatest relative difference: 0.75 at index (3, 1) (up to 1e-09 allowed)

  Diagnosis (loss_scaled_twice): the candidate's gradients are 1/4 of the reference's: the loss was divided by the number of micro-batches twice.
  Losses returned by step(): reference 1.01877; candidate micro-batches 0.350665, 0.0792452, 0.328712, 0.260143 (sum 1.01877).
  expected: -0.163041
  actual:   -0.0407601

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_grads_not_reset(self) -> None:
        self.assertExpectedInline(report(recipes.NoZeroGrad), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:NoZeroGrad', seed=0, split='split_batch'

First violation: gradients.0.weight (step 2, kind: gradient_mismatch, cause: grads_not_reset)
  The gradient at the step of optimizer 'optimizer' in window 2 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.163041 at index (3, 1) (up to 1e-12 allowed)
  Greatest relative difference: 2.23978 at index (3, 1) (up to 1e-09 allowed)

  Diagnosis (grads_not_reset): the candidate's gradients at the step are this window's micro-batch gradients plus the gradients of the previous step (window 1): they were not reset after the optimizer step (call optimizer.zero_grad() after stepping).
  Losses returned by step(): reference 0.620564; candidate micro-batches 0.139937, 0.239815, 0.123902, 0.11691 (sum 0.620564).
  expected: -0.0727931
  actual:   -0.235834

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)""")

    def test_premature_step(self) -> None:
        self.assertExpectedInline(report(recipes.Premature), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:Premature', seed=0, split='split_batch'

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_missing_step(self) -> None:
        self.assertExpectedInline(report(recipes.SamplesPerStep), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:SamplesPerStep', seed=0, split='split_batch'

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_extra_step(self) -> None:
        self.assertExpectedInline(report(recipes.StepsEveryMicrobatch), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:StepsEveryMicrobatch', seed=0, split='split_batch'

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_scheduler_per_microbatch(self) -> None:
        self.assertExpectedInline(report(recipes.SchedulerPerMicrobatch), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:SchedulerPerMicrobatch', seed=0, split='split_batch'

First violation: parameters.0.weight (step 1, kind: parameter_mismatch, cause: scheduler_per_microbatch)
  The parameter after window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.0142661 at index (3, 1) (up to 1e-12 allowed)
  Greatest relative difference: 0.0453125 at index (3, 1) (up to 1e-09 allowed)

  Diagnosis (scheduler_per_microbatch): the candidate stepped its scheduler 4 times in window 1 (at micro-batches 0, 1, 2, 3) where the reference steps it once: step the scheduler once per optimizer step.
  Observed: optimizer 'optimizer' stepped with learning rates [0.0125] where the reference used [0.1].
  expected: -0.314837
  actual:   -0.329103

All violations (8):
  1. parameters.0.weight (step 1, kind: parameter_mismatch, cause: scheduler_per_microbatch)
  2. parameters.0.bias (step 1, kind: parameter_mismatch, cause: scheduler_per_microbatch)
  3. parameters.2.weight (step 1, kind: parameter_mismatch, cause: scheduler_per_microbatch)
  4. parameters.2.bias (step 1, kind: parameter_mismatch, cause: scheduler_per_microbatch)
  5. optimizer.param_groups.0.lr (step 1, kind: optimizer_state_mismatch, cause: scheduler_per_microbatch)
  6. scheduler.last_epoch (step 1, kind: scheduler_state_mismatch, cause: scheduler_per_microbatch)
  7. scheduler._step_count (step 1, kind: scheduler_state_mismatch, cause: scheduler_per_microbatch)
  8. scheduler._last_lr (step 1, kind: scheduler_state_mismatch, cause: scheduler_per_microbatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_clip_per_microbatch(self) -> None:
        self.assertExpectedInline(report(recipes.ClipPerMicrobatch), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:ClipPerMicrobatch', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch, cause: clip_per_microbatch)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.0114661 at index (3, 1) (up to 1e-12 allowed)
  Greatest relative difference: 0.95401 at index (3, 1) (up to 1e-09 allowed)

  Diagnosis (clip_per_microbatch): the candidate called clip_grad_norm_() at micro-batches 0, 1, 2, before the window's gradients were complete; clip once per optimizer step, after the last micro-batch's backward.
  Losses returned by step(): reference 1.01877; candidate micro-batches 0.350665, 0.0792452, 0.328712, 0.260143 (sum 1.01877).
  expected: -0.0120188
  actual:   -0.000552742

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_mean_of_means_declared(self) -> None:
        self.assertExpectedInline(report(recipes.MeanOfMeans), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:MeanOfMeans', seed=0, split='split_batch'

First violation: loss_accounting (step 1, kind: loss_accounting_mismatch, cause: mean_of_means)
  The micro-batches' LossAccounting values add up to 1.58459 but the full batch's loss is 1.53886.
  Scalars are not close!

  Expected 1.53886 but got 1.58459.
  Absolute difference: 0.0457282 (up to 1e-12 allowed)
  Relative difference: 0.0297156 (up to 1e-09 allowed)

  Diagnosis (mean_of_means): each micro-batch's loss is its own mean divided by 4: a mean of means, where the full batch is normalized by the whole window's denominator (27).
  expected: 1.53886
  actual:   1.58459

All violations (5):
  1. loss_accounting (step 1, kind: loss_accounting_mismatch, cause: mean_of_means)
  2. gradients.weight (step 1, kind: gradient_mismatch, cause: mean_of_means)
  3. gradients.bias (step 1, kind: gradient_mismatch, cause: mean_of_means)
  4. parameters.weight (step 1, kind: parameter_mismatch)
  5. parameters.bias (step 1, kind: parameter_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - windows after window 1 not judged: they start from the diverged state""")

    def test_mean_of_means_from_gradients(self) -> None:
        self.assertExpectedInline(report(recipes.MeanOfMeansBareLoss), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:MeanOfMeansBareLoss', seed=0, split='split_batch'

First violation: gradients.weight (step 1, kind: gradient_mismatch, cause: mean_of_means)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 3 / 3 (100.0%)
  Greatest absolute difference: 0.287977 at index (0, 2) (up to 1e-12 allowed)
  Greatest relative difference: 0.253973 at index (0, 2) (up to 1e-09 allowed)

  Diagnosis (mean_of_means): the reference's gradient equals the gradients of the micro-batches (2, 2, 2, 2 samples) weighted by [1.33, 1.04, 1.04, 0.593] instead of all 1: each micro-batch was normalized by its own count and the results averaged, where the full batch is normalized by the whole window's count.
  Losses returned by step(): reference 1.53886; candidate micro-batches 0.184348, 0.688164, 0.354242, 0.357837 (sum 1.58459).
  expected: -1.13389
  actual:   -1.42187

All violations (4):
  1. gradients.weight (step 1, kind: gradient_mismatch, cause: mean_of_means)
  2. gradients.bias (step 1, kind: gradient_mismatch, cause: mean_of_means)
  3. parameters.weight (step 1, kind: parameter_mismatch)
  4. parameters.bias (step 1, kind: parameter_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_unscale_before_clip_missing(self) -> None:
        self.assertExpectedInline(report(recipes.ClipBeforeUnscale), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:ClipBeforeUnscale', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: clip_on_scaled_gradients, cause: unscale_before_clip_missing)
  In the reference run, clip_grad_norm_() clipped gradients that the GradScaler still scaled (scale 1024): the clipping threshold applies to scaled gradients.
  Diagnosis (unscale_before_clip_missing): call scaler.unscale_(optimizer) before clipping.

Notes:
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_no_known_cause(self) -> None:
        self.assertExpectedInline(report(recipes.ZeroGradEveryCall), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:ZeroGradEveryCall', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not close!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.160362 at index (3, 2) (up to 1e-12 allowed)
  Greatest relative difference: 1.26212 at index (3, 2) (up to 1e-09 allowed)

  No diagnosis code fits. Observed: the gradients at the step hold only the last micro-batch's gradient: they were reset between micro-batches, e.g. by a zero_grad() before each backward.
  Losses returned by step(): reference 1.01877; candidate micro-batches 0.350665, 0.0792452, 0.328712, 0.260143 (sum 1.01877).
  expected: -0.127058
  actual:   -0.28742

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
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)
  - windows after window 1 not judged: they start from the diverged state""")

    def test_float32_rounding_under_exact_comparison(self) -> None:
        self.assertExpectedInline(report(recipes.MLP32, comparison=None, cycles=1), """\
trainparity accumulation check: FAIL
config: allow_batch_dependent=False, comparison='exact', cycles=1, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:MLP32', seed=0, split='split_batch'

First violation: gradients.0.weight (step 1, kind: gradient_mismatch)
  The gradient at the step of optimizer 'optimizer' in window 1 differs from the full-batch reference.
  Tensor-likes are not equal!

  Mismatched elements: 19 / 32 (59.4%)
  Greatest absolute difference: 1.49012e-08 at index (4, 3) (up to 0 allowed)
  Greatest relative difference: 2.82398e-07 at index (4, 3) (up to 0 allowed)

  No known cause fits; this is the first observed divergence, not a root cause. The difference is at the level of floating-point rounding (normwise relative difference 1e-07): accumulating micro-batch gradients adds the same numbers in another order. If that is expected, declare a tolerance (see docs/api.md, Accumulation equivalence).
  Losses returned by step(): reference 0.384621; candidate micro-batches 0.0245931, 0.130716, 0.0823211, 0.146992 (sum 0.384621).
  expected: 0.0527665
  actual:   0.0527665

All violations (6):
  1. gradients.0.weight (step 1, kind: gradient_mismatch)
  2. gradients.0.bias (step 1, kind: gradient_mismatch)
  3. gradients.2.weight (step 1, kind: gradient_mismatch)
  4. optimizer.state.0.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  5. optimizer.state.0.bias.momentum_buffer (step 1, kind: optimizer_state_mismatch)
  6. optimizer.state.2.weight.momentum_buffer (step 1, kind: optimizer_state_mismatch)

Notes:
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting not judged: step() returns a bare loss; the gradients phase judges what the loss did (return tp.LossAccounting(value, numerator, denominator) to have the normalization judged)""")

    def test_batchnorm_abstains(self) -> None:
        self.assertExpectedInline(report(recipes.WithBatchNorm), """\
trainparity accumulation check: ABSTAIN
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=4, recipe='test_accumulation_recipes:WithBatchNorm', seed=0, split='split_batch'
reason: model.1 (BatchNorm1d) normalizes by batch statistics in training mode: a micro-batch sees other statistics than the full batch, so accumulation equivalence cannot be verified; pass allow_batch_dependent=True to compare anyway

Notes:
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State""")

    def test_pass_with_notes(self) -> None:
        self.assertExpectedInline(report(recipes.TokenWeightedUnscaledValue, microbatches=(3, 3, 2)), """\
trainparity accumulation check: PASS
config: allow_batch_dependent=False, comparison='tolerance(rtol=1e-09, atol=1e-12)', cycles=2, disable_dropout=True, isolation='inprocess', microbatches=[3, 3, 2], recipe='test_accumulation_recipes:TokenWeightedUnscaledValue', seed=0, split='split_batch'

Notes:
  - dropout disabled in both runs (disable_dropout=True): no dropout module in the State
  - loss_accounting differs in windows 1, 2 (it would be diagnosed loss_not_scaled) but gradients, parameters, optimizer and scheduler state agree with the reference: LossAccounting.value should be the loss back-propagated by that call; not failed""")
