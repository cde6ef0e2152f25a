"""A tiny Llama-style GPT trained with FSDP2 x tensor parallelism on a 2-D mesh, the pattern of pytorch/examples'
`fsdp_tp_example.py` made CPU-ready, and checked against one process on 8 to 64 ranks as threads:

    tp.check_parallel(MeshGPT(), world_size=64, backend="threads")

The recipe builds its own mesh from the world it finds, `(world // TP, TP)` named `("dp", "tp")`, and the world of
size 1 (the check's reference) is the mesh `(1, 1)`: the same code trains in both. Within a row of the mesh (`tp`)
each block's attention and feed-forward layers are split by tensor parallelism (`parallelize_module`: the
projections into the heads and the hidden layer by columns, the projections back by rows); across rows (`dp`)
every block and then the root are sharded with `fully_shard`. The ranks of a row read the same shard of the global
batch; the rows split it (`DistributedSampler` over the `dp` dimension).

CPU-ready: the tensor-parallel layers hand on local tensors (`use_local_output`, the default), so attention runs
on each rank's heads as plain tensors and `scaled_dot_product_attention` needs no DTensor sharding rule. The
rotary embedding of the original computes in float32 (`.float()`); here it computes in the model's dtype, so the
check can run the model in float64 (a `.float()` inside a float64 check is an ERROR that names it).

`MeshGPT(sequence_parallel=True)` adds sequence parallelism (torchtitan's plan): the embedding, the norms and the
residual stream between the tensor-parallel layers are split along the sequence over `tp`, gathered before each
attention and feed-forward, reduce-scattered after.

`MeshGPT(fault=...)` carries one deliberate bug (see `FAULTS`); `examples/test_fsdp_tp_gpt.py` checks each.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Partial, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import trainparity as tp

VOCAB, CONTEXT, WIDTH, LAYERS, HEADS = 64, 8, 32, 2, 4
HEAD_WIDTH = WIDTH // HEADS
#: the tensor-parallel degree: heads and the hidden layer are split four ways
TP = 4
SEQUENCES, GLOBAL_BATCH = 64, 16

FAULTS = (
    # the output projection of the attention left as partial sums: its all-reduce over tp is missing
    "attention_output_not_reduced",
    # every rank reads its shard by its global rank: the tensor-parallel peers of a row read different samples
    "sharded_by_global_rank",
)


def _sequences() -> torch.Tensor:
    return torch.randint(VOCAB, (SEQUENCES, CONTEXT + 1), generator=torch.Generator().manual_seed(3))


TOKENS = _sequences()


class Sequences(Dataset[tuple[int, torch.Tensor]]):
    def __len__(self) -> int:
        return SEQUENCES

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        return index, TOKENS[index]


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of `x` (batch, heads, time, head width), in x's own dtype."""
    half = x.shape[-1] // 2
    frequencies = 1.0 / (10000 ** (torch.arange(half, dtype=x.dtype) / half))
    angles = torch.arange(x.shape[-2], dtype=x.dtype)[:, None] * frequencies[None, :]
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        # -1: the heads this rank holds (HEADS / tp under tensor parallelism)
        q, k, v = (w(x).view(batch, time, -1, HEAD_WIDTH).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(batch, time, -1))
        return result


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(WIDTH, 2 * WIDTH, bias=False), nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.w2 = nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(WIDTH), nn.RMSNorm(WIDTH)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(WIDTH)
        self.output = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        logits: torch.Tensor = self.output(self.norm(x))
        return logits


def parallelize(model: GPT, fault: str | None, sequence_parallel: bool) -> tuple[int, int]:
    """Tensor parallel within each row of the mesh (with sequence parallelism: the norms and the residual stream
    split along the sequence between the tensor-parallel layers), FSDP2 across the rows; this rank's data shard and
    their number."""
    world = dist.get_world_size()
    tp_size = min(TP, world)
    mesh = init_device_mesh("cpu", (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    # with sequence parallelism the row-parallel layers reduce-scatter into the sequence's shards
    back: Placement = Shard(1) if sequence_parallel else Replicate()
    wo = RowwiseParallel(output_layouts=Partial() if fault == "attention_output_not_reduced" else back)
    if sequence_parallel:
        parallelize_module(model, mesh["tp"], {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })
    for block in model.layers:
        gathered_input = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        parallelize_module(block, mesh["tp"], {
            **({"attention_norm": SequenceParallel(), "attention": gathered_input, "ffn_norm": SequenceParallel(),
                "feed_forward": gathered_input} if sequence_parallel else {}),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": wo,
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=back),
        })
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    if fault == "sharded_by_global_rank":
        return dist.get_rank(), world
    return mesh["dp"].get_local_rank(), mesh["dp"].size()


class MeshGPT(tp.Recipe):
    def __init__(self, fault: str | None = None, sequence_parallel: bool = False) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault, self.sequence_parallel = fault, sequence_parallel

    def setup(self) -> tp.State:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = GPT()
        shard, shards = parallelize(model, self.fault, self.sequence_parallel)
        sampler: DistributedSampler[int] = DistributedSampler(Sequences(), num_replicas=shards, rank=shard,
                                                              shuffle=True, seed=0)
        loader = DataLoader(Sequences(), batch_size=GLOBAL_BATCH // shards, sampler=sampler)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=False)
        return tp.State(model=model, optimizer=optimizer, loader=loader)

    def batches(self, state: tp.State) -> Iterator[Any]:
        for epoch in itertools.count():
            state.loader.sampler.set_epoch(epoch)
            yield from state.loader

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        tokens = batch[1]
        logits = state.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        return loss.detach()


if __name__ == "__main__":
    import sys

    world = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print(tp.check_parallel(MeshGPT(), world_size=world, backend="threads", steps=3).report())
