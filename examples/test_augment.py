"""The augmentation pipeline's workers, tested as its authors would: no two workers, and no two epochs, draw the
same augmentations.

Run: python -m pytest examples/test_augment.py (or python -m unittest from examples/).
"""

import unittest

from augment import loader, stream_loader

import trainparity as tp


class TestAugmentationWorkers(tp.TestCase):
    def test_workers_and_epochs_draw_their_own_augmentations(self) -> None:
        self.assertWorkerRandomness(loader(), epochs=2)

    def test_the_streaming_loader_derives_its_generator_from_the_worker_and_the_epoch(self) -> None:
        self.assertWorkerRandomness(stream_loader(), epochs=3)

    def test_what_a_generator_built_in_init_looks_like(self) -> None:
        result = tp.check_worker_randomness(loader(fault="generator_built_in_init"), epochs=1)
        first = result.first_violation
        assert first is not None, result.report()
        self.assertEqual((first.path, first.kind, first.worker), ("dataset.augment.shift.rng", "worker_rng_shared", 1))


if __name__ == "__main__":
    unittest.main()
