"""A PyTorch-Ignite training script, written the way Ignite's documentation writes checkpoint code.

A `DeterministicEngine` (`--engine plain`: an `Engine`) whose update function trains a small MLP with AdamW;
a torch `StepLR` wrapped in Ignite's `LRScheduler` handler on `Events.ITERATION_STARTED` (so it moves the
learning rate before the forward; `--scheduler_event completed`: after the update);
`Checkpoint(to_save={"trainer", "model", "optimizer", "lr_scheduler"}, DiskSaver(...))` every 3 iterations;
`--resume` loads the last checkpoint with `Checkpoint.load_objects` and calls `trainer.run` again, which
continues the epoch at the saved iteration (a plain `Engine` starts the epoch's batches again). The
loader's `DistributedSampler` (one replica) draws each epoch's order from its own seed and the epoch, which
Ignite sets. `--dropout` draws from the global RNG, which a plain Engine's checkpoint does not hold (the
DeterministicEngine seeds it from the iteration). Faults: `trainer_not_saved` (the trainer missing from
`to_save`: the resumed run starts the epoch and the iteration count again), `scheduler_not_saved` (the
`lr_scheduler` missing from `to_save`).
"""

import argparse
import glob
import os

import torch
from ignite.engine import DeterministicEngine, Engine, Events
from ignite.handlers import Checkpoint, DiskSaver
from ignite.handlers.param_scheduler import LRScheduler
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--max_steps", type=int, default=32)
parser.add_argument("--engine", default="deterministic", choices=["deterministic", "plain"])
parser.add_argument("--scheduler_event", default="started", choices=["started", "completed"])
parser.add_argument("--fault", default="none", choices=["none", "trainer_not_saved", "scheduler_not_saved"])
args = parser.parse_args()

torch.manual_seed(0)
generator = torch.Generator().manual_seed(1)
dataset = TensorDataset(torch.arange(32), torch.randn(32, 4, generator=generator),
                        torch.randn(32, 1, generator=generator))
loader = DataLoader(dataset, batch_size=args.batch, sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=0))
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(engine: Engine, batch: list[torch.Tensor]) -> float:
    ids, x, y = batch
    probe.sample_ids(ids)
    model.train()
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


trainer = DeterministicEngine(train_step) if args.engine == "deterministic" else Engine(train_step)
lr_scheduler = LRScheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5))
event = Events.ITERATION_STARTED if args.scheduler_event == "started" else Events.ITERATION_COMPLETED
trainer.add_event_handler(event, lr_scheduler)
to_save = {"trainer": trainer, "model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler}
if args.fault == "trainer_not_saved":
    del to_save["trainer"]
if args.fault == "scheduler_not_saved":
    del to_save["lr_scheduler"]
checkpoint = Checkpoint(to_save, DiskSaver(args.out_dir, require_empty=False), n_saved=None)
trainer.add_event_handler(Events.ITERATION_COMPLETED(every=3), checkpoint)
if args.resume:
    last = max(glob.glob(os.path.join(args.out_dir, "checkpoint_*.pt")), key=os.path.getmtime)
    Checkpoint.load_objects(to_load=to_save, checkpoint=torch.load(last, weights_only=False))
trainer.add_event_handler(Events.ITERATION_COMPLETED(once=args.max_steps), lambda engine: engine.terminate())
trainer.run(loader, max_epochs=4)
