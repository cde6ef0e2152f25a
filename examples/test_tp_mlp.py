"""A tensor-parallel MLP on two gloo ranks against one process, and resumed on the same and on another
number of ranks through torch.distributed.checkpoint."""

import unittest

from tp_mlp import TensorParallelMLP

import trainparity as tp


class TestTensorParallelMLP(tp.TestCase):
    def test_two_tensor_parallel_ranks_train_like_one_process(self) -> None:
        self.assertParallelEquivalent(TensorParallelMLP(), world_size=2, steps=2, timeout=120)

    def test_a_row_parallel_output_never_all_reduced_is_named(self) -> None:
        result = tp.check_parallel(TensorParallelMLP("missing_reduction"), world_size=2, steps=2, timeout=120)
        self.assertEqual(result.outcome, tp.Outcome.FAIL, result.report())
        first = result.violations[0]
        self.assertEqual((first.path, first.cause), ("outputs.model.down", "tp_partial_not_reduced"))

    def test_resume_on_two_ranks_and_on_one_reproduces_training(self) -> None:
        for resume_world_size in (2, 1):
            with self.subTest(resume_world_size=resume_world_size):
                self.assertResumeEquivalent(TensorParallelMLP(), steps=6, resume_at=3, world_size=2,
                                            resume_world_size=resume_world_size, timeout=120)


if __name__ == "__main__":
    unittest.main()
