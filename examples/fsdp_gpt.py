"""A tiny GPT trained with FSDP2 and checkpointed with torch.distributed.checkpoint (DCP), resumable on
another number of ranks (the optional extra `trainparity[torchdata]` for its `StatefulDataLoader`).

Each rank joins the process group the check (or torchrun) sets up, shards every block and then the
root with `fully_shard`, as torchtitan does, and reads its shard of the global batch through a
`StatefulDataLoader` over a `DistributedSampler`. Dropout draws from each rank's own RNG, seeded by
rank. The checkpoint is a DCP directory (model and optimizer through `get_state_dict`, resharded on
load to any number of ranks, the scheduler and the step) plus one file per rank for what is the
rank's own: its RNG state and its loader's position.

The global batch is fixed (`GLOBAL_BATCH`), so on any number of ranks step k reads the same samples
(positions k*B..(k+1)*B of the sampler's permutation). A loader's position counts its own rank's
samples, which another number of ranks splits otherwise: on a world-size change the clean resume
skips the steps already trained on a fresh loader instead of loading a position.

Dropout draws from each rank's RNG, so on another number of ranks each sample gets another mask: a
resume on another number of ranks reproduces training only without dropout (`TinyGPT(dropout=0.0)`).

`TinyGPT(fault=...)` carries one deliberate bug (see `FAULTS`); `examples/test_fsdp_gpt.py` checks
that each is caught, the first two by `tp.check_resume`, the last by `tp.check_parallel`.
"""

from __future__ import annotations

import itertools
import pathlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import Dataset, DistributedSampler

import trainparity as tp

try:
    from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped,import-not-found,unused-ignore]
except ImportError:  # the optional extra is not installed
    StatefulDataLoader = None
    TORCHDATA_MISSING: str | None = (
        'torchdata is not installed: pip install "trainparity[torchdata]" to run the FSDP2 example'
    )
else:
    TORCHDATA_MISSING = None
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

VOCAB, CONTEXT, WIDTH, LAYERS = 32, 8, 16, 2
SEQUENCES = 64
GLOBAL_BATCH = 8
WARMUP = 4

FAULTS = (
    # each rank's RNG state put in the DCP state dict under one key: DCP keeps one copy for all ranks
    "rng_in_dcp",
    # the loader position of rank 0 loaded by every rank, whatever the number of ranks
    "rank0_loader_position",
    # the root left outside fully_shard: embeddings, final norm and head keep per-rank gradients
    "root_not_sharded",
)


def _sequences() -> torch.Tensor:
    return torch.randint(VOCAB, (SEQUENCES, CONTEXT + 1), generator=torch.Generator().manual_seed(7))


TOKENS = _sequences()


class Sequences(Dataset[tuple[int, torch.Tensor]]):
    def __len__(self) -> int:
        return SEQUENCES

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        return index, TOKENS[index]


class Block(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(WIDTH, num_heads=2, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class GPT(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block(dropout) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def make_loader(world: int, rank: int) -> Any:
    if StatefulDataLoader is None:
        raise RuntimeError(TORCHDATA_MISSING)
    sampler: DistributedSampler[int] = DistributedSampler(Sequences(), num_replicas=world, rank=rank, shuffle=True,
                                                          seed=0)
    # Its own generator: without one, each new iterator draws its base seed from the global RNG.
    return StatefulDataLoader(Sequences(), batch_size=GLOBAL_BATCH // world, sampler=sampler,
                              generator=torch.Generator().manual_seed(0))


class TinyGPT(tp.Recipe):
    def __init__(self, dropout: float = 0.1, fault: str | None = None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.dropout, self.fault = dropout, fault

    def setup(self) -> tp.State:
        world, rank = dist.get_world_size(), dist.get_rank()
        torch.manual_seed(0)  # the same initial weights on every rank
        model = GPT(self.dropout)
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        if self.fault != "root_not_sharded":
            fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
        torch.manual_seed(1000 + rank)  # dropout masks differ by rank
        return tp.State(model=model, optimizer=optimizer, scheduler=scheduler, loader=make_loader(world, rank),
                        step=0)

    def batches(self, state: tp.State) -> Iterator[Any]:
        for epoch in itertools.count(state.step // len(state.loader)):
            state.loader.sampler.set_epoch(epoch)
            yield from state.loader

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        tokens = batch[1]
        logits = state.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        state.scheduler.step()
        state.step += 1
        return loss.detach()

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        model, optimizer = get_state_dict(state.model, state.optimizer)
        shared: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": state.scheduler.state_dict(),
                                  "step": state.step, "world": dist.get_world_size()}
        if self.fault == "rng_in_dcp":
            shared["rng"] = torch.get_rng_state()
        dcp_save(shared, checkpoint_id=path / "shared")
        rank = dist.get_rank()
        own = {"loader": state.loader.state_dict()}
        if self.fault != "rng_in_dcp":
            own["rng"] = torch.get_rng_state()
        torch.save(own, path / f"rank{rank}.pt")

    def load(self, path: pathlib.Path) -> tp.State:
        state = self.setup()
        model, optimizer = get_state_dict(state.model, state.optimizer)
        shared: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": state.scheduler.state_dict(),
                                  "step": 0, "world": 0}
        if self.fault == "rng_in_dcp":
            shared["rng"] = torch.get_rng_state()
        dcp_load(shared, checkpoint_id=path / "shared")
        set_state_dict(state.model, state.optimizer, model_state_dict=shared["model"],
                       optim_state_dict=shared["optimizer"])
        state.scheduler.load_state_dict(shared["scheduler"])
        state.step = shared["step"]
        rank, world = dist.get_rank(), dist.get_world_size()
        own_file = path / f"rank{rank}.pt"
        if own_file.exists():  # a rank the saving world did not have starts its RNG from its seed
            own = torch.load(own_file, weights_only=True)
            if "rng" in own:
                torch.set_rng_state(own["rng"])
        if self.fault == "rank0_loader_position":
            state.loader.load_state_dict(torch.load(path / "rank0.pt", weights_only=True)["loader"])
        elif shared["world"] == world:
            state.loader.load_state_dict(torch.load(own_file, weights_only=True)["loader"])
        else:  # each rank's batches follow the global step: skip as many as were trained this epoch
            state.loader.sampler.set_epoch(state.step // len(state.loader))
            batches = iter(state.loader)
            for _ in range(state.step % len(state.loader)):
                next(batches)
            state.loader.load_state_dict(state.loader.state_dict())
            del batches
        if self.fault == "rng_in_dcp":
            torch.set_rng_state(shared["rng"])
        return state
