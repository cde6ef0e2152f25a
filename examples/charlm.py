"""A character-level transformer language model, trained the way a small training script trains one.

- the model: token and position embeddings, 4 pre-norm causal self-attention blocks, about 210k
  parameters, `torch.nn` only, with dropout;
- AdamW, linear warmup then cosine decay (`LambdaLR`), gradient clipping, a CPU GradScaler;
- a token-weighted loss over padded sequences: the summed token losses divided by the token count
  of the whole optimizer step's batch (the collate function records it in the batch, like the
  `num_items_in_batch` of Hugging Face's trainer), so accumulation over micro-batches of uneven
  token counts matches one full-batch step; `step` returns `tp.LossAccounting`;
- gradient accumulation (`accumulation_steps`);
- a data stream shuffled per epoch by a generator seeded from the epoch, with a cursor
  (`state_dict`) so that training resumes mid-epoch;
- its own checkpoint code (`save`/`load`), as a project would write it.

`CharLM(fault=...)` is the same recipe with one deliberate bug modelled on a real one (see
`FAULTS`); `tools/validate.py` checks that trainparity catches each with the expected diagnosis.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

import trainparity as tp

CORPUS = """\
The checkpoint was written at step three.
A fresh process read it back and went on.
Nothing in the loss curve showed a seam.
Warmup climbs for four steps, then decays.
The scaler doubles its scale when it can.
Every line is padded to the longest one.
Pads carry no loss and no gradient.
Tokens are weighted, not sequences.
Clip the norm once the window is done.
Shuffle the lines anew in every epoch.
The cursor says where the epoch stopped.
A replayed batch trains twice on it.
A skipped batch is never seen at all.
Dropout draws from the torch generator.
Save the generator with the weights.
The optimizer keeps two moving moments.
Lose them and the first step jumps.
Small models learn short words first.
Then spaces, then the ends of lines.
A cosine falls slowly at the end.
Micro-batches add up to one batch.
Divide by the tokens of the window.
A mean of means weights short lines more.
Zero the gradients after each step.
Unscale before you clip, not after.
Step the scheduler once per update.
The same seed gives the same run.
Two runs that differ cannot be judged.
Resume in the middle of an epoch.
Count what was consumed, not fetched.
A prefetcher runs one batch ahead.
Its cursor is one batch too far.
Every sample once in every epoch.
Order changes from epoch to epoch.
Forty-four lines make up this corpus.
Each line ends where its period is.
Characters are the only tokens here.
Padding is token zero, never a target.
The head predicts the next character.
Attention looks only at the past.
Position embeddings mark the order.
Layer norms come before each block.
Residuals carry the signal through.
The last line closes the little book.
"""
LINES = CORPUS.splitlines()
CHARS = sorted(set("".join(LINES)))
PAD = 0  # token 0 pads; characters are 1..len(CHARS)
IGNORE = -100  # target value that cross_entropy ignores
VOCAB = len(CHARS) + 1
CONTEXT = 64
BATCH_SIZE = 8
WARMUP_STEPS, TOTAL_STEPS = 4, 200
STOI = {c: i + 1 for i, c in enumerate(CHARS)}

#: every deliberate bug, by name (the docstring of each branch says which real bug it models)
FAULTS = (
    # resume
    "optimizer_not_saved", "scheduler_not_saved", "scheduler_rebuilt_after_optimizer_load", "scaler_not_saved",
    "torch_rng_not_saved", "cursor_ignored_on_resume", "cursor_counts_prefetched",
    # accumulation
    "loss_not_scaled", "loss_scaled_twice", "mean_of_means", "premature_step", "extra_step",
    "small_batch_guard", "scheduler_per_microbatch", "clip_before_unscale",
    # coverage
    "same_order_every_epoch", "sampled_with_replacement",
)


def encode(line: str) -> torch.Tensor:
    return torch.tensor([STOI[c] for c in line], dtype=torch.long)


def collate(ids: list[int]) -> dict[str, torch.Tensor]:
    """Pad a batch of lines; inputs are a line without its last character, targets without its first."""
    sequences = [encode(LINES[i]) for i in ids]
    length = max(len(s) for s in sequences) - 1
    inputs = torch.full((len(ids), length), PAD, dtype=torch.long)
    targets = torch.full((len(ids), length), IGNORE, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        inputs[row, : len(sequence) - 1] = sequence[:-1]
        targets[row, : len(sequence) - 1] = sequence[1:]
    return {
        "ids": torch.tensor(ids, dtype=torch.long),
        "inputs": inputs,
        "targets": targets,
        # 0-dim: a batch-level value, handed unchanged to every micro-batch of this batch
        "window_tokens": (targets != IGNORE).sum(),
    }


class CharStream:
    """The lines in a per-epoch shuffled order, batch after batch, with a resumable cursor."""

    def __init__(self, seed: int = 0, batch_size: int = BATCH_SIZE, fault: str | None = None) -> None:
        self.seed, self.batch_size, self.fault = seed, batch_size, fault
        self.epoch = 0
        self.position = 0  # batches of this epoch already produced

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]

    def order(self, epoch: int) -> list[int]:
        if self.fault == "sampled_with_replacement":
            # Bug: indices drawn with replacement (torch.randint), as RandomSampler(replacement=True) does.
            generator = torch.Generator().manual_seed(self.seed + epoch)
            return torch.randint(len(LINES), (len(LINES),), generator=generator).tolist()
        # Bug when faulted: the generator is seeded without the epoch, so every epoch repeats the order.
        seed = self.seed if self.fault == "same_order_every_epoch" else self.seed + epoch
        return torch.randperm(len(LINES), generator=torch.Generator().manual_seed(seed)).tolist()

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = self.order(epoch)
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            batches = self.epoch_batches(self.epoch)
            # Bug when faulted: the cursor is restored but only logged; the epoch restarts from its first batch.
            start = 0 if self.fault == "cursor_ignored_on_resume" else self.position
            for ids in batches[start:]:
                self.position += 1
                yield collate(ids)
            self.epoch, self.position = self.epoch + 1, 0


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        weights = self.attn_dropout(scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1))
        out: torch.Tensor = self.proj((weights @ v).transpose(1, 2).reshape(batch, length, width))
        return out


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads, dropout)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
                                 nn.Dropout(dropout))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.norm1(x), allowed))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class CharTransformer(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, depth: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width, padding_idx=PAD)
        self.position = nn.Embedding(CONTEXT, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        # [batch, 1, query, key]: the past, and never a padding key (position 0 is never padding)
        allowed = causal & (tokens != PAD)[:, None, None, :]
        x = self.dropout(self.embed(tokens) + self.position(torch.arange(length)))
        for block in self.blocks:
            x = block(x, allowed)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


class WarmupCosine:
    """Linear warmup then cosine decay, as a LambdaLR multiplier (a class, so its settings are saved)."""

    def __init__(self, warmup: int = WARMUP_STEPS, total: int = TOTAL_STEPS) -> None:
        self.warmup, self.total = warmup, total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))


class CharLMState(tp.State):
    """The run's State, its entries annotated for type checkers."""

    model: CharTransformer
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    data: CharStream
    global_step: int  # optimizer steps taken
    micro_step: int  # step() calls made


