"""The character-level language model's training semantics, tested as its authors would test them.

Run: python -m pytest examples/test_charlm.py (or python -m unittest from examples/).
"""

import unittest

from charlm import LINES, CharLM, coverage_epochs

import trainparity as tp


class TestCharLM(tp.TestCase):
    def test_resume_mid_epoch_reproduces_uninterrupted_training(self) -> None:
        # 6 batches per epoch: saving after step 3 resumes mid-epoch, and step 7 starts the next epoch.
        self.assertResumeEquivalent(CharLM, steps=8, resume_at=3, timeout=120)

    def test_accumulating_four_micro_batches_matches_one_full_batch(self) -> None:
        # Judged in float64 (the default): no tolerance to declare, on any CPU.
        self.assertAccumulationEquivalent(CharLM, microbatches=4, cycles=2)

    def test_every_line_once_per_epoch_in_a_new_order(self) -> None:
        self.assertCoverage(coverage_epochs(epochs=3),
                            policy=[tp.ExactlyOnce(range(len(LINES))), tp.DistinctEpochOrder()])

    def test_report_of_a_scheduler_rebuilt_after_loading_the_optimizer(self) -> None:
        # What a FAIL says; EXPECTTEST_ACCEPT=1 python -m pytest examples/test_charlm.py rewrites the snapshot.
        result = tp.check_resume(CharLM(fault="scheduler_rebuilt_after_optimizer_load"), steps=4, resume_at=2,
                                 timeout=120)
        first = result.first_violation
        assert first is not None, result.report()
        self.assertEqual((first.path, first.cause), ("optimizer.param_groups.0.lr", "not_restored"))
        self.assertExpectedInline(first.message, """\
The State right after load() differs from the State right after save().
Scalars are not equal!

Expected 0.00225 but got 0.00075.
Absolute difference: 0.0015
Relative difference: 0.666667""")


if __name__ == "__main__":
    unittest.main()
