"""The switches of transformations.py change nothing about training, and each planted fault is caught with its
cause, tested as the script's authors would.

Run: python -m pytest examples/test_transformations.py (or python -m unittest from examples/).
"""

import unittest

from transformations import Transformed

import trainparity as tp


class TestTransformations(tp.TestCase):
    def test_activation_checkpointing_changes_nothing(self) -> None:
        self.assertEquivalent(Transformed, Transformed(checkpointing=True))

    def test_a_reentrant_checkpoint_over_frozen_embeddings_trains_nothing_inside(self) -> None:
        result = tp.check_equivalent(Transformed, Transformed(checkpointing=True, fault="reentrant_frozen_inputs"))
        self.assertEqual(result.first_violation.cause if result.first_violation else None, "checkpoint_without_grad",
                         result.report())

    def test_compiling_changes_nothing(self) -> None:
        self.assertEquivalent(Transformed(probe=True), Transformed(probe=True, compile_backend="aot_eager"))

    def test_a_hook_added_after_the_first_compiled_call_is_caught(self) -> None:
        late = Transformed(probe=True, fault="hook_after_compile")
        result = tp.check_equivalent(late, Transformed(probe=True, fault="hook_after_compile",
                                                       compile_backend="aot_eager"))
        self.assertEqual(result.first_violation.cause if result.first_violation else None, "compile_stale",
                         result.report())

    def test_evaluating_with_the_ema_weights_changes_nothing(self) -> None:
        self.assertEquivalent(Transformed, Transformed(evaluate_every=2))

    def test_ema_weights_left_in_the_model_are_caught(self) -> None:
        result = tp.check_equivalent(Transformed, Transformed(evaluate_every=2, fault="ema_not_restored"))
        self.assertEqual(result.first_violation.cause if result.first_violation else None,
                         "evaluation_changed_training", result.report())


if __name__ == "__main__":
    unittest.main()
