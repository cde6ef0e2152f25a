"""A small CNN image classifier, trained the way a small training script trains one.

- synthetic 12x12 images of 4 classes (a bright bar in one of four places), IDs 0..63: the first
  50 are the training split, the last 14 are held out;
- on-the-fly augmentation in the DataLoader's 2 worker processes (a flip from Python's `random`, a
  shift and pixel noise from numpy), seeded per (epoch, sample) so that any worker, and a resumed
  run, draws the same augmentation for a sample; random erasing in the training loop, drawing
  from the global `random` and `np.random` streams;
- momentum SGD with weight decay, gradient clipping, an EMA of the weights
  (`torch.optim.swa_utils.AveragedModel`), `ReduceLROnPlateau` on the running training loss;
- gradient accumulation (`accumulation_steps`) and a mid-epoch resume: the cursor counts the
  batches the training loop took, and each epoch's DataLoader starts after them;
- `rank_loaders()`: the data-parallel input pipeline (a `DistributedSampler` per rank, or a
  streaming dataset), batches tagged with the worker that produced them, for the coverage checks.

`ShapesClassifier(fault=...)` and `rank_loaders(fault=...)` carry one deliberate bug each,
modelled on a real one (see `FAULTS`); `tools/validate.py` checks that each is caught.
"""

from __future__ import annotations

import math
import pathlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

import trainparity as tp

SIZE, CLASSES = 12, 4
TRAIN, HELD_OUT = 50, 14
BATCH_SIZE = 8

FAULTS = (
    # resume
    "optimizer_not_saved", "plateau_not_saved", "ema_rebuilt_on_resume", "numpy_rng_not_saved",
    "python_rng_not_saved", "cursor_counts_prefetched", "iterator_seeded_from_global_rng",
    # accumulation
    "grads_not_reset", "clip_per_microbatch",
    # coverage
    "rank_from_local_rank", "drop_last", "padded_to_whole_batches", "held_out_ids_leak",
    "set_epoch_forgotten", "stream_not_sharded_by_worker",
)


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    labels = torch.arange(TRAIN + HELD_OUT) % CLASSES
    images = 0.1 * torch.randn(TRAIN + HELD_OUT, 1, SIZE, SIZE, generator=generator)
    for index, label in enumerate(labels.tolist()):
        row, column = divmod(label, 2)
        images[index, 0, 2 + 6 * row : 4 + 6 * row, 1 + 6 * column : 5 + 6 * column] += 1.0
    return images, labels


IMAGES, LABELS = _images()


class Shapes(Dataset[tuple[int, torch.Tensor, int]]):
    """Map-style; item i is (i, augmented image, label). Augmentation is seeded by (seed, epoch, i)."""

    def __init__(self, epoch: int = 0, seed: int = 0, size: int = TRAIN) -> None:
        self.epoch, self.seed, self.size = epoch, seed, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, int]:
        draws = random.Random((self.seed * 1_000_003 + self.epoch) * 1_000_003 + index)
        noise = np.random.default_rng([self.seed, self.epoch, index])
        image = IMAGES[index].clone()
        if draws.random() < 0.5:
            image = image.flip(-1)
        shift = noise.integers(-1, 2, size=2).tolist()
        image = image.roll(shifts=(shift[0], shift[1]), dims=(-2, -1))
        image += torch.from_numpy(noise.normal(0.0, 0.05, size=image.shape).astype(np.float32))
        return index, image, int(LABELS[index])


def random_erasing(images: torch.Tensor, p: float = 0.5, patch: int = 4) -> torch.Tensor:
    """In the training loop, on the batch: erase a patch of each image with probability p."""
    images = images.clone()
    for image in images:
        if random.random() < p:
            top, left = np.random.randint(0, SIZE - patch + 1, size=2).tolist()
            image[:, top : top + patch, left : left + patch] = 0.0
    return images


