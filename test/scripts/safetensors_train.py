"""A training script whose checkpoints are safetensors files only, written for this project's tests.

As `save_pretrained` does, the model goes to `model.safetensors` with `safetensors.torch.save_model`
(the iteration in the file's metadata); the SGD momentum buffers and the RNG state follow in
`state.safetensors` with `save_file`. `--resume` loads both. Batches are drawn from the global
RNG and the model has dropout, so the resumed run matches only if the RNG state is restored.
"""

import argparse
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
data = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
target = data.sum(dim=1, keepdim=True)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model_path = os.path.join(args.out_dir, "model.safetensors")
state_path = os.path.join(args.out_dir, "state.safetensors")
iteration = 0
if args.resume:
    load_model(model, model_path)
    with safe_open(model_path, "pt") as checkpoint:
        iteration = int(checkpoint.metadata()["iteration"])
    state = load_file(state_path)
    for name, parameter in model.named_parameters():
        optimizer.state[parameter]["momentum_buffer"] = state[name]
    torch.set_rng_state(state["rng"])

while iteration < 10:
    ids = torch.randint(0, len(data), (8,))
    probe.sample_ids(ids)
    loss = nn.functional.mse_loss(model(data[ids]), target[ids])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    iteration += 1
    if iteration % 3 == 0:
        save_model(model, model_path, metadata={"iteration": str(iteration)})
        buffers = {name: optimizer.state[p]["momentum_buffer"] for name, p in model.named_parameters()}
        save_file({**buffers, "rng": torch.get_rng_state()}, state_path)
