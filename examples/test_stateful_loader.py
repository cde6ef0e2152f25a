"""Mid-epoch resume through torchdata's StatefulDataLoader, tested as its authors would test it.

Skipped, with the reason, when torchdata is not installed (pip install "trainparity[torchdata]").
"""

import unittest

from stateful_loader import ROWS, TORCHDATA_MISSING, RowRegression, resumed_epoch

import trainparity as tp


@unittest.skipIf(TORCHDATA_MISSING is not None, TORCHDATA_MISSING or "")
class TestRowRegression(tp.TestCase):
    def test_resume_mid_epoch_reproduces_uninterrupted_training(self) -> None:
        # 5 batches per epoch: saving after step 3 resumes mid-epoch through loader.state_dict().
        self.assertResumeEquivalent(RowRegression, steps=8, resume_at=3, timeout=120)

    def test_accumulating_four_micro_batches_matches_one_full_batch(self) -> None:
        self.assertAccumulationEquivalent(RowRegression, microbatches=4)

    def test_a_restarted_job_finishes_the_epoch_without_repeating_a_sample(self) -> None:
        self.assertCoverage(resumed_epoch(world=2, stop_after=2), policy=tp.ExactlyOnce(range(ROWS)))


if __name__ == "__main__":
    unittest.main()