class CountingBatches:
    """Bug: a batch sampler that counts the batches it hands out as the cursor; the DataLoader's workers
    prefetch, so the saved cursor runs ahead of training."""

    def __init__(self, batches: list[list[int]], state: tp.State) -> None:
        self.batches, self.state = batches, state

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            self.state.position += 1
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def classifier() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Dropout(0.2), nn.Linear(16, CLASSES),
    )


class ShapesClassifier(tp.Recipe):
    def __init__(self, accumulation_steps: int = 1, fault: str | None = None, plateau_every: int = 2,
                 max_grad_norm: float = 0.1) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.accumulation_steps, self.fault = accumulation_steps, fault
        self.plateau_every, self.max_grad_norm = plateau_every, max_grad_norm

    def setup(self) -> tp.State:
        model = classifier()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        return tp.State(
            model=model,
            ema=AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9)),  # type: ignore[no-untyped-call]
            optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0),
            epoch=0,
            position=0,  # batches of this epoch the training loop took
            micro_step=0,
            global_step=0,
            running_loss=0.0,  # sum of sample losses since the last plateau step
            running_samples=0,
        )

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        while True:
            epoch = state.epoch
            order = torch.randperm(TRAIN, generator=torch.Generator().manual_seed(epoch)).tolist()
            remaining = [order[i : i + BATCH_SIZE] for i in range(0, TRAIN, BATCH_SIZE)][state.position :]
            counting = self.fault == "cursor_counts_prefetched"
            loader = DataLoader(
                Shapes(epoch),
                batch_sampler=CountingBatches(remaining, state) if counting else remaining,
                num_workers=2,
                # Bug when faulted: without a generator, creating the iterator draws its base seed from the
                # global torch RNG, at the resume point in the resumed run but at the epoch start otherwise.
                generator=None if self.fault == "iterator_seeded_from_global_rng"
                else torch.Generator().manual_seed(epoch),
            )
            for ids, images, labels in loader:
                if not counting:
                    state.position += 1
                yield ids, random_erasing(images), labels
            state.epoch, state.position = epoch + 1, 0

    def sample_ids(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return batch[0]

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        _, images, labels = batch
        state.model.train()
        loss = F.cross_entropy(state.model(images), labels)
        (loss / self.accumulation_steps).backward()  # type: ignore[no-untyped-call]
        state.running_loss += loss.item() * len(labels)
        state.running_samples += len(labels)
        if self.fault == "clip_per_microbatch":  # clipped on each micro-batch's partial sum
            torch.nn.utils.clip_grad_norm_(state.model.parameters(), self.max_grad_norm)
        state.micro_step += 1
        if state.micro_step % self.accumulation_steps == 0:
            if self.fault != "clip_per_microbatch":
                torch.nn.utils.clip_grad_norm_(state.model.parameters(), self.max_grad_norm)
            state.optimizer.step()
            if self.fault != "grads_not_reset":
                state.optimizer.zero_grad(set_to_none=True)
            state.ema.update_parameters(state.model)
            state.global_step += 1
            if state.global_step % self.plateau_every == 0:
                state.scheduler.step(state.running_loss / state.running_samples)
                state.running_loss, state.running_samples = 0.0, 0
        return loss.detach()

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        checkpoint: dict[str, Any] = {
            "model": state.model.state_dict(),
            "ema": state.ema.state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict(),
            "counters": {name: state[name] for name in ("epoch", "position", "micro_step", "global_step",
                                                        "running_loss", "running_samples")},
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        }
        if self.fault == "optimizer_not_saved":
            del checkpoint["optimizer"]
        elif self.fault == "plateau_not_saved":
            del checkpoint["scheduler"]
        elif self.fault == "numpy_rng_not_saved":
            del checkpoint["rng"]["numpy"]
        elif self.fault == "python_rng_not_saved":
            del checkpoint["rng"]["python"]
        torch.save(checkpoint, path)

    def load(self, path: pathlib.Path) -> tp.State:
        state = self.setup()
        checkpoint = torch.load(path, weights_only=False)  # our own file: it holds numpy and Python RNG states
        state.model.load_state_dict(checkpoint["model"])
        if self.fault == "ema_rebuilt_on_resume":
            # Bug: the EMA is rebuilt from the loaded weights instead of loading its own state.
            state.ema = AveragedModel(state.model, multi_avg_fn=get_ema_multi_avg_fn(0.9))  # type: ignore[no-untyped-call]
        else:
            state.ema.load_state_dict(checkpoint["ema"])
        # Keys are optional so that checkpoints of older versions still load: an omission is silent.
        if "optimizer" in checkpoint:
            state.optimizer.load_state_dict(checkpoint["optimizer"])
        if "scheduler" in checkpoint:
            state.scheduler.load_state_dict(checkpoint["scheduler"])
        for name, value in checkpoint["counters"].items():
            setattr(state, name, value)
        rng = checkpoint["rng"]
        torch.set_rng_state(rng["torch"])
        if "numpy" in rng:
            np.random.set_state(rng["numpy"])
        if "python" in rng:
            random.setstate(rng["python"])
        return state


# -- the data-parallel input pipeline, for the coverage checks ------------------------------------------


class ShapeStream(IterableDataset[tuple[int, torch.Tensor, int]]):
    """The streaming variant: rank `rank` of `world` reads every world-th sample, each worker a share of that."""

    def __init__(self, rank: int, world: int, shard_by_worker: bool = True) -> None:
        self.rank, self.world, self.shard_by_worker = rank, world, shard_by_worker

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        shard = list(range(self.rank, TRAIN, self.world))
        info = torch.utils.data.get_worker_info()
        # Bug when faulted: every worker iterates the whole rank shard.
        if self.shard_by_worker and info is not None:
            shard = shard[info.id :: info.num_workers]
        dataset = Shapes()
        return (dataset[index] for index in shard)


class WholeBatchSampler(DistributedSampler[Any]):
    """Bug: pads every rank to a whole number of batches (so that no rank sees a short batch): far more
    padding than the remainder that DistributedSampler adds to make the epoch divisible by the world size."""

    def __init__(self, dataset: Dataset[Any], batch_size: int, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.num_samples = math.ceil(self.num_samples / batch_size) * batch_size
        self.total_size = self.num_samples * self.num_replicas


def rank_loaders(epoch: int = 0, world: int = 2, streaming: bool = False,
                 fault: str | None = None) -> dict[int, DataLoader[Any]]:
    """Each rank's DataLoader for one epoch: what every rank of a data-parallel job builds.

    Map-style: a `DistributedSampler` per rank (it pads the epoch to a multiple of `world`).
    Streaming: the `ShapeStream` iterable. Batches are tagged with the worker that produced them.
    """
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
    loaders = {}
    for rank in range(world):
        if streaming:
            stream = ShapeStream(rank, world, shard_by_worker=fault != "stream_not_sharded_by_worker")
            loaders[rank] = DataLoader(stream, batch_size=BATCH_SIZE, num_workers=2, collate_fn=tp.tag_workers())
            continue
        # Bug when faulted: the held-out samples are in the dataset the sampler shards.
        dataset = Shapes(epoch, size=TRAIN + HELD_OUT if fault == "held_out_ids_leak" else TRAIN)
        options: dict[str, Any] = {
            "num_replicas": world,
            "rank": 0 if fault == "rank_from_local_rank" else rank,  # Bug when faulted: the node-local rank
            "shuffle": True,
            "drop_last": fault == "drop_last",
        }
        sampler = (WholeBatchSampler(dataset, BATCH_SIZE, **options) if fault == "padded_to_whole_batches"
                   else DistributedSampler(dataset, **options))
        if fault != "set_epoch_forgotten":
            sampler.set_epoch(epoch)
        loaders[rank] = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=2,
                                   collate_fn=tp.tag_workers())
    return loaders


def sample_ids(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return batch[0]
