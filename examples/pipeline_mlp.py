"""A regression MLP trained with pipeline parallelism (torch.distributed.pipelining), written the torchtitan way:
every rank builds the whole model and deletes the layers it does not own, so each parameter keeps its fully
qualified name in the whole model (`layers.2.weight` on the second of two stages), and in a world of one rank the
recipe trains the whole model without a schedule (torchtitan with pipelining off): the reference
`tp.check_parallel` compares the stages with, parameter by parameter.

`Pipeline(schedule=..., microbatches=..., fault=..., tied=..., dp=...)`: an input layer, four hidden layers and a
head in as many stages as the world has pipeline ranks (twice as many under the interleaved schedule, each rank
holding two in loop order), the loss a mean over each micro-batch, the schedule scaling the gradients by the
number of micro-batches (`scale_grads=True`, its default). `tied=True` ties the head's weight to the input
layer's (as a language model ties its embedding and output projection): the first and last stage each hold a copy
and all-reduce its gradient, as Megatron-LM's embedding group does. `dp` replicas of the pipeline (a
`("dp", "pp")` mesh) read other shards of the batch and keep their gradients in sync over `dp`: by an
all-reduce after the schedule's step (`replicas="all_reduce"`), in DDP, or fully sharded (`replicas="fsdp"`, FSDP2
on each layer, as torchtitan does). `tp` ranks split each stage's pairs of hidden layers (column- then
row-parallel, `parallelize_module` on the mesh's `tp` dimension): dp x pp x tp.

`FAULTS` are deliberate bugs; `examples/test_pipeline_mlp.py`, `test/test_pipeline.py` and `tools/validate.py`
check that each is caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

import trainparity as tp

LAYERS, WIDTH, BATCH = 4, 6, 96

FAULTS = (
    # the schedule built with scale_grads=False while each micro-batch's loss is a mean: gradients summed
    "not_scaled",
    # the loss divided by n_microbatches while the schedule scales the gradients too
    "scaled_twice",
    # the tied weight's copies on the first and last stage never all-reduced
    "tied_unsynced",
    # the last stage detaches its input: backward never reaches the stages before it
    "detached",
    # the dp replicas shard the batch by the global rank instead of their dp rank: a pipeline's stages read
    # other samples
    "global_rank_sampler",
    # the dp replicas of each stage never all-reduce their gradients
    "replicas_unsynced",
    # the dp replicas' gradients all-reduced with a sum and never divided by their number
    "dp_summed",
    # the first stage adds a feature from each row's position in the tensor it is given (torch.arange over the
    # rows), not from its sample: the positions start again in every micro-batch
    "row_positions",
    # the State holds the stage's own module, its layers numbered from 0 on every stage: not the whole model's
    # names (the check abstains and says how to lay stages out)
    "stage_names",
)


class Net(nn.Module):
    """The whole model; `keep(stages, of)` deletes what the stages a rank does not hold own."""

    def __init__(self, tied: bool, row_positions: bool = False) -> None:
        super().__init__()
        self.row_positions = row_positions
        self.embed: nn.Linear | None = nn.Linear(WIDTH, WIDTH)
        self.layers = nn.ModuleDict({str(index): nn.Linear(WIDTH, WIDTH) for index in range(LAYERS)})
        self.head: nn.Linear | None = nn.Linear(WIDTH, WIDTH, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def keep(self, stages: list[int], of: int) -> None:
        if 0 not in stages:
            self.embed = None
        if of - 1 not in stages:
            self.head = None
        owned = {index for stage in stages for index in _layers_of(stage, of)}
        for index in range(LAYERS):
            if index not in owned:
                del self.layers[str(index)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = Chunk(self, 0, 1)(x)
        return out


def _layers_of(stage: int, of: int) -> range:
    per_stage = LAYERS // of
    return range(stage * per_stage, (stage + 1) * per_stage)


class Chunk(nn.Module):
    """One stage's computation over the layers it owns (registered here too, so that the schedule scales the
    gradients of this stage's parameters only)."""

    def __init__(self, net: Net, stage: int, of: int, detach_input: bool = False) -> None:
        super().__init__()
        self.embed = net.embed if stage == 0 else None
        self.layers = nn.ModuleList([net.layers[str(index)] for index in _layers_of(stage, of)])
        self.head = net.head if stage == of - 1 else None
        self.detach_input = detach_input
        self.row_positions = net.row_positions and stage == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.detach_input:
            x = x.detach()
        if self.row_positions:
            x = x + 0.01 * torch.arange(len(x), dtype=x.dtype)[:, None]
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x) if self.head is not None else x


def replicated(chunk: Chunk, replicas: str, mesh: DeviceMesh) -> nn.Module:
    """The stage's module as its data-parallel replicas keep it in sync: by the recipe's own all-reduce after the
    schedule's step ("all_reduce"), in DDP over the mesh's `dp` dimension, or with each layer fully sharded over it
    (FSDP2, torchtitan's way)."""
    if replicas == "ddp":
        return DistributedDataParallel(chunk, process_group=mesh["dp"].get_group())
    if replicas == "fsdp":
        for layer in chunk.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh["dp"])
        fully_shard(chunk, mesh=mesh["dp"])
    return chunk


