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


class PackedAttention(nn.Module):
    """Embeddings by token and position, one causal self-attention layer and a head; the mask lets each position
    attend to the earlier positions of its own document (`block_diagonal`) or to every earlier position."""

    def __init__(self, block_diagonal: bool) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(LENGTH * 4, WIDTH)
        self.qkv, self.out, self.head = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, VOCAB)
        self.block_diagonal = block_diagonal

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(input_ids) + self.positions(position_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        length = input_ids.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool).tril().expand(input_ids.shape[0], length, length)
        if self.block_diagonal:  # documents start where position_ids restart at 0
            document = (position_ids == 0).cumsum(dim=1)
            mask = mask & (document[:, :, None] == document[:, None, :])
        attended = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=mask[:, None])
        out: torch.Tensor = self.head(x + self.out(attended[:, 0]))
        return out


class PackedLM(tp.Recipe):
    """Documents of 2 to 6 tokens, 6 per step: `packed=False` pads each to a row of its own, `packed=True` puts
    them in one row with position_ids restarting per document, as transformers' DataCollatorWithFlattening does.
    The loss is the mean over every predicted token in both layouts."""

    def __init__(self, packed: bool = False, block_diagonal: bool = True) -> None:
        self.packed, self.block_diagonal = packed, block_diagonal

    def setup(self) -> tp.State:
        model = PackedAttention(self.block_diagonal)
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))

    def batches(self, state: tp.State) -> Iterator[dict[str, torch.Tensor]]:
        generator = torch.Generator().manual_seed(3)
        index = 0
        while True:
            lengths = torch.randint(2, 7, (6,), generator=generator).tolist()
            documents = [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]
            ids = torch.arange(index, index + len(documents))
            index += len(documents)
            yield self.pack(documents, ids) if self.packed else self.pad(documents, ids)

    @staticmethod
    def pad(documents: list[torch.Tensor], ids: torch.Tensor) -> dict[str, torch.Tensor]:
        width = max(len(d) for d in documents)
        input_ids = torch.zeros(len(documents), width, dtype=torch.long)
        labels = torch.full((len(documents), width), -100)
        for row, document in enumerate(documents):
            input_ids[row, :len(document)] = document
            labels[row, :len(document) - 1] = document[1:]
        position_ids = torch.arange(width).expand(len(documents), width)
        return {"input_ids": input_ids, "position_ids": position_ids, "labels": labels, "ids": ids}

    @staticmethod
    def pack(documents: list[torch.Tensor], ids: torch.Tensor) -> dict[str, torch.Tensor]:
        labels = [torch.cat([d[1:], torch.tensor([-100])]) for d in documents]  # no label across a document's end
        return {"input_ids": torch.cat(documents)[None], "labels": torch.cat(labels)[None], "ids": ids,
                "position_ids": torch.cat([torch.arange(len(d)) for d in documents])[None]}

    def sample_ids(self, batch: dict[str, torch.Tensor]) -> list[int]:
        ids: list[int] = batch["ids"].tolist()
        return ids

    def step(self, state: tp.State, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = state.model(batch["input_ids"], position_ids=batch["position_ids"])
        labels = batch["labels"]
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum") \
            / labels.ne(-100).sum()
        loss.backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        return loss.detach()