class CharLM(tp.Recipe[CharLMState]):
    def __init__(self, accumulation_steps: int = 1, fault: str | None = None, max_grad_norm: float = 0.5) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.accumulation_steps, self.fault, self.max_grad_norm = accumulation_steps, fault, max_grad_norm

    def setup(self) -> CharLMState:
        model = CharTransformer()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
        return CharLMState(
            model=model,
            optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine()),
            # a small growth interval, so that the scale moves within a short test
            scaler=torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2),
            data=CharStream(fault=self.fault),
            global_step=0,
            micro_step=0,
        )

    def batches(self, state: CharLMState) -> Iterator[dict[str, torch.Tensor]]:
        if self.fault != "cursor_counts_prefetched":
            return iter(state.data)
        return _prefetch_one(iter(state.data))

    def sample_ids(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["ids"]

    def step(self, state: CharLMState, batch: dict[str, torch.Tensor]) -> tp.LossAccounting | torch.Tensor:
        k = self.accumulation_steps
        if self.fault == "small_batch_guard" and len(batch["ids"]) < 4:
            # Bug: a guard written against a ragged last batch also swallows every micro-batch.
            return torch.zeros(())
        state.model.train()
        logits = state.model(batch["inputs"])
        token_loss_sum = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), ignore_index=IGNORE,
                                         reduction="sum")
        tokens = (batch["targets"] != IGNORE).sum()
        window_tokens = batch["window_tokens"]
        if self.fault == "mean_of_means":  # the pre-2024 trainer: each micro-batch's own mean, divided by k
            loss = token_loss_sum / tokens / k
        elif self.fault == "loss_not_scaled":  # each micro-batch's own mean, never divided by k
            loss = token_loss_sum / tokens
        elif self.fault == "loss_scaled_twice":  # normalized by the window's tokens, then by k again
            loss = token_loss_sum / window_tokens / k
        else:
            loss = token_loss_sum / window_tokens
        state.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        if self.fault == "premature_step":  # counted from 0 before incrementing: steps at a window's first call
            boundary = state.micro_step % k == 0
        elif self.fault == "extra_step":  # the counter is never reset and compared with >=
            boundary = state.micro_step + 1 >= k
        else:
            boundary = (state.micro_step + 1) % k == 0
        state.micro_step += 1
        if self.fault == "scheduler_per_microbatch":
            state.scheduler.step()
        if boundary:
            if self.fault != "clip_before_unscale":
                state.scaler.unscale_(state.optimizer)
            torch.nn.utils.clip_grad_norm_(state.model.parameters(), self.max_grad_norm)
            state.scaler.step(state.optimizer)
            state.scaler.update()
            if self.fault != "scheduler_per_microbatch":
                state.scheduler.step()
            state.optimizer.zero_grad(set_to_none=True)
            state.global_step += 1
        return tp.LossAccounting(loss.detach(), numerator=token_loss_sum.detach(), denominator=tokens)

    def save(self, state: CharLMState, path: pathlib.Path) -> None:
        checkpoint = {
            "model": state.model.state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict(),
            "scaler": state.scaler.state_dict(),
            "data": state.data.state_dict(),
            "global_step": state.global_step,
            "micro_step": state.micro_step,
            "torch_rng": torch.get_rng_state(),
        }
        lost = {"optimizer_not_saved": "optimizer", "scheduler_not_saved": "scheduler",
                "scaler_not_saved": "scaler", "torch_rng_not_saved": "torch_rng"}
        if self.fault in lost:
            del checkpoint[lost[self.fault]]
        torch.save(checkpoint, path)

    def load(self, path: pathlib.Path) -> CharLMState:
        state = self.setup()
        checkpoint = torch.load(path, weights_only=True)
        state.model.load_state_dict(checkpoint["model"])
        # Keys are optional so that checkpoints of older versions still load: an omission is silent.
        if "optimizer" in checkpoint:
            state.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.fault == "scheduler_rebuilt_after_optimizer_load":
            # Bug: building LambdaLR steps it once, overwriting the learning rate the optimizer state restored;
            # the scheduler's load_state_dict below restores its counters but not the optimizer's lr.
            state.scheduler = torch.optim.lr_scheduler.LambdaLR(state.optimizer, WarmupCosine())
        if "scheduler" in checkpoint:
            state.scheduler.load_state_dict(checkpoint["scheduler"])
        if "scaler" in checkpoint:
            state.scaler.load_state_dict(checkpoint["scaler"])
        state.data.load_state_dict(checkpoint["data"])
        state.global_step, state.micro_step = checkpoint["global_step"], checkpoint["micro_step"]
        if "torch_rng" in checkpoint:
            torch.set_rng_state(checkpoint["torch_rng"])
        return state


def _prefetch_one(batches: Iterator[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
    """Bug: a prefetcher reads one batch ahead, so the stream's cursor (saved) is one batch past training."""
    ahead = next(batches)
    for batch in batches:
        current, ahead = ahead, batch
        yield current


def coverage_epochs(epochs: int = 3, fault: str | None = None) -> list[dict[int, list[list[int]]]]:
    """The stream's batches of sample IDs, one `{rank: batches}` mapping per epoch (one process: rank 0)."""
    stream = CharStream(fault=fault)
    return [{0: stream.epoch_batches(epoch)} for epoch in range(epochs)]
