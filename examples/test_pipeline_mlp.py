"""A pipeline-parallel MLP on two gloo ranks (1F1B, a weight tied across the first and last stage) against the whole
model in one process, and the micro-batch scaling bug the schedule makes easy, named at its stage."""

import unittest

from pipeline_mlp import Pipeline

import trainparity as tp


class TestPipelineMLP(tp.TestCase):
    def test_two_stages_under_1f1b_train_like_the_whole_model_in_one_process(self) -> None:
        self.assertParallelEquivalent(Pipeline("1f1b", microbatches=4, tied=True), world_size=2, steps=2, timeout=120)

    def test_gradients_summed_over_micro_batches_are_named(self) -> None:
        result = tp.check_parallel(Pipeline("gpipe", microbatches=2, fault="not_scaled"), world_size=2, steps=2,
                                   timeout=120)
        self.assertEqual(result.outcome, tp.Outcome.FAIL, result.report())
        first = result.violations[0]
        self.assertEqual((first.path, first.rank, first.cause), ("gradients.embed.weight", 0, "loss_not_scaled"))


if __name__ == "__main__":
    unittest.main()
