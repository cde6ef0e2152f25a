"""Quickstart: optimizer coverage, one clean fine-tuning setup and one that replaces the head too late.

Run it with `python -m trainparity.quickstarts.optimizer_coverage`. Both recipes fine-tune a
small MLP classifier: a frozen encoder and a new head for 10 classes. The clean one builds the
optimizer from the trainable parameters of the finished model. The deliberate bug builds the
optimizer from the whole pretrained model, then replaces its head: the optimizer holds the frozen
encoder and the old head, and no optimizer holds the new head, which therefore never trains.
The check reads the State right after `setup()` and after one step, so it costs a few
milliseconds. Exit status 0 when the clean recipe passes and the buggy one fails with
`optimizer_for_other_model`, 1 otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from torch import nn

import trainparity as tp
from trainparity.quickstarts import shown


class FineTune(tp.Recipe):
    """A pretrained encoder, frozen, and a new 10-class head; AdamW over the trainable parameters."""

    def pretrained(self) -> nn.Sequential:
        encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        return nn.Sequential(encoder, nn.Linear(32, 100))  # pretrained on 100 classes

    def setup(self) -> tp.State:
        model = self.pretrained()
        model[0].requires_grad_(False)
        model[1] = nn.Linear(32, 10)  # the new task's head
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        return tp.State(model=model, optimizer=optimizer)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(16, 16, generator=generator), torch.randint(0, 10, (16,), generator=generator)

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        return loss.detach()


class HeadReplacedAfterOptimizer(FineTune):
    """A common bug: the optimizer is built before the head is replaced (and before the encoder is frozen)."""

    def setup(self) -> tp.State:
        model = self.pretrained()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the bug: built too early
        model[0].requires_grad_(False)
        model[1] = nn.Linear(32, 10)
        return tp.State(model=model, optimizer=optimizer)


def main() -> int:
    clean = tp.check_optimizer_coverage(FineTune)
    broken = tp.check_optimizer_coverage(HeadReplacedAfterOptimizer)
    return shown(clean, broken, "optimizer_for_other_model")


if __name__ == "__main__":
    sys.exit(main())