def mean_squared_error(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


class Pipeline(tp.Recipe):
    def __init__(self, schedule: str = "gpipe", microbatches: int = 2, fault: str | None = None,
                 tied: bool = False, dp: int = 1, replicas: str = "all_reduce", tp: int = 1) -> None:
        self.schedule_name, self.microbatches, self.fault, self.tied, self.dp = schedule, microbatches, fault, tied, dp
        self.replicas, self.tp = replicas, tp

    def setup(self) -> tp.State:
        world = dist.get_world_size()
        torch.manual_seed(0)  # the same whole model on every rank, as one process builds it
        net = Net(self.tied, row_positions=self.fault == "row_positions")

        def optimizer() -> torch.optim.Optimizer:  # built after the stages are cut
            return torch.optim.SGD(net.parameters(), lr=0.1)

        self.schedule: Any = None
        self.dp_rank, self.dp_size = 0, 1
        self.tied_group: dist.ProcessGroup | None = None
        if world == 1:
            return tp.State(model=net, optimizer=optimizer())
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        dp = self.dp if world % (self.dp * self.tp) == 0 and world > self.dp * self.tp else 1
        mesh = init_device_mesh("cpu", (dp, world // (dp * self.tp), self.tp), mesh_dim_names=("dp", "pp", "tp"))
        pp_rank, pp_size = mesh["pp"].get_local_rank(), mesh["pp"].size()
        self.dp_rank, self.dp_size, self.dp_group = mesh["dp"].get_local_rank(), dp, mesh["dp"].get_group()
        virtual = 2 if self.schedule_name == "interleaved" else 1
        of = pp_size * virtual
        stages = [pp_rank + pp_size * v for v in range(virtual)]  # the interleaved schedule's loop order
        net.keep(stages, of)
        if self.tp > 1:  # each stage's pairs of layers: column- then row-parallel, the activations between sharded
            parallelize_module(net.layers, mesh["tp"], {
                name: ColwiseParallel() if int(name) % 2 == 0 else RowwiseParallel() for name in net.layers})
        chunks = [replicated(Chunk(net, stage, of, detach_input=self.fault == "detached" and stage == of - 1),
                             self.replicas if dp > 1 else "all_reduce", mesh) for stage in stages]
        self.pipeline_stages = [PipelineStage(chunk, stage, of, torch.device("cpu"), group=mesh["pp"].get_group())
                                for chunk, stage in zip(chunks, stages, strict=True)]
        loss_fn = mean_squared_error
        if self.fault == "scaled_twice":
            def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                return mean_squared_error(output, target) / self.microbatches
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}[
            self.schedule_name]
        stage_arg: Any = self.pipeline_stages if virtual > 1 else self.pipeline_stages[0]
        self.schedule = kind(stage_arg, n_microbatches=self.microbatches, loss_fn=loss_fn,
                             scale_grads=self.fault != "not_scaled")
        self.first, self.last = pp_rank == 0, pp_rank == pp_size - 1
        if self.fault == "stage_names":
            return tp.State(model=self.pipeline_stages[0].submod, optimizer=optimizer())
        if self.tied:  # every rank makes every group (the ends of each pipeline), in the same order
            ends = {(d, t): dist.new_group([int(mesh.mesh[d, 0, t]), int(mesh.mesh[d, -1, t])])
                    for d in range(dp) for t in range(self.tp)}
            tied_group = ends[self.dp_rank, mesh["tp"].get_local_rank()]
            assert isinstance(tied_group, dist.ProcessGroup)  # a member of its group
            self.tied_group = tied_group
        return tp.State(model=net, optimizer=optimizer())

    def batches(self, state: tp.State) -> Iterator[Any]:
        generator = torch.Generator().manual_seed(1)
        shard = self.dp_size if self.fault != "global_rank_sampler" else dist.get_world_size()
        index = self.dp_rank if self.fault != "global_rank_sampler" else dist.get_rank()
        for step in range(100):
            ids = torch.arange(step * BATCH, (step + 1) * BATCH)
            x, y = torch.randn(BATCH, WIDTH, generator=generator), torch.randn(BATCH, WIDTH, generator=generator)
            rows = slice(index * BATCH // shard, (index + 1) * BATCH // shard)
            yield ids[rows], x[rows], y[rows]

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> float | None:
        _, x, y = batch
        state.optimizer.zero_grad()
        if self.schedule is None:
            loss = mean_squared_error(state.model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            state.optimizer.step()
            return float(loss.detach())
        losses: list[torch.Tensor] = []
        if self.first:
            self.schedule.step(x, target=y if self.last else None, losses=losses if self.last else None)
        else:
            self.schedule.step(target=y if self.last else None, losses=losses if self.last else None)
        self._synchronize(state.model)
        state.optimizer.step()
        return float(torch.stack(losses).detach().mean()) if losses else None

    def _synchronize(self, net: Net) -> None:
        if self.tied_group is not None and self.fault != "tied_unsynced":
            tied = net.embed if net.embed is not None else net.head
            assert tied is not None and tied.weight.grad is not None
            grad = tied.weight.grad
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.tied_group)
        if self.dp_size > 1 and self.replicas == "all_reduce" and self.fault != "replicas_unsynced":
            for parameter in net.parameters():
                assert parameter.grad is not None
                grad = parameter.grad.to_local() if isinstance(parameter.grad, DTensor) else parameter.grad
                dist.all_reduce(grad, group=self.dp_group)
                if self.fault != "dp_summed":
                    grad /= self.dp_size
