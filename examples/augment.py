"""An image augmentation pipeline in DataLoader workers, built the way training scripts build one.

- synthetic 8x8 images of 4 classes; the augmentations draw from four streams: a flip from Python's `random`, a
  random erasing from numpy's global RNG, a shift from the transform's own `np.random.Generator`, pixel noise
  from its own `torch.Generator`;
- `seed_worker`, the `worker_init_fn` that seeds the transforms' own generators from `torch.initial_seed()`
  (torch gives every worker, in every epoch, its own), as the PyTorch reproducibility notes advise; torch
  already seeds the global streams per worker;
- `stream_loader()`: a streaming variant (an `IterableDataset` sharded by worker, with `set_epoch`) whose
  generator is derived from the worker id and the epoch in `__iter__`.

`loader(fault=...)` and `stream_loader(fault=...)` carry one deliberate bug each, modelled on real ones (see
`FAULTS`); `tools/validate.py` checks that `tp.check_worker_randomness` catches each, and passes the clean ones:

- `generator_built_in_init`: no `worker_init_fn`: the shift's generator, built with `np.random.default_rng(0)` in
  `__init__`, is copied into every worker as it is, so every worker shifts its images alike;
- `torch_generator_not_reseeded`: the `worker_init_fn` reseeds the numpy generator but forgets the noise
  transform's `torch.Generator`;
- `numpy_seeded_in_worker_init`: the `worker_init_fn` also calls `np.random.seed(0)` "for reproducibility";
- `python_seeded_in_worker_init`: it calls `random.seed(0)`;
- `persistent_epoch_seed`: the streaming loader with `persistent_workers=True`: its workers keep the dataset they
  started with, so the epoch that `set_epoch` sets in the training process never reaches them, and every epoch
  repeats the first one's augmentations.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

SIZE, CLASSES, COUNT, BATCH = 8, 4, 64, 8
#: the faults of the map-style loader (`loader`), and of the streaming one (`stream_loader`)
LOADER_FAULTS = ("generator_built_in_init", "torch_generator_not_reseeded", "numpy_seeded_in_worker_init",
                 "python_seeded_in_worker_init")
STREAM_FAULTS = ("persistent_epoch_seed",)
FAULTS = LOADER_FAULTS + STREAM_FAULTS


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    labels = torch.arange(COUNT) % CLASSES
    images = 0.1 * torch.randn(COUNT, 1, SIZE, SIZE, generator=generator)
    for index, label in enumerate(labels.tolist()):
        images[index, 0, 2 * label : 2 * label + 2, 1:-1] += 1.0
    return images, labels


IMAGES, LABELS = _images()


class Flip:
    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.flip(-1) if random.random() < 0.5 else image


class Erase:
    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if np.random.random() < 0.5:
            top, left = np.random.randint(0, SIZE - 2, size=2).tolist()
            image = image.clone()
            image[:, top : top + 2, left : left + 2] = 0.0
        return image


class Shift:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        rows, columns = self.rng.integers(-1, 2, size=2).tolist()
        return image.roll(shifts=(rows, columns), dims=(-2, -1))


class Noise:
    def __init__(self, generator: torch.Generator, scale: float = 0.05) -> None:
        self.generator, self.scale = generator, scale

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image + self.scale * torch.randn(image.shape, generator=self.generator)


class Augment:
    """Flip, erase, shift, noise: the transform a dataset applies to every image."""

    def __init__(self, seed: int = 0) -> None:
        self.flip, self.erase = Flip(), Erase()
        self.shift = Shift(np.random.default_rng(seed))
        self.noise = Noise(torch.Generator().manual_seed(seed))

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.noise(self.shift(self.erase(self.flip(image))))


class AugmentedImages(Dataset[tuple[int, torch.Tensor, int]]):
    """Map-style: item i is (i, augmented image i, label)."""

    def __init__(self) -> None:
        self.augment = Augment()

    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, int]:
        return index, self.augment(IMAGES[index]), int(LABELS[index])


class SeedWorker:
    """The `worker_init_fn`: each worker's own generators, from torch's seed for that worker (and epoch)."""

    def __init__(self, fault: str | None = None) -> None:
        self.fault = fault

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None
        seed = torch.initial_seed()
        augment: Augment = info.dataset.augment  # type: ignore[attr-defined]
        augment.shift.rng = np.random.default_rng(seed)
        if self.fault != "torch_generator_not_reseeded":
            augment.noise.generator.manual_seed(seed)
        if self.fault == "numpy_seeded_in_worker_init":  # the bug: "for reproducibility"
            np.random.seed(0)
        if self.fault == "python_seeded_in_worker_init":
            random.seed(0)


def loader(fault: str | None = None, num_workers: int = 2) -> DataLoader[tuple[int, torch.Tensor, int]]:
    """The training loader: shuffled, 2 workers, each worker's generators seeded by `SeedWorker`."""
    if fault is not None and fault not in LOADER_FAULTS:
        raise ValueError(f"loader() has no fault {fault!r}; its faults are {LOADER_FAULTS} "
                         f"(stream_loader()'s: {STREAM_FAULTS})")
    init = None if fault == "generator_built_in_init" else SeedWorker(fault)
    return DataLoader(AugmentedImages(), batch_size=BATCH, shuffle=True, num_workers=num_workers, worker_init_fn=init,
                      generator=torch.Generator().manual_seed(0))


class AugmentedStream(IterableDataset[tuple[int, torch.Tensor, int]]):
    """Streaming: each worker reads its shard of the images; its generator is derived from the worker id and the
    epoch when its iteration starts."""

    def __init__(self, seed: int = 0) -> None:
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self.rng = np.random.default_rng((self.seed, self.epoch, worker))
        for index in range(worker, COUNT, workers):
            rows, columns = self.rng.integers(-1, 2, size=2).tolist()
            image = IMAGES[index].roll(shifts=(rows, columns), dims=(-2, -1))
            yield index, image + torch.from_numpy(self.rng.normal(0.0, 0.05, image.shape).astype(np.float32)), \
                int(LABELS[index])


def stream_loader(fault: str | None = None) -> DataLoader[tuple[int, torch.Tensor, int]]:
    """The streaming loader: 2 workers, fresh each epoch (`persistent_workers=True` under the fault)."""
    if fault is not None and fault not in STREAM_FAULTS:
        raise ValueError(f"stream_loader() has no fault {fault!r}; its faults are {STREAM_FAULTS} "
                         f"(loader()'s: {LOADER_FAULTS})")
    return DataLoader(AugmentedStream(), batch_size=BATCH, num_workers=2,
                      persistent_workers=fault == "persistent_epoch_seed")

