"""The fine-tuning loop's freezing and train/eval modes, tested as its authors would.

Run: python -m pytest examples/test_finetune.py (or python -m unittest from examples/).
"""

import unittest

from finetune import FineTune

import trainparity as tp

#: the stem and the first stage are frozen, their BatchNorm layers deliberately in eval mode (mmcv's norm_eval)
FROZEN = ["backbone.stem.*", "backbone.stages.0.*"]
IN_EVAL = ["backbone.stem", "backbone.stages.0"]


class TestFineTune(tp.TestCase):
    def test_what_setup_froze_stays_put(self) -> None:
        self.assertFrozen(FineTune)

    def test_the_declared_frozen_stages_are_frozen_and_stay_put(self) -> None:
        self.assertFrozen(FineTune, frozen=FROZEN, steps=3)

    def test_modules_train_in_train_mode_and_the_evaluation_leaves_training_alone(self) -> None:
        self.assertTrainMode(FineTune, eval_modules=IN_EVAL, steps=4)

    def test_the_optimizer_may_hold_the_frozen_stages(self) -> None:
        result = self.assertOptimizerCoverage(FineTune, steps=2)
        self.assertTrue(result.notes[0].startswith("Held but frozen: backbone.stem.0.weight"), result.notes)

    def test_resume_mid_training_reproduces_uninterrupted_training(self) -> None:
        self.assertResumeEquivalent(FineTune, steps=4, resume_at=2, timeout=120)


if __name__ == "__main__":
    unittest.main()
