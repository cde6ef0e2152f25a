"""A small transformer language model with the switches users flip and trust to change nothing: activation
checkpointing (reentrant or not, RNG state preserved or not), torch.compile, a frozen embedding, BatchNorm.
The equivalence check's tests compare its configurations."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

import trainparity as tp

VOCAB, WIDTH, LENGTH, BATCH = 32, 16, 8, 4


class Block(nn.Module):
    def __init__(self, dropout: float, batchnorm: bool) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(WIDTH, 2, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(2 * WIDTH, WIDTH))
        self.batchnorm = nn.BatchNorm1d(WIDTH) if batchnorm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        if self.batchnorm is not None:
            x = self.batchnorm(x.transpose(1, 2)).transpose(1, 2)
        return x


class TinyLM(nn.Module):
    def __init__(self, dropout: float, batchnorm: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block(dropout, batchnorm) for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)
        #: the switch: a public flag, compared as configuration, not state
        self.checkpointing = False
        self.use_reentrant, self.preserve_rng_state = False, True

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.use_reentrant,
                                                      preserve_rng_state=self.preserve_rng_state)
            else:
                x = block(x)
        out: torch.Tensor = self.head(x)
        return out


class CheckpointedLM(tp.Recipe):
    """`checkpointing=True` checkpoints each block, `compile_backend` compiles the model, `evaluate_every` evaluates
    along the way; the other switches plant the known ways each goes wrong (`evaluation_fault`: "rng" draws the
    evaluation batch from the global generator, "mode" never calls model.train() again, "ema" swaps averaged
    weights in and never back)."""

    def __init__(self, checkpointing: bool = False, use_reentrant: bool = False, preserve_rng_state: bool = True,
                 freeze_embedding: bool = False, dropout: float = 0.0, batchnorm: bool = False,
                 compile_backend: str | None = None, scale: float = 1.0, hook_at: int | None = None,
                 evaluate_every: int | None = None, evaluation_fault: str = "none") -> None:
        self.checkpointing, self.use_reentrant, self.preserve_rng_state = checkpointing, use_reentrant, \
            preserve_rng_state
        self.freeze_embedding, self.dropout, self.batchnorm = freeze_embedding, dropout, batchnorm
        self.compile_backend, self.scale, self.hook_at = compile_backend, scale, hook_at
        self.evaluate_every, self.evaluation_fault = evaluate_every, evaluation_fault
        self.calls = 0
        self.averaged: dict[str, torch.Tensor] = {}

    def setup(self) -> tp.State:
        model = TinyLM(self.dropout, self.batchnorm)
        model.checkpointing, model.use_reentrant, model.preserve_rng_state = self.checkpointing, \
            self.use_reentrant, self.preserve_rng_state
        if self.freeze_embedding:
            model.embedding.requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-2)
        compiled = model if self.compile_backend is None else torch.compile(model, backend=self.compile_backend)
        return tp.State(model=compiled, optimizer=optimizer)

    def batches(self, state: tp.State) -> Iterator[torch.Tensor]:
        generator = torch.Generator().manual_seed(1)
        while True:
            yield torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=generator)

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.hook_at:  # a hook that halves the head's output, added after training began
            head = getattr(state.model, "_orig_mod", state.model).head
            head.register_forward_hook(lambda module, args, output: output * 0.5)
        logits = state.model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        (loss * self.scale).backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        if self.evaluate_every is not None and self.calls % self.evaluate_every == 0:
            self.evaluate(state.model)
        return loss.detach()

    def evaluate(self, model: nn.Module) -> float:
        generator = None if self.evaluation_fault == "rng" else torch.Generator().manual_seed(7)
        tokens = torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=generator)
        if self.evaluation_fault == "ema":  # the averaged weights swapped in for evaluation, never swapped back
            self.averaged = self.averaged or {k: v * 0.9 for k, v in model.state_dict().items()}
            model.load_state_dict(self.averaged)
        model.eval()
        with torch.no_grad():
            logits = model(tokens[:, :-1])
        if self.evaluation_fault != "mode":
            model.train()
        return float(F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)))
