"""The classifier's training loop under the checks a training test suite starts with, as its authors would test it.

Run: python -m pytest examples/test_classifier.py (or python -m unittest from examples/).
"""

import unittest

from classifier import Classifier, learning_rate

import trainparity as tp


class TestClassifierTraining(tp.TestCase):
    def test_the_loss_goes_down(self) -> None:
        self.assertLossDecreases(Classifier, steps=20, min_decrease=0.5)

    def test_it_overfits_one_batch(self) -> None:
        result = self.assertOverfitsOneBatch(Classifier, steps=60)
        self.assertIn("On one batch repeated, the loss fell from", result.notes[0])

    def test_updates_are_healthy_and_follow_the_schedule(self) -> None:
        self.assertTrainingHealthy(Classifier, steps=20, max_grad_norm=10.0, update_ratio=(1e-4, 0.1),
                                   lr_schedule=learning_rate)

    def test_a_frozen_model_is_caught(self) -> None:
        result = tp.check_training(Classifier("frozen_model"), steps=2, update_ratio=True)
        first = result.first_violation
        assert first is not None
        self.assertEqual((first.path, first.cause, first.step),
                         ("optimizer.param_groups.0.update_ratio", "update_too_small", 1))
        self.assertIn("all 6 of its parameters have requires_grad=False: they are frozen", first.message)


if __name__ == "__main__":
    unittest.main()
