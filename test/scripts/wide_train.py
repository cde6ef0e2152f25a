"""A training script with tensors above trainparity's digest size, written for this project's tests.

`--fault optimizer_not_saved` checkpoints the model alone, so AdamW's moments restart on `--resume`;
`model_not_saved` the optimizer alone, so the weight restarts from its initialization: either way the State
at the load differs in tensors the check ships as digests.
"""

import argparse
import os

import torch
from torch import nn

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--fault", default="none", choices=["none", "optimizer_not_saved", "model_not_saved"])
args = parser.parse_args()

torch.manual_seed(0)
data = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
target = data[:, :128].clone()
model = nn.Linear(256, 128)  # a weight of 128 KiB: shipped as a digest
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
path = os.path.join(args.out_dir, "checkpoint.pt")
iteration = 0
if args.resume:
    checkpoint = torch.load(path, weights_only=True)
    if "model" in checkpoint:
        model.load_state_dict(checkpoint["model"])
    if "optimizer" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
    iteration = checkpoint["iteration"]

while iteration < 8:
    ids = torch.arange(8) + 8 * (iteration % 8)
    probe.sample_ids(ids)
    loss = nn.functional.mse_loss(model(data[ids]), target[ids])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    iteration += 1
    if iteration % 3 == 0:
        checkpoint = {"model": model.state_dict(), "iteration": iteration}
        if args.fault == "model_not_saved":
            del checkpoint["model"]
        if args.fault != "optimizer_not_saved":
            checkpoint["optimizer"] = optimizer.state_dict()
        torch.save(checkpoint, path)
