"""Snapshots of the worker randomness check's reports: the form users read and pin with expecttest."""

from __future__ import annotations

import pytest
import worker_datasets as datasets
from worker_datasets import augment

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


class TestWorkerRandomnessReports(tp.TestCase):
    def test_a_generator_copied_into_every_worker(self) -> None:
        result = tp.check_worker_randomness(datasets.augmented("generator_built_in_init"))
        self.assertExpectedInline(result.report(), """\
trainparity worker_randomness check: FAIL at dataset.augment.shift.rng (worker_rng_shared, epoch 0)
config: dataset='AugmentedImages', epochs=2, num_workers=2, persistent_workers=False

First violation: dataset.augment.shift.rng (epoch 0, worker 1, kind: worker_rng_shared, cause: worker_rng_shared)
  Stream dataset.augment.shift.rng (numpy.random.Generator) was consumed from the same state by workers 0 and 1 in epoch 0: they draw the same random numbers, so they apply the same random augmentations to different samples. It is copied into every worker as it is in this process (built once, e.g. in __init__). Seed it per worker in a worker_init_fn: info = torch.utils.data.get_worker_info(); info.dataset.augment.shift.rng = np.random.default_rng(torch.initial_seed()) (torch.initial_seed() differs per worker and per epoch).

All violations (6):
  1. dataset.augment.shift.rng (epoch 0, worker 1, kind: worker_rng_shared, cause: worker_rng_shared)
  2. dataset.augment.noise.generator (epoch 0, worker 1, kind: worker_rng_shared, cause: worker_rng_shared)
  3. dataset.augment.shift.rng (epoch 1, worker 1, kind: worker_rng_shared, cause: worker_rng_shared)
  4. dataset.augment.shift.rng (epoch 1, worker 0, kind: epoch_rng_repeated, cause: epoch_rng_repeated)
  5. dataset.augment.noise.generator (epoch 1, worker 1, kind: worker_rng_shared, cause: worker_rng_shared)
  6. dataset.augment.noise.generator (epoch 1, worker 0, kind: epoch_rng_repeated, cause: epoch_rng_repeated)

Notes:
  - Observed 2 epochs fetched by workers 0 and 1; batches: 8 in epoch 0, 8 in epoch 1.
  - Streams consumed while fetching: rng.numpy (workers 0 and 1), rng.python (workers 0 and 1), dataset.augment.shift.rng (workers 0 and 1), dataset.augment.noise.generator (workers 0 and 1).
  - Not consumed, so not judged: rng.torch.""")

    def test_a_global_stream_seeded_alike_by_worker_init_fn(self) -> None:
        result = tp.check_worker_randomness(datasets.augmented("python_seeded_in_worker_init"), epochs=1)
        self.assertExpectedInline(result.report(), """\
trainparity worker_randomness check: FAIL at rng.python (worker_rng_shared, epoch 0)
config: dataset='AugmentedImages', epochs=1, num_workers=2, persistent_workers=False

First violation: rng.python (epoch 0, worker 1, kind: worker_rng_shared, cause: worker_rng_shared)
  Stream rng.python (Python's random module) was consumed from the same state by workers 0 and 1 in epoch 0: they draw the same random numbers, so they apply the same random augmentations to different samples. The worker_init_fn seeds it to the same state in every worker; seed it from torch.initial_seed(), which differs per worker and per epoch: random.seed(torch.initial_seed()).

Notes:
  - Observed 1 epoch fetched by workers 0 and 1; batches: 8 in epoch 0.
  - Streams consumed while fetching: rng.numpy (workers 0 and 1), rng.python (workers 0 and 1), dataset.augment.shift.rng (workers 0 and 1), dataset.augment.noise.generator (workers 0 and 1).
  - Not consumed, so not judged: rng.torch.""")

    def test_persistent_workers_that_repeat_every_epoch(self) -> None:
        result = tp.check_worker_randomness(datasets.augmented("persistent_epoch_seed"), epochs=3)
        self.assertExpectedInline(result.report(), """\
trainparity worker_randomness check: FAIL at dataset.rng (epoch_rng_repeated, epoch 1)
config: dataset='AugmentedStream', epochs=3, num_workers=2, persistent_workers=True

First violation: dataset.rng (epoch 1, worker 0, kind: epoch_rng_repeated, cause: epoch_rng_repeated)
  Stream dataset.rng (numpy.random.Generator) in worker 0 of epoch 1 went through the states it had in worker 0 of epoch 0: epoch 1 repeats the random draws (the augmentations) of epoch 0. The workers are persistent (persistent_workers=True): they keep the objects they started with, so a seed derived from an epoch counter set in this process (set_epoch) never changes in them and the stream is reset to the same state every epoch. Draw each epoch's seed from a stream that goes on in the worker (torch.randint on its torch generator), or do not reseed it per epoch.

All violations (2):
  1. dataset.rng (epoch 1, worker 0, kind: epoch_rng_repeated, cause: epoch_rng_repeated)
  2. dataset.rng (epoch 2, worker 0, kind: epoch_rng_repeated, cause: epoch_rng_repeated)

Notes:
  - Observed 3 epochs fetched by workers 0 and 1; batches: 8 in epoch 0, 8 in epoch 1, 8 in epoch 2.
  - Streams consumed while fetching: dataset.rng (workers 0 and 1).
  - Not consumed, so not judged: rng.torch, rng.numpy, rng.python.""")

    def test_what_a_pass_observed(self) -> None:
        self.assertExpectedInline(tp.check_worker_randomness(augment.stream_loader()).report(), """\
trainparity worker_randomness check: PASS
config: dataset='AugmentedStream', epochs=2, num_workers=2, persistent_workers=False

Notes:
  - Observed 2 epochs fetched by workers 0 and 1; batches: 8 in epoch 0, 8 in epoch 1.
  - Streams consumed while fetching: dataset.rng (workers 0 and 1).
  - Not consumed, so not judged: rng.torch, rng.numpy, rng.python.""")

    def test_a_fetch_that_raises(self) -> None:
        report = tp.check_worker_randomness(datasets.numbers(broken_at=9), epochs=1).report()
        self.assertExpectedInline("\n".join(report.splitlines()[:3]), """\
trainparity worker_randomness check: ERROR
config: dataset='Numbers', epochs=1, num_workers=2, persistent_workers=False
reason: epoch 0, batch 2: the recipe raised ValueError: Caught ValueError in DataLoader worker process 0.""")
