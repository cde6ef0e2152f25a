"""Real architectures under the training checks: a tiny Llama (and Qwen2) language model and a tiny BERT classifier,
built from their configs (nothing downloaded). transformers is a test-only extra: these tests skip without it.

Run: python -m pytest examples/test_transformer_training.py
"""

import importlib.util
import unittest

from transformer_training import CausalLM, TextClassifier, classifier_learning_rate, lm_learning_rate

import trainparity as tp

EXTRA = 'transformers is a test-only extra: python -m pip install -e ".[frameworks]" "torch==2.13.0"'
needs_transformers = unittest.skipIf(importlib.util.find_spec("transformers") is None, EXTRA)
#: a tiny model at these learning rates moves its weights by up to a fifth per step
BAND = (1e-4, 0.5)


@needs_transformers
class TestLanguageModel(tp.TestCase):
    def test_it_overfits_one_batch(self) -> None:
        for architecture in ("llama", "qwen2"):
            with self.subTest(architecture=architecture):
                self.assertOverfitsOneBatch(CausalLM(architecture), steps=60)

    def test_the_loss_goes_down(self) -> None:
        self.assertLossDecreases(CausalLM, steps=20, min_decrease=0.2)

    def test_updates_are_healthy_and_follow_the_cosine_schedule(self) -> None:
        result = self.assertTrainingHealthy(CausalLM, steps=12, max_grad_norm=3.0, update_ratio=BAND,
                                            lr_schedule=lm_learning_rate)
        # transformers' warmup starts from a learning rate of 0: declared, so its first step's update is not judged;
        # the health assertion also says how far the loss stayed from its default divergence bound
        self.assertEqual(result.notes[1:], [
            "The update ratio of optimizer 'optimizer' was not judged at step 1: lr_schedule declares a learning rate "
            "of 0 there."])
        self.assertRegex(result.notes[0], r"^Loss: at most [0-9.]+ \(step [0-9]+\), below max_loss_growth=100.0 times")
        self.assertEqual(result.telemetry[0].updates[0].update_ratio, [0.0, 0.0])


@needs_transformers
class TestTextClassifier(tp.TestCase):
    def test_it_overfits_one_batch(self) -> None:
        self.assertOverfitsOneBatch(TextClassifier, steps=40)

    def test_the_loss_goes_down(self) -> None:
        self.assertLossDecreases(TextClassifier, steps=40, min_decrease=0.5)

    def test_updates_are_healthy_and_follow_the_linear_schedule(self) -> None:
        self.assertTrainingHealthy(TextClassifier, steps=12, max_grad_norm=5.0, update_ratio=BAND,
                                   lr_schedule=classifier_learning_rate)

    def test_a_schedule_off_by_one_is_caught_on_a_real_architecture(self) -> None:
        result = tp.check_training(TextClassifier, steps=6,
                                   lr_schedule=lambda index: classifier_learning_rate(index + 1))
        first = result.first_violation
        assert first is not None
        self.assertEqual((first.path, first.cause, first.step), ("optimizer.param_groups.0.lr", "lr_mismatch", 1))
        self.assertIn("the scheduler runs one step behind", first.message)


if __name__ == "__main__":
    unittest.main()
