"""A tiny character-level transformer language model trained in bfloat16 autocast on the CPU, as a training script
trains one.

- the model: token and position embeddings, one pre-norm block (causal self-attention, an MLP), a head;
- the training loop: the forward and the loss under `torch.autocast(device_type, dtype=torch.bfloat16,
  enabled=config.amp)`, AdamW, gradient clipping; bfloat16 needs no GradScaler;
- the recipe declares the dtype it means to train in: `autocast_dtype = torch.bfloat16`, so that
  `tp.check_mixed_precision` fails a run whose matmuls none ran in it.

`AutocastLM(fault=...)` carries one deliberate bug each, modelled on real ones (see `FAULTS`):

- `autocast_on_wrong_device`: `torch.autocast("cuda", dtype=torch.float16)` from a script written for GPUs, run
  on a CPU model: torch turns the region off with a warning, and every op runs in float32;
- `amp_flag_off`: `enabled=` read from a config whose `amp` flag defaults to False;
- `forward_autocast_disabled`: the model's forward runs under `torch.autocast(..., enabled=False)` "for numerical
  stability", which covers every layer;
- `custom_fwd_float32`: every matmul goes through a custom autograd function (a kernel written for float32)
  whose forward is decorated with `torch.amp.custom_fwd(cast_inputs=torch.float32)`;
- `attention_in_float32`: the attention scores computed with autocast off and `.float()` inputs, as some models
  compute rotary embeddings: a deliberate float32 attention, which `allow_float32=("attn",)` allows.

`tools/validate.py` checks that each is caught with the expected diagnosis, and that the clean recipe passes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import trainparity as tp

TEXT = ("Autocast runs the matmuls in bfloat16 and keeps the sums in float32. A region on the wrong device does "
        "nothing and says nothing. Look at the dtypes the ops ran in, not at the code that asked for them. ")
CHARS = sorted(set(TEXT))
CONTEXT, WIDTH, HEADS, BATCH = 16, 32, 2, 8

FAULTS = ("autocast_on_wrong_device", "amp_flag_off", "forward_autocast_disabled", "custom_fwd_float32",
          "attention_in_float32")


@dataclasses.dataclass
class Config:
    """What a project keeps in its config file; `amp` is the flag the autocast region reads."""

    amp: bool = True
    lr: float = 3e-3
    max_grad_norm: float = 1.0


class Float32Matmul(torch.autograd.Function):
    """A matmul written for float32 kernels: its forward casts its inputs to float32 and runs with autocast off."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)  # type: ignore[untyped-decorator]
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")  # type: ignore[untyped-decorator]
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            return torch.autograd.grad(a @ b, (a, b), grad)


def matmul(custom: bool) -> Any:
    """The model's matmul: torch's, or the custom float32 one under the `custom_fwd_float32` fault."""
    return Float32Matmul.apply if custom else torch.matmul


class Projection(nn.Linear):
    def __init__(self, inputs: int, outputs: int, custom: bool) -> None:
        super().__init__(inputs, outputs)
        self.matmul = matmul(custom)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.matmul(x, self.weight.t()) + self.bias
        return out


class Attention(nn.Module):
    def __init__(self, custom: bool, float32_scores: bool) -> None:
        super().__init__()
        self.qkv, self.proj = Projection(WIDTH, 3 * WIDTH, custom), Projection(WIDTH, WIDTH, custom)
        self.matmul, self.float32_scores = matmul(custom), float32_scores

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.reshape(batch, length, HEADS, -1).transpose(1, 2) for t in self.qkv(x).split(WIDTH, dim=-1))
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        if self.float32_scores:  # the bug: "attention is unstable in bfloat16", so compute it in float32
            with torch.autocast(x.device.type, enabled=False):
                scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
                weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
                out = (weights @ v.float()).to(x.dtype)
        else:
            scores = self.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            out = self.matmul(scores.masked_fill(~mask, float("-inf")).softmax(-1), v)
        result: torch.Tensor = self.proj(out.transpose(1, 2).reshape(batch, length, WIDTH))
        return result


class TinyLM(nn.Module):
    def __init__(self, fault: str | None = None) -> None:
        super().__init__()
        custom = fault == "custom_fwd_float32"
        self.fault = fault
        self.tokens, self.positions = nn.Embedding(len(CHARS), WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention(custom, float32_scores=fault == "attention_in_float32")
        self.mlp = nn.Sequential(Projection(WIDTH, 4 * WIDTH, custom), nn.GELU(), Projection(4 * WIDTH, WIDTH, custom))
        self.head = Projection(WIDTH, len(CHARS), custom)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.fault == "forward_autocast_disabled":  # the bug: "keep the model numerically stable"
            with torch.autocast(idx.device.type, enabled=False):
                return self.blocks(idx)
        return self.blocks(idx)

    def blocks(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        h = h + self.attn(self.ln1(h))
        h = h + self.mlp(self.ln2(h))
        logits: torch.Tensor = self.head(self.ln_f(h))
        return logits


def encode(text: str) -> torch.Tensor:
    return torch.tensor([CHARS.index(c) for c in text])


class AutocastLM(tp.Recipe):
    """bfloat16 autocast on the CPU (`device` "cuda" puts the model on a GPU, autocast in float16 there)."""

    autocast_dtype = torch.bfloat16

    def __init__(self, fault: str | None = None, device: str = "cpu") -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault, self.device = fault, device
        self.config = Config(amp=fault != "amp_flag_off")

    def setup(self) -> tp.State:
        model = TinyLM(self.fault).to(self.device)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=self.config.lr), step=0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        data, generator = encode(TEXT), torch.Generator().manual_seed(0)
        while True:
            starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=generator)
            window = torch.stack([data[s : s + CONTEXT + 1] for s in starts.tolist()]).to(self.device)
            yield window[:, :-1], window[:, 1:]

    def autocast(self, idx: torch.Tensor) -> torch.autocast:
        if self.fault == "autocast_on_wrong_device":  # the bug: hard-coded for the GPU the script was written on
            return torch.autocast("cuda", dtype=torch.float16)
        dtype = torch.bfloat16 if idx.device.type == "cpu" else torch.float16
        return torch.autocast(idx.device.type, dtype=dtype, enabled=self.config.amp)

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        idx, targets = batch
        with self.autocast(idx):
            logits = state.model(idx)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        nn.utils.clip_grad_norm_(state.model.parameters(), self.config.max_grad_norm)
        state.optimizer.step()
        state.step += 1
        return loss.detach()
