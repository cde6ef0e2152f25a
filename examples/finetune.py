"""Fine-tuning a small CNN classifier the way vision codebases do: a backbone of stages, the first ones frozen.

- synthetic 12x12 images of 4 classes (a bright bar in one of four places), 64 for training and 16 held out;
- `Backbone`: a stem and two stages (convolution, BatchNorm, ReLU). `frozen_stages` of them are frozen the way
  mmpretrain's ResNet freezes them (`_freeze_stages`: requires_grad off and eval mode, applied again by its
  `train()` override so that `model.train()` keeps them in eval: mmcv's `norm_eval`); `Head`: dropout and a
  linear classifier;
- training in two stages: the whole network first adapts to the new task (`warmup_steps` steps, in `setup()`),
  then the stem and the first stage are frozen and the rest trains: the steps the checks observe. AdamW holds
  every parameter throughout, as mmcv's optimizer builder does, which is harmless as long as a frozen
  parameter's `.grad` is None;
- an evaluation on the held-out images every `eval_every` steps, inside `step()`: in eval mode, under
  `torch.no_grad()`, back to train mode after.

`FineTune(fault=...)` carries one deliberate bug each, modelled on a real one (see FAULTS);
`tools/validate.py` checks that each is caught (surfaces "frozen" and "train-mode").
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

import trainparity as tp

SIZE, CLASSES = 12, 4
TRAIN, HELD_OUT = 64, 16
BATCH_SIZE = 8

FAULTS = (
    # the frozen check
    "stale_grad",  # zero_grad(set_to_none=False): the frozen stages keep their last gradient, AdamW moves them
    "bn_in_train_mode",  # frozen with requires_grad_(False) alone: their BatchNorm statistics keep updating
    "frozen_stages_never_applied",  # mmpretrain issue 702: the freeze happens in train(), which nothing calls
    # the train-mode check
    "eval_without_train",  # the evaluation switches to eval() and never back to train()
    "eval_in_train_mode",  # the evaluation runs under no_grad() without model.eval()
)


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2024)
    labels = torch.arange(TRAIN + HELD_OUT) % CLASSES
    images = 0.2 * torch.randn(TRAIN + HELD_OUT, 1, SIZE, SIZE, generator=generator)
    for index, label in enumerate(labels.tolist()):
        row, column = divmod(label, 2)
        images[index, 0, 2 + 6 * row : 4 + 6 * row, 1 + 6 * column : 5 + 6 * column] += 1.0
    return images, labels


IMAGES, LABELS = _images()


def conv_block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU())


class Backbone(nn.Module):
    """A stem and two stages; `frozen_stages` = k freezes the stem and the first k stages (mmpretrain's rule)."""

    def __init__(self, norm_eval: bool = True) -> None:
        super().__init__()
        self.stem = conv_block(1, 8)
        self.stages = nn.ModuleList([
            nn.Sequential(conv_block(8, 16), nn.MaxPool2d(2)),
            nn.Sequential(conv_block(16, 16), nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        ])
        self.norm_eval = norm_eval
        self.frozen_stages = -1

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features: torch.Tensor = self.stem(images)
        for stage in self.stages:
            features = stage(features)
        return features

    def freeze(self, frozen_stages: int) -> None:
        self.frozen_stages = frozen_stages
        self._freeze_stages()

    def _freeze_stages(self) -> None:
        frozen = [self.stem, *self.stages[: self.frozen_stages]] if self.frozen_stages >= 0 else []
        for module in frozen:
            module.requires_grad_(False)
            if self.norm_eval:  # without it, model.train() puts their BatchNorm layers back in train mode
                module.eval()

    def train(self, mode: bool = True) -> Backbone:
        super().train(mode)
        self._freeze_stages()
        return self


class Classifier(nn.Module):
    def __init__(self, norm_eval: bool = True) -> None:
        super().__init__()
        self.backbone = Backbone(norm_eval)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(16, CLASSES))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.backbone(images))
        return logits


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def batch_at(cursor: int) -> Batch:
    """The training batch at position `cursor` of the stream: IDs, images and labels."""
    order = torch.randperm(TRAIN, generator=torch.Generator().manual_seed(cursor * BATCH_SIZE // TRAIN))
    start = cursor * BATCH_SIZE % TRAIN
    ids = order[start : start + BATCH_SIZE]
    return ids, IMAGES[ids], LABELS[ids]


class FineTune(tp.Recipe):
    def __init__(self, fault: str | None = None, warmup_steps: int = 2, eval_every: int = 2) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault, self.warmup_steps, self.eval_every = fault, warmup_steps, eval_every

    def setup(self) -> tp.State:
        model = Classifier(norm_eval=self.fault != "bn_in_train_mode")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)  # every parameter, as mmcv
        state = tp.State(model=model, optimizer=optimizer, cursor=0, global_step=0, accuracy=[])
        for _ in range(self.warmup_steps):  # stage 1: the whole network adapts to the task
            self.train_on(state, batch_at(state.cursor))
            state.cursor += 1
        if self.fault == "frozen_stages_never_applied":
            model.backbone.frozen_stages = 1  # the bug: applied by the next model.train(), none before training
        else:
            model.backbone.freeze(1)  # stage 2: the stem and the first stage stay as they are
        return state

    def batches(self, state: tp.State) -> Iterator[Batch]:
        while True:  # the cursor counts the batches taken, so that a resumed run goes on after them
            state.cursor += 1
            yield batch_at(state.cursor - 1)

    def sample_ids(self, batch: Batch) -> torch.Tensor:
        return batch[0]

    def train_on(self, state: tp.State, batch: Batch) -> torch.Tensor:
        _, images, labels = batch
        loss = F.cross_entropy(state.model(images), labels)
        # The bug when faulted: zeroed gradients are still gradients; torch 1.x's default kept them.
        state.optimizer.zero_grad(set_to_none=self.fault != "stale_grad")
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        return loss.detach()

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        loss = self.train_on(state, batch)
        state.global_step += 1
        if state.global_step % self.eval_every == 0:
            state.accuracy.append(self.evaluate(state.model))
        return loss

    def evaluate(self, model: nn.Module) -> float:
        """Accuracy on the held-out images."""
        if self.fault != "eval_in_train_mode":  # the bug when faulted: no_grad() alone is not an evaluation
            model.eval()
        with torch.no_grad():
            predictions = model(IMAGES[TRAIN:]).argmax(dim=1)
        if self.fault not in ("eval_without_train", "eval_in_train_mode"):
            model.train()
        return float((predictions == LABELS[TRAIN:]).float().mean())
