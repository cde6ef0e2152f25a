"""Switches a training script flips and trusts to change nothing, on a small GPT-style model: activation
checkpointing the way transformers enables it, torch.compile, and an evaluation with averaged (EMA) weights.

- the model: token and position embeddings, 2 pre-norm causal self-attention blocks with dropout, a tied head;
  parameter-efficient fine-tuning freezes the embeddings, as adapters and LoRA setups do;
- `gradient_checkpointing_enable(use_reentrant=...)` as transformers writes it: each block gets a
  `gradient_checkpointing` flag, and the model binds `functools.partial(checkpoint, use_reentrant=...)` once;
- `compile_backend`: `torch.compile(model, backend=...)` after the optimizer is built (as nanoGPT does); the
  default inductor backend draws its own dropout masks, so it is compared with eager at `dropout=0.0`;
  `probe=True`: a forward hook that clips the activations before the head, registered in `setup()`;
- `evaluate_every`: every k steps, the EMA weights are swapped in, the held-out loss computed under
  `torch.no_grad()` in eval mode, and the training weights swapped back.

`Transformed(fault=...)` carries one deliberate bug each (see FAULTS); `test_transformations.py` checks that
each switch changes nothing and that each fault is caught with its cause.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

import trainparity as tp

VOCAB, WIDTH, HEADS, LENGTH, BATCH = 48, 32, 4, 12, 8

FAULTS = {
    "none": "no bug",
    # transformers #21381 / peft #1142: the embeddings are frozen, so a reentrant checkpoint's input needs no
    # gradient and the blocks inside get none at all (transformers now calls enable_input_require_grads())
    "reentrant_frozen_inputs": "a reentrant checkpoint over frozen embeddings",
    # pytorch #117265: a hook added after the first compiled call is never run by the compiled code
    "hook_after_compile": "a forward hook registered after the model was first called compiled",
    # diffusers #7549: the EMA weights are swapped in for evaluation and never swapped back
    "ema_not_restored": "evaluation leaves the EMA weights in the model",
}


class Block(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(WIDTH, HEADS, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH),
                                 nn.Dropout(dropout))
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(LENGTH, WIDTH)
        self.blocks = nn.ModuleList(Block(dropout) for _ in range(2))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def gradient_checkpointing_enable(self, use_reentrant: bool = False) -> None:
        """As transformers does: the checkpoint function bound once, a flag per block."""
        self._gradient_checkpointing_func = functools.partial(torch.utils.checkpoint.checkpoint,
                                                              use_reentrant=use_reentrant)
        for block in self.blocks:
            block.gradient_checkpointing = True  # type: ignore[assignment]  # an nn.Module attribute, not a tensor

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        x = self.wte(tokens) + self.wpe(torch.arange(length))
        for block in self.blocks:
            if block.gradient_checkpointing and self.training:
                x = self._gradient_checkpointing_func(block, x, mask)
            else:
                x = block(x, mask)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


class Transformed(tp.Recipe):
    """Fine-tuning the blocks of a GPT with frozen embeddings, with the switches off by default."""

    def __init__(self, checkpointing: bool = False, compile_backend: str | None = None, probe: bool = False,
                 evaluate_every: int | None = None, dropout: float = 0.1, fault: str = "none") -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; choose from {sorted(FAULTS)}")
        self.checkpointing, self.compile_backend, self.probe = checkpointing, compile_backend, probe
        self.evaluate_every, self.dropout, self.fault = evaluate_every, dropout, fault
        self.calls = 0

    def setup(self) -> tp.State:
        model = GPT(self.dropout)
        for embedding in (model.wte, model.wpe):  # the head is tied to wte: frozen with it
            embedding.requires_grad_(False)
        if self.checkpointing:
            model.gradient_checkpointing_enable(use_reentrant=self.fault == "reentrant_frozen_inputs")
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
        ema = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        if self.probe and self.fault != "hook_after_compile":
            self.add_probe(model)
        if self.compile_backend is not None:
            model = torch.compile(model, backend=self.compile_backend)  # type: ignore[assignment]
        return tp.State(model=model, optimizer=optimizer, ema=ema)

    def batches(self, state: tp.State) -> Iterator[torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=generator)

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        model = state.model
        if self.probe and self.fault == "hook_after_compile" and self.calls == 2:
            self.add_probe(model)  # after the first (compiled) call: the compiled model never runs it
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, parameter in self.trained(model):
                state.ema[name].lerp_(parameter, 0.1)
        if self.evaluate_every is not None and self.calls % self.evaluate_every == 0:
            self.evaluate(state)
        return loss.detach()

    @staticmethod
    def trained(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        inner = getattr(model, "_orig_mod", model)
        return [(name, p) for name, p in inner.named_parameters() if p.requires_grad]

    @staticmethod
    def add_probe(model: nn.Module) -> None:
        """Clip the activations before the head. Registered before the model's first compiled call, the hook is
        compiled in; registered later (the fault), the compiled model never runs it."""
        inner = getattr(model, "_orig_mod", model)
        assert isinstance(inner, GPT)
        inner.ln_f.register_forward_hook(lambda module, args, output: output.clamp(-1.5, 1.5))

    def evaluate(self, state: tp.State) -> float:
        """The held-out loss with the EMA weights, which are swapped in and (without the fault) back out."""
        model = state.model
        trained = dict(self.trained(model))
        saved = {name: p.detach().clone() for name, p in trained.items()}
        generator = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, VOCAB, (BATCH, LENGTH + 1), generator=generator)
        with torch.no_grad():
            for name, parameter in trained.items():
                parameter.copy_(state.ema[name])
            model.eval()
            loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            model.train()
            if self.fault != "ema_not_restored":
                for name, parameter in trained.items():
                    parameter.copy_(saved[name])
        return float(loss)
