"""A PyTorch Lightning training script, written for this project's tests.

A `LightningModule` regressor trained by `Trainer.fit`, its epochs of 3 batches drawn by a
sampler with `set_epoch` (Lightning calls it), an LR scheduler stepped per optimizer step, a
callback with state, and a `ModelCheckpoint` every 3 optimizer steps (the last batch of an
epoch); `--resume` continues
with `Trainer.fit(..., ckpt_path=...)` from the last checkpoint. `--accumulate` sets
`accumulate_grad_batches` and `--batch` the batch size (the data is the same for the same product).
`--fault callback_state_lost` leaves out the callback's
`load_state_dict` (Lightning's default does nothing), so a resumed run counts its batches from 0
again.
"""

import argparse
import glob
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--max_steps", type=int, default=9)
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--batch", type=int, default=4)
# the callback counts batches, micro-batches under accumulation: not tracked when runs of other batch sizes are compared
parser.add_argument("--untracked_counter", action="store_true")
parser.add_argument("--fault", default="none", choices=["none", "callback_state_lost"])
args = parser.parse_args()

BATCH = args.batch


class Rows(Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(3 * BATCH * args.accumulate, 4, generator=generator)
        self.y = torch.randn(3 * BATCH * args.accumulate, 1, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return index, self.x[index], self.y[index]


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        ids, x, y = batch
        probe.sample_ids(ids)
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class BatchCounter(Callback):
    def __init__(self):
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state_dict):
        if args.fault != "callback_state_lost":  # otherwise as if it were not defined: Callback's does nothing
            self.batches = state_dict["batches"]


L.seed_everything(0, verbose=False)
counter = BatchCounter()
if not args.untracked_counter:
    probe.track(counter=counter)
dataset = Rows()
loader = DataLoader(dataset, batch_size=BATCH, sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=0))
trainer = L.Trainer(
    max_steps=args.max_steps, accumulate_grad_batches=args.accumulate, accelerator="cpu", devices=1,
    callbacks=[counter, ModelCheckpoint(dirpath=args.out_dir, every_n_train_steps=3, save_top_k=-1)],
    logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
)
checkpoints = sorted(glob.glob(os.path.join(args.out_dir, "*.ckpt")), key=os.path.getmtime)
trainer.fit(Regressor(), loader, ckpt_path=checkpoints[-1] if args.resume else None)
