"""A Hugging Face Accelerate training script, written the way accelerate's `examples/by_feature/checkpointing.py`
writes checkpoint code.

`Accelerator(gradient_accumulation_steps=...)` prepares a small MLP, AdamW, a LambdaLR warmup and a shuffled
DataLoader (`DataLoaderConfiguration(use_seedable_sampler=True)`: each epoch's order from the seed and the
epoch); a stateful counter is registered with `register_for_checkpointing`. Each batch runs under
`accelerator.accumulate(model)`; every 3 optimizer steps `accelerator.save_state` writes a checkpoint
folder named by the step. `--resume` calls `accelerator.load_state` on the last one and skips the epoch's
batches already trained with `accelerator.skip_first_batches`. Faults: `scheduler_not_prepared` (the
scheduler left out of `prepare`, so `save_state` does not save it), `batches_not_skipped` (the resumed epoch
starts from its first batch), `skip_counts_optimizer_steps` (it skips as many batches as optimizer steps,
too few under accumulation), `loss_divided_twice` (the loss divided by the accumulation steps, which
`accelerator.backward` divides by already). `--unseeded_sampler` keeps accelerate's default sampler,
which draws each epoch's order from the global RNG.
"""

import argparse
import glob
import os

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--grad_accum", type=int, default=1)
parser.add_argument("--max_steps", type=int, default=30)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--unseeded_sampler", action="store_true")
FAULTS = ["none", "scheduler_not_prepared", "batches_not_skipped", "skip_counts_optimizer_steps", "loss_divided_twice"]
parser.add_argument("--fault", default="none", choices=FAULTS)
args = parser.parse_args()


class Counter:
    """State of the script's own, checkpointed through register_for_checkpointing."""

    def __init__(self) -> None:
        self.samples = 0

    def state_dict(self) -> dict[str, int]:
        return {"samples": self.samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.samples = state["samples"]


accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum,
                          dataloader_config=DataLoaderConfiguration(use_seedable_sampler=not args.unseeded_sampler))
set_seed(0)
generator = torch.Generator().manual_seed(1)
rows = 12 * args.batch * args.grad_accum
dataset = TensorDataset(torch.arange(rows), torch.randn(rows, 4, generator=generator),
                        torch.randn(rows, 1, generator=generator))
loader = DataLoader(dataset, batch_size=args.batch, shuffle=True)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
counter = Counter()
probe.track(counter=counter)
if args.fault == "scheduler_not_prepared":
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
else:
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
accelerator.register_for_checkpointing(counter)

completed_steps, starting_epoch, resume_batches = 0, 0, 0
batches_per_epoch = len(loader)
if args.resume:
    last = max(glob.glob(os.path.join(args.out_dir, "step_*")), key=lambda path: int(path.rsplit("_", 1)[1]))
    accelerator.load_state(last)
    completed_steps = int(last.rsplit("_", 1)[1])
    trained = completed_steps * (1 if args.fault == "skip_counts_optimizer_steps" else args.grad_accum)
    starting_epoch, resume_batches = divmod(trained, batches_per_epoch)
    if args.fault == "batches_not_skipped":
        resume_batches = 0

epoch = starting_epoch
while completed_steps < args.max_steps:
    active = loader
    if epoch == starting_epoch and resume_batches:
        active = accelerator.skip_first_batches(loader, resume_batches)
    for ids, x, y in active:
        with accelerator.accumulate(model):
            probe.sample_ids(ids)
            loss = nn.functional.mse_loss(model(x), y)
            if args.fault == "loss_divided_twice":
                loss = loss / args.grad_accum
            accelerator.backward(loss)
            counter.samples += len(ids)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            completed_steps += 1
            if completed_steps % 3 == 0:
                accelerator.save_state(os.path.join(args.out_dir, f"step_{completed_steps}"))
            if completed_steps == args.max_steps:
                break
    epoch += 1
