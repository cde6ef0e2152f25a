"""A small classifier trained the way tutorials train one, under the checks every training test suite starts with.

- synthetic features of 4 classes (a Gaussian cluster each, 16 dimensions), batches of 32 drawn from a generator
  seeded by the batch's position;
- an MLP, and a cross-entropy whose logits are scaled by a learned temperature (CLIP's `logit_scale`) that the
  criterion module holds;
- AdamW with two parameter groups (the temperature without weight decay), a linear warmup then cosine decay
  (`LambdaLR`, the same function `learning_rate` states), float16 autocast with a GradScaler (on CPU here, as on a
  GPU), `unscale_` then `clip_grad_norm_` before `scaler.step`.

`Classifier(fault=...)` carries one deliberate bug each, modelled on a real one (see FAULTS); `tools/validate.py`
checks that each is caught (surface "training"), and `test_classifier.py` runs the checks as a test suite would.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

import trainparity as tp

FEATURES, CLASSES, BATCH_SIZE = 16, 4, 32
#: AdamW's learning rate, reached after WARMUP optimizer steps and decayed to 0 over TOTAL
LR, WARMUP, TOTAL = 5e-3, 5, 200
#: the batch size the learning rate was tuned for (the linear scaling rule)
REFERENCE_BATCH_SIZE = 32

FAULTS = (
    "lr_zero",  # the linear scaling rule with integer division: LR * (32 // 256) is 0
    "detached_loss",  # the logits detached for the accuracy metric, and the detached ones used for the loss
    "frozen_model",  # model.requires_grad_(False) left by an embedding extraction: only the temperature trains
    "lr_too_high",  # a learning rate given in the wrong unit: 5 where 5e-3 was meant (1e3 too high)
    "static_loss_scale",  # scaler.update(2.0**24): a static loss scale too large for float16, every step overflows
    "scheduler_before_optimizer",  # scheduler.step() before scaler.step(optimizer): the schedule runs a step ahead
)


def factor(index: int) -> float:
    """The schedule's multiplier at the optimizer step `index` (from 0, as LambdaLR counts)."""
    if index < WARMUP:
        return (index + 1) / WARMUP
    return 0.5 * (1.0 + math.cos(math.pi * (index - WARMUP) / (TOTAL - WARMUP)))


def learning_rate(index: int) -> float:
    """The learning rate the schedule gives the optimizer step `index`: what `lr_schedule=` declares."""
    return LR * factor(index)


def _centers() -> torch.Tensor:
    return 1.5 * torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(2024))


CENTERS = _centers()


def batch_at(position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch at `position` of the stream: features and labels."""
    generator = torch.Generator().manual_seed(position)
    labels = torch.randint(0, CLASSES, (BATCH_SIZE,), generator=generator)
    return CENTERS[labels] + torch.randn(BATCH_SIZE, FEATURES, generator=generator), labels


class LearnedTemperature(nn.Module):
    """Cross-entropy of logits scaled by exp(logit_scale), a learned temperature."""

    def __init__(self) -> None:
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float() * self.logit_scale.exp(), labels)


class Classifier(tp.Recipe):
    def __init__(self, fault: str | None = None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        criterion = LearnedTemperature()
        lr = {"lr_zero": LR * (BATCH_SIZE // 256), "lr_too_high": LR * 1e3}.get(self.fault or "", LR)
        lr *= BATCH_SIZE / REFERENCE_BATCH_SIZE  # the linear scaling rule
        optimizer = torch.optim.AdamW([{"params": model.parameters(), "weight_decay": 0.01},
                                       {"params": criterion.parameters(), "weight_decay": 0.0}], lr=lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        static = self.fault == "static_loss_scale"
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24 if static else 1024.0)
        if self.fault == "frozen_model":  # the bug: left frozen by an embedding extraction before training
            model.requires_grad_(False)
        return tp.State(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                        position=0, accuracy=0.0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:  # the position counts the batches taken, so that a resumed run goes on after them
            state.position += 1
            yield batch_at(state.position - 1)

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        features, labels = batch
        with torch.autocast("cpu", dtype=torch.float16):
            logits = state.model(features)
        if self.fault == "detached_loss":  # the bug: detached for the metric below, then used for the loss too
            logits = logits.detach()
        loss: torch.Tensor = state.criterion(logits, labels)
        state.accuracy = float((logits.argmax(dim=1) == labels).float().mean())
        state.optimizer.zero_grad()
        state.scaler.scale(loss).backward()
        state.scaler.unscale_(state.optimizer)
        nn.utils.clip_grad_norm_([*state.model.parameters(), *state.criterion.parameters()], max_norm=1.0)
        if self.fault == "scheduler_before_optimizer":
            state.scheduler.step()
        state.scaler.step(state.optimizer)
        state.scaler.update(2.0**24 if self.fault == "static_loss_scale" else None)
        if self.fault != "scheduler_before_optimizer":
            state.scheduler.step()
        return loss.detach()
