"""Recipes for the training check's tests: a float64 MLP regression trained as tutorials train one, each fault the
check names, and loops of other shapes (two optimizers, accumulation, a closure, no optimizer in the State).

Float64, so that the losses, norms and ratios the reports show have the same digits on every CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import trainparity as tp

LR, WARMUP = 1e-2, 3
FAULTS = ("lr_zero", "detached_loss", "frozen_model", "lr_too_high", "scheduler_before_optimizer", "nan_batch",
          "no_optimizer_step")
#: the target the regression learns
TRUE_MAP = torch.randn(8, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)

Batch = tuple[torch.Tensor, torch.Tensor]


def factor(index: int) -> float:
    """LambdaLR's multiplier at the optimizer step `index` (from 0): a linear warmup over WARMUP steps."""
    return min(1.0, (index + 1) / WARMUP)


def learning_rate(index: int) -> float:
    """What the schedule gives the optimizer step `index`."""
    return LR * factor(index)


def batch_at(position: int, size: int = 16) -> Batch:
    generator = torch.Generator().manual_seed(position)
    features = torch.randn(size, 8, generator=generator, dtype=torch.float64)
    return features, features @ TRUE_MAP


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2)).double()


class Fit(tp.Recipe):
    """AdamW with two parameter groups (weights with weight decay, biases without), a warmup LambdaLR, and
    `clip` (clip_grad_norm_'s max_norm) when given; `fault` one of FAULTS."""

    def __init__(self, fault: str | None = None, clip: float | None = None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        self.fault, self.clip = fault, clip

    def setup(self) -> tp.State:
        model = mlp()
        lr = {"lr_zero": 0.0, "lr_too_high": LR * 1e3}.get(self.fault or "", LR)
        optimizer = torch.optim.AdamW([
            {"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": 0.01},
            {"params": [p for p in model.parameters() if p.dim() == 1], "weight_decay": 0.0}], lr=lr)
        if self.fault == "frozen_model":
            model.requires_grad_(False)
        return tp.State(model=model, optimizer=optimizer,
                        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, factor), position=0)

    def batches(self, state: tp.State) -> Iterator[Batch]:
        while True:
            features, targets = batch_at(state.position)
            if self.fault == "nan_batch" and state.position == 2:
                features[0, 0] = float("nan")  # a corrupt sample in the third batch
            state.position += 1
            yield features, targets

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        features, targets = batch
        predictions = state.model(features)
        if self.fault == "detached_loss":
            predictions = predictions.detach()
        loss = nn.functional.mse_loss(predictions, targets)
        if self.fault in ("detached_loss", "frozen_model"):
            loss.requires_grad_()  # the answer to "element 0 of tensors does not require grad" that trains nothing
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if self.clip is not None:
            nn.utils.clip_grad_norm_(state.model.parameters(), self.clip)
        if self.fault == "scheduler_before_optimizer":
            state.scheduler.step()
        if self.fault != "no_optimizer_step":
            state.optimizer.step()
        if self.fault != "scheduler_before_optimizer":
            state.scheduler.step()
        return loss.detach()


class StaticScale(tp.Recipe):
    """float16 autocast with a GradScaler whose scale `scaler.update(new_scale)` keeps at `scale`: at 2**24 every
    step overflows and is skipped, at 2**10 none is."""

    def __init__(self, scale: float = 2.0**24) -> None:
        self.scale = scale

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        return tp.State(model=model, optimizer=optimizer, scaler=torch.amp.GradScaler("cpu", init_scale=self.scale))

    def batches(self, state: tp.State) -> Iterator[Batch]:
        position = 0
        while True:
            features, targets = batch_at(position)
            position += 1
            yield features.float(), targets.float()

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        features, targets = batch
        with torch.autocast("cpu", dtype=torch.float16):
            predictions = state.model(features)
        loss = nn.functional.mse_loss(predictions.float(), targets)
        state.optimizer.zero_grad()
        state.scaler.scale(loss).backward()
        state.scaler.step(state.optimizer)
        state.scaler.update(self.scale)
        return loss.detach()


class TwoOptimizers(Fit):
    """A generator and a critic of sorts: two models, two optimizers, both stepped in every call."""

    def setup(self) -> tp.State:
        first, second = mlp(), mlp()
        return tp.State(first=first, second=second, first_optimizer=torch.optim.SGD(first.parameters(), lr=0.05),
                        second_optimizer=torch.optim.Adam(second.parameters(), lr=1e-3), position=0)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        features, targets = batch
        losses = []
        for model, optimizer in ((state.first, state.first_optimizer), (state.second, state.second_optimizer)):
            loss = nn.functional.mse_loss(model(features), targets)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            losses.append(loss.detach())
        return losses[0]


class Accumulates(Fit):
    """Two calls of step() per optimizer step, the scheduler stepped with the optimizer."""

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        features, targets = batch
        loss = nn.functional.mse_loss(state.model(features), targets)
        (loss / 2).backward()  # type: ignore[no-untyped-call]
        state.position_in_window = getattr(state, "position_in_window", 0) + 1
        if state.position_in_window % 2 == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
            state.scheduler.step()
        return loss.detach()


class Closure(Fit):
    """LBFGS, whose step(closure) computes the loss and the gradients itself."""

    def setup(self) -> tp.State:
        model = mlp()
        return tp.State(model=model, optimizer=torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4), position=0)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        features, targets = batch

        def closure() -> torch.Tensor:
            state.optimizer.zero_grad()
            loss = nn.functional.mse_loss(state.model(features), targets)
            loss.backward()  # type: ignore[no-untyped-call]
            return loss

        loss: torch.Tensor = state.optimizer.step(closure)
        return loss.detach()


class OptimizerOutsideState(Fit):
    """The optimizer kept on the recipe, not in the State: the check cannot see its steps."""

    def setup(self) -> tp.State:
        model = mlp()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        return tp.State(model=model, position=0)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        features, targets = batch
        loss = nn.functional.mse_loss(state.model(features), targets)
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return loss.detach()


class ReturnsNothing(Fit):
    """step() trains but returns None."""

    def step(self, state: tp.State, batch: Batch) -> Any:
        super().step(state, batch)
        return None


class Wide(Fit):
    """A layer of 32 Ki weights, whose update the check measures on a sample."""

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 128), nn.Tanh(), nn.Linear(128, 2)).double()
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=LR), position=0)

    def step(self, state: tp.State, batch: Batch) -> torch.Tensor:
        features, targets = batch
        loss = nn.functional.mse_loss(state.model(features), targets)
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        return loss.detach()


class Regression(Wide):
    """A linear regression trained with Adam at `lr` (issue 37: at 1e3 its loss goes from 0.56 to about 4e7 in one
    step and its weights to about 1000), optionally from zero weights (`zero_init`); `Wide`'s step."""

    def __init__(self, lr: float = 1e-2, zero_init: bool = False) -> None:
        super().__init__()
        self.lr, self.zero_init = lr, zero_init

    def setup(self) -> tp.State:
        model = nn.Linear(8, 2).double()
        if self.zero_init:
            nn.init.zeros_(model.weight)
            nn.init.zeros_(model.bias)
        return tp.State(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=self.lr), position=0)

    def batches(self, state: tp.State) -> Iterator[Batch]:
        while True:
            features, targets = batch_at(state.position)
            state.position += 1
            yield features, targets / 4
