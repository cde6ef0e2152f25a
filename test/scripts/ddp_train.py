"""A data-parallel training script written the way DDP tutorials write it, for this project's tests.

Alone (`python ddp_train.py`) it trains in one process on the whole batch. Under `torchrun --nproc-per-node N` each
rank wraps the model in DistributedDataParallel and reads its share of every batch through a DistributedSampler:
together the same samples. Rank 0 saves a checkpoint every `--save_every` steps (the others wait at a barrier);
`--resume` continues from it. `--fault`: `no_ddp` (the model is not wrapped: its gradients are never all-reduced),
`optimizer_not_saved` (the
checkpoint holds the model and the step but not the optimizer), `rank0_loads` (only rank 0 restores the model and
the optimizer: the others resume from a fresh start), `rank1_raises` (rank 1 raises at its second step).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--batch", type=int, default=8, help="the global batch: every rank's share together")
parser.add_argument("--save_every", type=int, default=3)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--fault", default="none", choices=["none", "no_ddp", "optimizer_not_saved",
                                                        "rank0_loads", "rank1_raises"])
args = parser.parse_args()

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

torch.manual_seed(0)
SAMPLES = 32
dataset = TensorDataset(torch.arange(SAMPLES), torch.randn(SAMPLES, 4, dtype=torch.float64),
                        torch.randn(SAMPLES, 1, dtype=torch.float64))
sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=1)
loader = DataLoader(dataset, batch_size=args.batch // world, sampler=sampler, drop_last=True)

raw_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
model = nn.parallel.DistributedDataParallel(raw_model) if distributed and args.fault != "no_ddp" else raw_model
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
checkpoint = os.path.join(args.out_dir, "checkpoint.pt")

step = 0
if args.resume:
    saved = torch.load(checkpoint, weights_only=True)
    if rank == 0 or args.fault != "rank0_loads":
        raw_model.load_state_dict(saved["model"])
        if "optimizer" in saved:
            optimizer.load_state_dict(saved["optimizer"])
    step = saved["step"]

steps_per_epoch = len(loader)
while step < args.steps:
    epoch, done = divmod(step, steps_per_epoch)
    sampler.set_epoch(epoch)
    for position, (ids, x, y) in enumerate(loader):
        if position < done:
            continue
        probe.sample_ids(ids)
        if args.fault == "rank1_raises" and rank == 1 and step == 1:
            raise RuntimeError("rank 1 ran out of data")
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.save_every == 0:
            if rank == 0:
                state = {"model": raw_model.state_dict(), "step": step}
                if args.fault != "optimizer_not_saved":
                    state["optimizer"] = optimizer.state_dict()
                torch.save(state, checkpoint)
            if distributed:
                dist.barrier()
        if step == args.steps:
            break

if distributed:
    dist.destroy_process_group()
