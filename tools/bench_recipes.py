"""Recipes for `python tools/bench.py scale`: an MLP of any width and depth, and a GPT-2-shaped language model.

They live in a module of their own (not in bench.py, which runs as `__main__`) so that the checks'
child processes, which take the parent's sys.path, import them by name. Both train in float32 with
AdamW on synthetic data drawn from a generator seeded by the batch's position, which the State
keeps: a resumed run continues the data stream where the checkpoint left it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainparity as tp


def mlp(inputs: int, width: int, hidden: int, outputs: int) -> nn.Sequential:
    """`hidden` layers of `width` units (ReLU) between `inputs` and `outputs`."""
    sizes = [inputs] + [width] * hidden
    layers: list[nn.Module] = []
    for before, after in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(before, after), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, outputs))


def parameter_count(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


class MLP(tp.Recipe):
    """Regression of random targets by an MLP with AdamW; `accumulation_steps` micro-batches per optimizer step."""

    def __init__(self, inputs: int = 1024, width: int = 2048, hidden: int = 4, outputs: int = 1024, batch: int = 64,
                 accumulation_steps: int = 1) -> None:
        self.inputs, self.width, self.hidden, self.outputs = inputs, width, hidden, outputs
        self.batch, self.accumulation_steps = batch, accumulation_steps

    def setup(self) -> tp.State:
        model = mlp(self.inputs, self.width, self.hidden, self.outputs)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return tp.State(model=model, optimizer=optimizer, position=0, micro_step=0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        while True:
            generator = torch.Generator().manual_seed(state.position)
            ids = torch.arange(self.batch) + self.batch * state.position
            state.position += 1
            yield (ids, torch.randn(self.batch, self.inputs, generator=generator),
                   torch.randn(self.batch, self.outputs, generator=generator))

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        loss = nn.functional.mse_loss(state.model(x), y)
        (loss / self.accumulation_steps).backward()  # type: ignore[no-untyped-call]
        state.micro_step += 1
        if state.micro_step % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
        return loss.detach()


class ShardedMLP(MLP):
    """The MLP in DistributedDataParallel, each rank training its contiguous slice of every batch (the whole batch
    in a world of one): the parallel check's tiny model."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.model = DistributedDataParallel(state.model)  # the optimizer holds the same parameters
        return state

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        rank, share = dist.get_rank(), self.batch // dist.get_world_size()
        for ids, x, y in super().batches(state):
            part = slice(rank * share, (rank + 1) * share)
            yield ids[part], x[part], y[part]


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a 4x MLP with GELU."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm_attention = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.attention_out = nn.Linear(width, width)
        self.norm_mlp = nn.LayerNorm(width)
        self.expand = nn.Linear(width, 4 * width)
        self.contract = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (part.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)
                   for part in self.qkv(self.norm_attention(x)).split(width, dim=2))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attention_out(attended.transpose(1, 2).reshape(batch, tokens, width))
        mlp_out: torch.Tensor = self.contract(nn.functional.gelu(self.expand(self.norm_mlp(x))))
        return x + mlp_out


class GPTModel(nn.Module):
    """Token and position embeddings, `layers` blocks, a final LayerNorm, the output tied to the token embedding."""

    def __init__(self, vocabulary: int, tokens: int, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocabulary, width)
        self.position_embedding = nn.Embedding(tokens, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        for name, parameter in self.named_parameters():
            if name.endswith("weight") and parameter.dim() == 2:
                # GPT-2's initialisation: the projections back into the residual stream scaled by depth
                scale = 1 / math.sqrt(2 * layers) if name.endswith(("attention_out.weight", "contract.weight")) else 1
                nn.init.normal_(parameter, std=0.02 * scale)
            elif name.endswith("bias"):
                nn.init.zeros_(parameter)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.norm(x) @ self.token_embedding.weight.T
        return logits


class GPT(tp.Recipe):
    """Next-token prediction on random tokens by a GPT-2-shaped model (124 M parameters by default) with AdamW."""

    def __init__(self, vocabulary: int = 50_304, tokens: int = 64, layers: int = 12, width: int = 768,
                 heads: int = 12, batch: int = 2) -> None:
        self.vocabulary, self.tokens, self.layers, self.width = vocabulary, tokens, layers, width
        self.heads, self.batch = heads, batch

    def setup(self) -> tp.State:
        model = GPTModel(self.vocabulary, self.tokens, self.layers, self.width, self.heads)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        return tp.State(model=model, optimizer=optimizer, position=0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            generator = torch.Generator().manual_seed(state.position)
            ids = torch.arange(self.batch) + self.batch * state.position
            state.position += 1
            yield ids, torch.randint(self.vocabulary, (self.batch, self.tokens + 1), generator=generator)

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, sequence = batch
        logits = state.model(sequence[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, self.vocabulary), sequence[:, 1:].reshape(-1))
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        return loss.detach()


class FineTuneMLP(tp.Recipe):
    """A small MLP classifier fine-tuned: a frozen encoder (Linear, BatchNorm, ReLU) kept in eval mode, a head with
    dropout; AdamW holds every parameter; an evaluation every 2 steps (eval mode, no_grad, train mode after)."""

    def setup(self) -> tp.State:
        encoder = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU()).requires_grad_(False).eval()
        model = nn.Sequential(encoder, nn.Dropout(0.1), nn.Linear(32, 10))
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), position=0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(0)
        while True:
            state.position += 1
            yield torch.randn(16, 16, generator=generator), torch.randint(0, 10, (16,), generator=generator)

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        if state.position % 2 == 0:
            state.model.eval()
            with torch.no_grad():
                state.model(x)
            state.model.train()
            state.model[0].eval()
        return loss.detach()
