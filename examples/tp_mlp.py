"""A regression MLP trained with tensor parallelism (`parallelize_module` on a 1-D `DeviceMesh`), in the
Megatron layout: replicated `embed` and `head` layers around a column-parallel `up` and a row-parallel
`down` projection, whose partial sums `RowwiseParallel` all-reduces.

Every rank of the tensor-parallel group computes one model on the same batch: each draws its batches
from a permutation seeded by the epoch, at the position the step counter says, so a resumed run
continues where the saved one stopped. Checkpoints go through torch.distributed.checkpoint (DCP),
which reshards them on load, so a run resumes on any number of ranks.

`TensorParallelMLP(fault=...)` carries one deliberate bug (see `FAULTS`); `examples/test_tp_mlp.py`
and `tools/validate.py` check that each is caught.
"""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import trainparity as tp

ROWS, FEATURES, TARGETS, BATCH = 32, 6, 2, 8

FAULTS = (
    # `down`'s output declared Partial: the row-parallel sums are never all-reduced
    "missing_reduction",
    # `up`'s input made replicated by hand, without the all-reduce of its gradient in backward
    "missing_grad_reduction",
    # each rank shuffles with a seed of its own, so the group computes on different batches
    "rank_seeded_shuffle",
)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(ROWS, FEATURES, generator=generator), torch.randn(ROWS, TARGETS, generator=generator)


INPUTS, OUTPUTS = _data()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, 8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        self.head = nn.Linear(8, TARGETS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.tanh(self.down(torch.tanh(self.up(torch.tanh(self.embed(x)))))))
        return out


class _ReplicatedWithoutGradReduction(torch.autograd.Function):
    """What ColwiseParallel does to a plain input (a replicated DTensor), minus the all-reduce of its
    gradient in backward: every rank keeps only its shard's contribution."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, mesh: DeviceMesh) -> DTensor:
        return DTensor.from_local(x, mesh, (Replicate(),), run_check=False)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: DTensor) -> tuple[torch.Tensor, None]:
        return grad.to_local(), None


def parallelize(model: MLP, mesh: DeviceMesh, fault: str | None = None) -> None:
    """Shard `up` by columns and `down` by rows on `mesh`, as the fault leaves them."""
    if fault == "missing_grad_reduction":
        # Registered before ColwiseParallel's own pre-hook, which then finds its input already replicated.
        def replicate(module: nn.Module, args: tuple[torch.Tensor]) -> tuple[DTensor]:
            # torch 2.14 types Function.apply; earlier stubs do not
            return (_ReplicatedWithoutGradReduction.apply(args[0], mesh),)  # type: ignore[no-untyped-call,unused-ignore]

        model.up.register_forward_pre_hook(replicate)
    down = RowwiseParallel(output_layouts=Partial()) if fault == "missing_reduction" else RowwiseParallel()
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": down})


class TensorParallelMLP(tp.Recipe):
    def __init__(self, fault: str | None = None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault

    def setup(self) -> tp.State:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = MLP()
        parallelize(model, init_device_mesh("cpu", (dist.get_world_size(),)), self.fault)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), step=0)

    def batches(self, state: tp.State) -> Iterator[Any]:
        per_epoch = ROWS // BATCH
        for epoch in itertools.count(state.step // per_epoch):
            seed = 5 + epoch + (dist.get_rank() * 1000 if self.fault == "rank_seeded_shuffle" else 0)
            order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(seed))
            first = state.step % per_epoch if epoch == state.step // per_epoch else 0
            for batch in range(first, per_epoch):
                ids = order[batch * BATCH:(batch + 1) * BATCH]
                yield ids, INPUTS[ids], OUTPUTS[ids]

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        loss = F.mse_loss(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        state.step += 1
        return loss.detach()

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        model, optimizer = get_state_dict(state.model, state.optimizer)
        dcp_save({"model": model, "optimizer": optimizer, "step": state.step}, checkpoint_id=path)

    def load(self, path: pathlib.Path) -> tp.State:
        state = self.setup()
        model, optimizer = get_state_dict(state.model, state.optimizer)
        checkpoint: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": 0}
        dcp_load(checkpoint, checkpoint_id=path)
        set_state_dict(state.model, state.optimizer, model_state_dict=checkpoint["model"],
                       optim_state_dict=checkpoint["optimizer"])
        state.step = checkpoint["step"]
        return state
