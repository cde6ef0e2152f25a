"""The CNN classifier's training semantics and its data-parallel input pipeline, tested as its authors would.

Run: python -m pytest examples/test_cnn.py (or python -m unittest from examples/).
"""

import unittest

from cnn import TRAIN, ShapesClassifier, rank_loaders, sample_ids

import trainparity as tp


class TestShapesClassifier(tp.TestCase):
    def test_resume_mid_epoch_reproduces_uninterrupted_training(self) -> None:
        # 7 batches per epoch: saving after step 3 resumes mid-epoch, and step 8 starts the next epoch.
        self.assertResumeEquivalent(ShapesClassifier, steps=8, resume_at=3, timeout=120)

    def test_accumulating_four_micro_batches_matches_one_full_batch(self) -> None:
        self.assertAccumulationEquivalent(ShapesClassifier, microbatches=4)

    def test_the_optimizer_holds_every_trainable_parameter(self) -> None:
        # The EMA copy (AveragedModel) requires grad too; update_parameters() averages it, no optimizer.
        self.assertOptimizerCoverage(ShapesClassifier, steps=2)

    def test_two_ranks_see_every_sample_once_per_epoch_in_a_new_order(self) -> None:
        epochs = [rank_loaders(epoch, world=2) for epoch in range(2)]
        self.assertCoverage(epochs, policy=[tp.ExactlyOnce(range(TRAIN)), tp.DistinctEpochOrder()],
                            sample_ids=sample_ids)

    def test_four_ranks_pad_the_epoch_with_two_repeated_samples(self) -> None:
        # 50 samples over 4 ranks: DistributedSampler repeats 2 samples so that every rank gets 13.
        self.assertCoverage(rank_loaders(world=4), policy=tp.ExpectedPadding(range(TRAIN), padding=2),
                            sample_ids=sample_ids)

    def test_streaming_workers_share_the_rank_shard(self) -> None:
        self.assertCoverage(rank_loaders(world=2, streaming=True), policy=tp.ExactlyOnce(range(TRAIN)),
                            sample_ids=sample_ids)


if __name__ == "__main__":
    unittest.main()
