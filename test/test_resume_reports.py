"""expecttest snapshots of the first-violation report of every resume fault.

Regenerate after an intended report change with
`EXPECTTEST_ACCEPT=1 python -m pytest test/test_resume_reports.py` (run it twice if expecttest
says "Failed to substitute string"), then read the diff.
"""

from __future__ import annotations

import re

import pytest
from resume_recipes import ResumeRecipe

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def report(fault: str, **kwargs: object) -> str:
    return tp.check_resume(ResumeRecipe(fault=fault, **kwargs), steps=6, resume_at=3, timeout=60).report()


class ResumeReportTest(tp.TestCase):
    def test_model(self) -> None:
        self.assertExpectedInline(report("model"), """\
trainparity resume check: FAIL at model.body.weight (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='model')", resume_at=3, seed=0, steps=6

First violation: model.body.weight (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  Tensor-likes are not equal!

  Mismatched elements: 48 / 48 (100.0%)
  Greatest absolute difference: 0.0148965 at index (6, 5)
  Greatest relative difference: 1.30049 at index (0, 0)
  expected: -0.224199
  actual:   -0.209302

All violations (46):
  1. model.body.weight (step 3, kind: state_mismatch, cause: not_restored)
  2. model.body.bias (step 3, kind: state_mismatch, cause: not_restored)
  3. model.head.weight (step 3, kind: state_mismatch, cause: not_restored)
  4. model.head.bias (step 3, kind: state_mismatch, cause: not_restored)
  5. loss (step 4, kind: loss_mismatch)
  6. model.body.weight (step 4, kind: state_mismatch)
  7. model.body.bias (step 4, kind: state_mismatch)
  8. model.head.weight (step 4, kind: state_mismatch)
  9. model.head.bias (step 4, kind: state_mismatch)
  10. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  ... and 36 more (result.violations has them all)""")

    def test_optimizer(self) -> None:
        self.assertExpectedInline(report("optimizer"), """\
trainparity resume check: FAIL at optimizer.state.body.weight.step (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='optimizer')", resume_at=3, seed=0, steps=6

First violation: optimizer.state.body.weight.step (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  The entry is missing.
  expected: 'Tensor[float32] of shape []'
  actual:   None

All violations (65):
  1. optimizer.state.body.weight.step (step 3, kind: state_mismatch, cause: not_restored)
  2. optimizer.state.body.weight.exp_avg (step 3, kind: state_mismatch, cause: not_restored)
  3. optimizer.state.body.weight.exp_avg_sq (step 3, kind: state_mismatch, cause: not_restored)
  4. optimizer.state.body.bias.step (step 3, kind: state_mismatch, cause: not_restored)
  5. optimizer.state.body.bias.exp_avg (step 3, kind: state_mismatch, cause: not_restored)
  6. optimizer.state.body.bias.exp_avg_sq (step 3, kind: state_mismatch, cause: not_restored)
  7. optimizer.state.head.weight.step (step 3, kind: state_mismatch, cause: not_restored)
  8. optimizer.state.head.weight.exp_avg (step 3, kind: state_mismatch, cause: not_restored)
  9. optimizer.state.head.weight.exp_avg_sq (step 3, kind: state_mismatch, cause: not_restored)
  10. optimizer.state.head.bias.step (step 3, kind: state_mismatch, cause: not_restored)
  ... and 55 more (result.violations has them all)""")

    def test_scheduler(self) -> None:
        self.assertExpectedInline(report("scheduler"), """\
trainparity resume check: FAIL at scheduler.last_epoch (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='scheduler')", resume_at=3, seed=0, steps=6

First violation: scheduler.last_epoch (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  Scalars are not equal!

  Expected 3 but got 0.
  Absolute difference: 3
  Relative difference: 1.0
  expected: 3
  actual:   0

All violations (31):
  1. scheduler.last_epoch (step 3, kind: state_mismatch, cause: not_restored)
  2. scheduler._step_count (step 3, kind: state_mismatch, cause: not_restored)
  3. scheduler._last_lr (step 3, kind: state_mismatch, cause: not_restored)
  4. optimizer.param_groups.0.lr (step 4, kind: state_mismatch)
  5. scheduler.last_epoch (step 4, kind: state_mismatch)
  6. scheduler._step_count (step 4, kind: state_mismatch)
  7. scheduler._last_lr (step 4, kind: state_mismatch)
  8. model.body.weight (step 5, kind: state_mismatch)
  9. model.body.bias (step 5, kind: state_mismatch)
  10. model.head.weight (step 5, kind: state_mismatch)
  ... and 21 more (result.violations has them all)""")

    def test_scaler(self) -> None:
        self.assertExpectedInline(report("scaler"), """\
trainparity resume check: FAIL at scaler.scale (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='scaler')", resume_at=3, seed=0, steps=6

First violation: scaler.scale (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  Scalars are not equal!

  Expected 32.0 but got 16.0.
  Absolute difference: 16.0
  Relative difference: 0.5
  expected: 32.0
  actual:   16.0

All violations (8):
  1. scaler.scale (step 3, kind: state_mismatch, cause: not_restored)
  2. scaler._growth_tracker (step 3, kind: state_mismatch, cause: not_restored)
  3. scaler.scale (step 4, kind: state_mismatch)
  4. scaler._growth_tracker (step 4, kind: state_mismatch)
  5. scaler.scale (step 5, kind: state_mismatch)
  6. scaler._growth_tracker (step 5, kind: state_mismatch)
  7. scaler.scale (step 6, kind: state_mismatch)
  8. scaler._growth_tracker (step 6, kind: state_mismatch)""")

    def test_rng_torch(self) -> None:
        self.assertExpectedInline(report("rng.torch"), """\
trainparity resume check: FAIL at rng.torch (not_restored, step 4)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='rng.torch')", resume_at=3, seed=0, steps=6

First violation: rng.torch (step 4, kind: rng_mismatch, cause: not_restored)
  The RNG stream at the start of the step differs from uninterrupted training: load() did not restore it.
  Generator states are not equal.

All violations (43):
  1. rng.torch (step 4, kind: rng_mismatch, cause: not_restored)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 33 more (result.violations has them all)""")

    def test_rng_numpy(self) -> None:
        self.assertExpectedInline(report("rng.numpy"), """\
trainparity resume check: FAIL at rng.numpy (not_restored, step 4)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='rng.numpy')", resume_at=3, seed=0, steps=6

First violation: rng.numpy (step 4, kind: rng_mismatch, cause: not_restored)
  The RNG stream at the start of the step differs from uninterrupted training: load() did not restore it.
  Generator states are not equal.

All violations (43):
  1. rng.numpy (step 4, kind: rng_mismatch, cause: not_restored)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 33 more (result.violations has them all)""")

    def test_rng_python(self) -> None:
        self.assertExpectedInline(report("rng.python"), """\
trainparity resume check: FAIL at rng.python (not_restored, step 4)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='rng.python')", resume_at=3, seed=0, steps=6

First violation: rng.python (step 4, kind: rng_mismatch, cause: not_restored)
  The RNG stream at the start of the step differs from uninterrupted training: load() did not restore it.
  Generator states are not equal.

All violations (43):
  1. rng.python (step 4, kind: rng_mismatch, cause: not_restored)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 33 more (result.violations has them all)""")

    def test_counter(self) -> None:
        self.assertExpectedInline(report("counter"), """\
trainparity resume check: FAIL at global_step (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='counter')", resume_at=3, seed=0, steps=6

First violation: global_step (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  Scalars are not equal!

  Expected 3 but got 0.
  Absolute difference: 3
  Relative difference: 1.0
  expected: 3
  actual:   0

All violations (52):
  1. global_step (step 3, kind: state_mismatch, cause: not_restored)
  2. data.sample_ids (step 4, position 0, sample 0, kind: data_mismatch, cause: data_replayed)
  3. loss (step 4, kind: loss_mismatch)
  4. model.body.weight (step 4, kind: state_mismatch)
  5. model.body.bias (step 4, kind: state_mismatch)
  6. model.head.weight (step 4, kind: state_mismatch)
  7. model.head.bias (step 4, kind: state_mismatch)
  8. model.temperature (step 4, kind: state_mismatch)
  9. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 42 more (result.violations has them all)""")

    def test_ema(self) -> None:
        self.assertExpectedInline(report("ema"), """\
trainparity resume check: FAIL at ema (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='ema')", resume_at=3, seed=0, steps=6

First violation: ema (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  Tensor-likes are not equal!

  Mismatched elements: 1 / 1 (100.0%)
  Greatest absolute difference: 0.245866 at index (0,)
  Greatest relative difference: 1.0 at index (0,)
  expected: 0.245866
  actual:   0.0

All violations (4):
  1. ema (step 3, kind: state_mismatch, cause: not_restored)
  2. ema (step 4, kind: state_mismatch)
  3. ema (step 5, kind: state_mismatch)
  4. ema (step 6, kind: state_mismatch)""")

    def test_eval_after_load(self) -> None:
        self.assertExpectedInline(report("eval_after_load"), """\
trainparity resume check: FAIL at model.training (not_restored, step 4)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='eval_after_load')", resume_at=3, seed=0, steps=6

First violation: model.training (step 4, kind: state_mismatch, cause: not_restored)
  The State's modules are in another mode (train or eval, which dropout and batch norm follow) after the step than in uninterrupted training. load() left them in 'eval' where the save found 'train', and no step set it since: call model.train() after loading.
  Modes are not equal!
  expected: 'train'
  actual:   'eval'

All violations (46):
  1. model.training (step 4, kind: state_mismatch, cause: not_restored)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 36 more (result.violations has them all)""")

    def test_attribute(self) -> None:
        self.assertExpectedInline(report("attribute"), """\
trainparity resume check: FAIL at model.temperature (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='attribute')", resume_at=3, seed=0, steps=6

First violation: model.temperature (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  Scalars are not equal!

  Expected 1.2 but got 1.0.
  Absolute difference: 0.2
  Relative difference: 0.166667
  expected: 1.2
  actual:   1.0

All violations (43):
  1. model.temperature (step 3, kind: state_mismatch, cause: not_restored)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 33 more (result.violations has them all)""")

    def test_optimizer2(self) -> None:
        self.assertExpectedInline(report("optimizer2"), """\
trainparity resume check: FAIL at optimizer2.state.head.weight.step (not_restored, step 3)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='optimizer2')", resume_at=3, seed=0, steps=6

First violation: optimizer2.state.head.weight.step (step 3, kind: state_mismatch, cause: not_restored)
  The State right after load() differs from the State right after save().
  The entry is missing.
  expected: 'Tensor[float32] of shape []'
  actual:   None

All violations (42):
  1. optimizer2.state.head.weight.step (step 3, kind: state_mismatch, cause: not_restored)
  2. optimizer2.state.head.weight.exp_avg (step 3, kind: state_mismatch, cause: not_restored)
  3. optimizer2.state.head.weight.exp_avg_sq (step 3, kind: state_mismatch, cause: not_restored)
  4. optimizer2.state.head.bias.step (step 3, kind: state_mismatch, cause: not_restored)
  5. optimizer2.state.head.bias.exp_avg (step 3, kind: state_mismatch, cause: not_restored)
  6. optimizer2.state.head.bias.exp_avg_sq (step 3, kind: state_mismatch, cause: not_restored)
  7. model.head.weight (step 4, kind: state_mismatch)
  8. model.head.bias (step 4, kind: state_mismatch)
  9. optimizer2.state.head.weight.step (step 4, kind: state_mismatch)
  10. optimizer2.state.head.weight.exp_avg (step 4, kind: state_mismatch)
  ... and 32 more (result.violations has them all)""")

    def test_data_replay(self) -> None:
        self.assertExpectedInline(report("data_replay"), """\
trainparity resume check: FAIL at data.sample_ids (data_replayed, step 4, sample 0)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='data_replay')", resume_at=3, seed=0, steps=6

First violation: data.sample_ids (step 4, position 0, sample 0, kind: data_mismatch, cause: data_replayed)
  The resumed run trained on other samples than uninterrupted training.
  The batch's sample IDs differ.
  expected: [12, 13, 14, 15]
  actual:   [0, 1, 2, 3]

All violations (45):
  1. data.sample_ids (step 4, position 0, sample 0, kind: data_mismatch, cause: data_replayed)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 35 more (result.violations has them all)""")

    def test_data_skip(self) -> None:
        self.assertExpectedInline(report("data_skip"), """\
trainparity resume check: FAIL at data.sample_ids (data_skipped, step 4, sample 16)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='data_skip')", resume_at=3, seed=0, steps=6

First violation: data.sample_ids (step 4, position 0, sample 16, kind: data_mismatch, cause: data_skipped)
  The resumed run trained on other samples than uninterrupted training.
  The batch's sample IDs differ.
  expected: [12, 13, 14, 15]
  actual:   [16, 17, 18, 19]

All violations (45):
  1. data.sample_ids (step 4, position 0, sample 16, kind: data_mismatch, cause: data_skipped)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 35 more (result.violations has them all)""")

    def test_rng_consumed(self) -> None:
        self.assertExpectedInline(report("rng_consumed"), """\
trainparity resume check: FAIL at rng.torch (rng_mismatch, step 4)
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='rng_consumed')", resume_at=3, seed=0, steps=6

First violation: rng.torch (step 4, kind: rng_mismatch)
  The RNG stream at the start of the step differs from uninterrupted training: it was restored, then consumed between load() and this step (for example by a new DataLoader iterator drawing its base seed).
  Generator states are not equal.

All violations (43):
  1. rng.torch (step 4, kind: rng_mismatch)
  2. loss (step 4, kind: loss_mismatch)
  3. model.body.weight (step 4, kind: state_mismatch)
  4. model.body.bias (step 4, kind: state_mismatch)
  5. model.head.weight (step 4, kind: state_mismatch)
  6. model.head.bias (step 4, kind: state_mismatch)
  7. optimizer.state.body.weight.exp_avg (step 4, kind: state_mismatch)
  8. optimizer.state.body.weight.exp_avg_sq (step 4, kind: state_mismatch)
  9. optimizer.state.body.bias.exp_avg (step 4, kind: state_mismatch)
  10. optimizer.state.body.bias.exp_avg_sq (step 4, kind: state_mismatch)
  ... and 33 more (result.violations has them all)""")

    def test_unrestored_stream_without_effect(self) -> None:
        self.assertExpectedInline(report("rng.python", use_python_random=False), """\
trainparity resume check: PASS
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='rng.python', use_python_random=False)", resume_at=3, seed=0, steps=6

Notes:
  - rng.python differs from uninterrupted training from step 4 on, but nothing else diverged: reported, not failed.""")

    def test_error_report_names_the_run(self) -> None:
        result = tp.check_resume(ResumeRecipe(fault="load_returns_dict"), steps=6, resume_at=3, timeout=60)
        head = result.report().split("Traceback from the recipe:")[0].rstrip()
        self.assertExpectedInline(head, """\
trainparity resume check: ERROR
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='load_returns_dict')", resume_at=3, seed=0, steps=6
reason: resumed: the recipe raised TypeError: ResumeRecipe.load() must return a tp.State, got dict""")

    def test_nondeterministic_baseline(self) -> None:
        # The values are random on every run: mask them, keep everything else.
        text = re.sub(r"-?\d+\.\d+(e-?\d+)?", "<float>", report("nondeterministic"))
        self.assertExpectedInline(text, """\
trainparity resume check: ABSTAIN
config: comparison='exact', isolation='process', precision='native', recipe="resume_recipes:ResumeRecipe(fault='nondeterministic')", resume_at=3, seed=0, steps=6
reason: baseline not reproducible: loss differs at step 1

First violation: loss (step 1, kind: nondeterministic_baseline, cause: baseline_nondeterministic)
  Two uninterrupted runs differ at step 1: the recipe is not reproducible, so resume equivalence cannot be judged.
  Scalars are not equal!

  Expected <float> but got <float>.
  Absolute difference: <float>
  Relative difference: <float>
  expected: <float>
  actual:   <float>""")
