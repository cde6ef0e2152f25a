"""A plain training loop in the shapes frameworks give it, for what "restored" means to the resume check.

`--shape top`: the scheduler steps at the top of each iteration, before the forward (Ignite's LRScheduler
handler on ITERATION_STARTED); `bottom`: after the optimizer step (the usual loop); `epoch`: once per epoch
of 4 iterations; `callback`: a callback writes state (a counter and a learning-rate warmup) before the
first forward of each iteration. Checkpoints every 3 iterations hold the model, the optimizer, the
scheduler, the callback's state and the iteration; `--fault scheduler_not_saved` leaves the scheduler
(and the callback's state) out, so the resumed run restarts them.
"""

import argparse
import os

import torch
from torch import nn

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--shape", default="bottom", choices=["top", "bottom", "epoch", "callback"])
parser.add_argument("--fault", default="none", choices=["none", "scheduler_not_saved"])
args = parser.parse_args()

torch.manual_seed(0)
data = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
target = data.sum(1, keepdim=True)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)


class Warmup:
    """A callback with state: counts the iterations it saw and sets the learning rate's warmup factor."""

    def __init__(self) -> None:
        self.seen = 0

    def on_iteration_started(self) -> None:
        self.seen += 1
        for group in optimizer.param_groups:
            group["lr"] = 0.1 * min(1.0, self.seen / 5)

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


callback = Warmup()
probe.track(callback=callback)
path = os.path.join(args.out_dir, "checkpoint.pt")
iteration = 0
if args.resume:
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if "scheduler" in checkpoint:
        scheduler.load_state_dict(checkpoint["scheduler"])
        callback.load_state_dict(checkpoint["callback"])
    iteration = checkpoint["iteration"]

while iteration < 8:
    if args.shape == "top":
        scheduler.step()
    if args.shape == "callback":
        callback.on_iteration_started()
    ids = torch.arange(4) + 4 * (iteration % 8)
    probe.sample_ids(ids)
    loss = nn.functional.mse_loss(model(data[ids]), target[ids])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.shape == "bottom" or args.shape == "epoch" and iteration % 4 == 3:
        scheduler.step()
    iteration += 1
    if iteration % 3 == 0:
        checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}
        if args.fault != "scheduler_not_saved":
            checkpoint["scheduler"] = scheduler.state_dict()
            checkpoint["callback"] = callback.state_dict()
        torch.save(checkpoint, path)
