"""Packed sequences, the way instruction-tuning pipelines pack them: short documents concatenated into one row
with `position_ids` that restart at 0 per document (the layout of transformers' `DataCollatorWithFlattening`),
against the same documents padded one per row.

- the data: documents of 3 to 10 tokens from a fixed corpus, 8 per optimizer step, each document's first label
  masked (-100) so that no token is predicted across a document's end;
- the model: token and position embeddings, 2 pre-norm causal self-attention blocks (SDPA), a tied head; the
  attention mask is built from the `position_ids`: causal and block-diagonal, one block per document;
- the loss: the mean over every predicted token of the step, the same in both layouts.

`Packing(packed=True)` trains exactly like `Packing()` (checked in float64 by `test_packing.py`);
`Packing(packed=True, fault="causal_mask_only")` lets each document attend to the documents packed before it
(transformers PR #46634, axolotl PR #3796): the loss still goes down, so nothing else notices.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

import trainparity as tp

VOCAB, WIDTH, HEADS, MAX_POSITION = 40, 32, 4, 16
FAULTS = {"none": "no bug", "causal_mask_only": "a causal mask over the packed row: documents read each other"}


def flatten_collate(documents: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """One row: the documents concatenated, position_ids restarting per document, no label across a boundary."""
    labels = [torch.cat([torch.tensor([-100]), document[1:]]) for document in documents]
    return {"input_ids": torch.cat(documents)[None], "labels": torch.cat(labels)[None],
            "position_ids": torch.cat([torch.arange(len(document)) for document in documents])[None]}


def padded_collate(documents: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """One row per document, padded on the right; padding carries no label."""
    width = max(len(document) for document in documents)
    input_ids = torch.zeros(len(documents), width, dtype=torch.long)
    labels = torch.full((len(documents), width), -100)
    for row, document in enumerate(documents):
        input_ids[row, :len(document)] = document
        labels[row, 1:len(document)] = document[1:]
    return {"input_ids": input_ids, "labels": labels, "position_ids": torch.arange(width).expand(len(documents), -1)}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, HEADS, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyLM(nn.Module):
    def __init__(self, block_diagonal: bool = True) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(VOCAB, WIDTH), nn.Embedding(MAX_POSITION, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.block_diagonal = block_diagonal

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool).tril()[None]
        if self.block_diagonal:
            document = (position_ids == 0).cumsum(dim=1)  # a new document wherever the positions restart
            mask = mask & (document[:, :, None] == document[:, None, :])
        x = self.embed(input_ids) + self.position(position_ids)
        for block in self.blocks:
            x = block(x, mask[:, None])
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


class Packing(tp.Recipe):
    """Eight documents per step, padded (default) or packed into one row."""

    def __init__(self, packed: bool = False, fault: str = "none") -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; choose from {sorted(FAULTS)}")
        self.packed, self.fault = packed, fault

    def setup(self) -> tp.State:
        model = TinyLM(block_diagonal=self.fault != "causal_mask_only")
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3))

    def batches(self, state: tp.State) -> Iterator[dict[str, torch.Tensor]]:
        generator = torch.Generator().manual_seed(0)
        collate = flatten_collate if self.packed else padded_collate
        first = 0
        while True:
            lengths = torch.randint(3, 11, (8,), generator=generator).tolist()
            documents = [torch.randint(1, VOCAB, (n,), generator=generator) for n in lengths]
            yield {**collate(documents), "document_ids": torch.arange(first, first + len(documents))}
            first += len(documents)

    def sample_ids(self, batch: dict[str, torch.Tensor]) -> list[int]:
        ids: list[int] = batch["document_ids"].tolist()
        return ids

    def step(self, state: tp.State, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = state.model(batch["input_ids"], position_ids=batch["position_ids"])
        # the label at position i is the token at i, predicted from the positions before it
        labels = batch["labels"][:, 1:]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100,
                               reduction="sum") / labels.ne(-100).sum()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        return loss.detach()
