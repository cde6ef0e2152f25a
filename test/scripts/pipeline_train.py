"""A pipeline-parallel training script written the torchtitan way, for this project's tests.

Every rank builds the whole model (in float64) and deletes the layers it does not own, so each parameter keeps its
name in the whole model (`layers.2.weight` on the second of two stages). Alone (`python pipeline_train.py`) it trains
the whole model without a schedule; under `torchrun --nproc-per-node N` rank `r` holds stage `r` of a GPipe schedule
over `--microbatches` micro-batches, every stage reading the same batches. `--fault scaled_twice` divides each
micro-batch's loss by the number of micro-batches while the schedule scales the gradients too.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

from trainparity import probe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--microbatches", type=int, default=2)
parser.add_argument("--fault", default="none", choices=["none", "scaled_twice"])
args = parser.parse_args()

LAYERS, WIDTH, BATCH = 4, 6, 8


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(index): nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
                                     for index in range(LAYERS)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = torch.tanh(layer(x))
        return x


def mean_squared_error(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


torch.manual_seed(0)
model = Net()
schedule = None
if "RANK" in os.environ:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in list(model.layers):
        if int(name) * world // LAYERS != rank:
            del model.layers[name]
    loss_fn = mean_squared_error
    if args.fault == "scaled_twice":
        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return mean_squared_error(output, target) / args.microbatches
    stage = PipelineStage(model, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

generator = torch.Generator().manual_seed(1)
for step in range(args.steps):
    x, y = (torch.randn(BATCH, WIDTH, generator=generator, dtype=torch.float64) for _ in range(2))
    probe.sample_ids(torch.arange(step * BATCH, (step + 1) * BATCH))
    optimizer.zero_grad()
    if schedule is None:
        mean_squared_error(model(x), y).backward()
    elif dist.get_rank() == 0:
        schedule.step(x)
    elif dist.get_rank() == dist.get_world_size() - 1:
        schedule.step(target=y)
    else:
        schedule.step()
    optimizer.step()

if dist.is_initialized():
    dist.destroy_process_group()
