"""A tiny GPT on FSDP2 with DCP checkpoints: resumed on the same and on another number of ranks, and
trained on two ranks against one process.

Each check runs every run as a world of real gloo ranks on the CPU. Skipped, with the reason, when
torchdata is not installed (pip install "trainparity[torchdata]").
"""

import unittest

from fsdp_gpt import TORCHDATA_MISSING, TinyGPT

import trainparity as tp


@unittest.skipIf(TORCHDATA_MISSING is not None, TORCHDATA_MISSING or "")
class TestTinyGPT(tp.TestCase):
    def test_resume_on_the_same_two_ranks_reproduces_training(self) -> None:
        self.assertResumeEquivalent(TinyGPT(), steps=6, resume_at=3, world_size=2, timeout=120)

    def test_resume_from_two_ranks_on_one_and_on_four_reproduces_training(self) -> None:
        for resume_world_size in (1, 4):
            with self.subTest(resume_world_size=resume_world_size):
                self.assertResumeEquivalent(TinyGPT(dropout=0.0), steps=6, resume_at=3, world_size=2,
                                            resume_world_size=resume_world_size, timeout=120)

    def test_rank_rng_saved_through_dcp_is_caught(self) -> None:
        # DCP keeps one copy of a key that every rank saves: all ranks but one load another rank's RNG.
        result = tp.check_resume(TinyGPT(fault="rng_in_dcp"), steps=6, resume_at=3, world_size=2, timeout=120)
        self.assertEqual(result.outcome, tp.Outcome.FAIL, result.report())
        first = result.violations[0]
        self.assertRegex(first.path, r"^rng\.torch\[rank [01]\]$")
        self.assertEqual(first.rank, int(first.path[-2]))  # the rank the path names
        self.assertEqual((first.cause, first.step), ("not_restored", 4))

    def test_the_loader_position_of_rank_0_on_one_rank_replays_samples(self) -> None:
        result = tp.check_resume(TinyGPT(dropout=0.0, fault="rank0_loader_position"), steps=6, resume_at=3,
                                 world_size=2, resume_world_size=1, timeout=120)
        self.assertEqual(result.outcome, tp.Outcome.FAIL, result.report())
        first = result.violations[0]
        self.assertEqual((first.path, first.cause, first.step), ("data.sample_ids", "data_replayed", 4))

    def test_two_fsdp_ranks_train_like_one_process(self) -> None:
        self.assertParallelEquivalent(TinyGPT(dropout=0.0), world_size=2, steps=3, timeout=120)

    def test_a_root_left_outside_fully_shard_keeps_unreduced_gradients(self) -> None:
        result = tp.check_parallel(TinyGPT(dropout=0.0, fault="root_not_sharded"), world_size=2, steps=3,
                                   timeout=120)
        self.assertEqual(result.outcome, tp.Outcome.FAIL, result.report())
        first = result.violations[0]
        self.assertEqual((first.path, first.cause), ("gradients.tokens.weight", "grads_not_synchronized"))


if __name__ == "__main__":
    unittest.main()
