"""A small training script that hangs where `--hang` says (for the timeout tests).

`--hang start` before the model is built, `step` in its first optimizer step, `save` while writing its
first checkpoint, `load` while reading it back under `--resume`; `none` trains 6 steps and saves every 2.
"""

import argparse
import os
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--hang", default="none", choices=["none", "start", "step", "save", "load"])
args = parser.parse_args()


def hang_if(where: str) -> None:
    if args.hang == where:
        time.sleep(3600)


hang_if("start")
torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
path = os.path.join(args.out_dir, "checkpoint.pt")
iteration = 0
if args.resume:
    hang_if("load")
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iteration = checkpoint["iteration"]
while iteration < 6:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(iteration))
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    if iteration == 0:
        hang_if("step")
    optimizer.step()
    iteration += 1
    if iteration % 2 == 0:
        hang_if("save")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}, path)
