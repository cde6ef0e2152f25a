"""Real architectures under the training checks: a tiny language model (Llama, or GPT-2, Qwen2) and a tiny BERT
classifier, randomly initialised from their configs by `tiny_transformers` (nothing downloaded).

- `CausalLM(architecture="llama")`: next-token prediction on a synthetic language (each sequence counts up from a
  random start by a random stride, modulo the vocabulary), AdamW with weight decay on matrices only, transformers'
  cosine schedule with warmup (`get_cosine_schedule_with_warmup`), `clip_grad_norm_`;
- `TextClassifier(architecture="bert")`: a bag-of-words sentiment (three words in four from the label's half of the
  vocabulary), AdamW and transformers' linear schedule with warmup.

`lm_learning_rate` and `classifier_learning_rate` state the schedules the loops follow, for `lr_schedule=`; the
checks run in examples/test_transformer_training.py. transformers is a test-only extra.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from tiny_transformers import tiny_model
from torch import nn

import trainparity as tp

VOCABULARY, LENGTH, BATCH_SIZE = 128, 16, 8
LM_LR, LM_WARMUP, LM_TOTAL = 1e-2, 4, 200
CLASSIFIER_LR, CLASSIFIER_WARMUP, CLASSIFIER_TOTAL = 5e-3, 4, 200


def lm_learning_rate(index: int) -> float:
    """transformers' cosine schedule with warmup, as the language model's optimizer step `index` (from 0) gets it."""
    if index < LM_WARMUP:
        return LM_LR * index / LM_WARMUP
    progress = (index - LM_WARMUP) / (LM_TOTAL - LM_WARMUP)
    return LM_LR * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def classifier_learning_rate(index: int) -> float:
    """transformers' linear schedule with warmup, as the classifier's optimizer step `index` (from 0) gets it."""
    if index < CLASSIFIER_WARMUP:
        return CLASSIFIER_LR * index / CLASSIFIER_WARMUP
    return CLASSIFIER_LR * max(0.0, (CLASSIFIER_TOTAL - index) / (CLASSIFIER_TOTAL - CLASSIFIER_WARMUP))


def counting_sequences(position: int) -> torch.Tensor:
    """A batch of the synthetic language: start + stride * t, modulo the vocabulary."""
    generator = torch.Generator().manual_seed(position)
    starts = torch.randint(0, VOCABULARY, (BATCH_SIZE, 1), generator=generator)
    strides = torch.randint(1, 4, (BATCH_SIZE, 1), generator=generator)
    return (starts + strides * torch.arange(LENGTH)) % VOCABULARY


def sentiments(position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of sentences and their labels: three words in four from the label's half of the vocabulary."""
    generator = torch.Generator().manual_seed(position)
    labels = torch.randint(0, 2, (BATCH_SIZE,), generator=generator)
    half = VOCABULARY // 2
    words = torch.randint(0, half, (BATCH_SIZE, LENGTH), generator=generator)
    own = torch.rand(BATCH_SIZE, LENGTH, generator=generator) < 0.75
    return words + half * torch.where(own, labels[:, None], 1 - labels[:, None]), labels


def adamw(model: nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices, none on biases and norms (as transformers' Trainer groups them)."""
    return torch.optim.AdamW([
        {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.01},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}], lr=lr)


class CausalLM(tp.Recipe):
    def __init__(self, architecture: str = "llama") -> None:
        self.architecture = architecture

    def setup(self) -> tp.State:
        from transformers import get_cosine_schedule_with_warmup  # type: ignore[import-not-found,unused-ignore]

        model = tiny_model(self.architecture, seed=0)
        optimizer = adamw(model, LM_LR)
        scheduler = get_cosine_schedule_with_warmup(optimizer, LM_WARMUP, LM_TOTAL)
        return tp.State(model=model, optimizer=optimizer, scheduler=scheduler, position=0)

    def batches(self, state: tp.State) -> Iterator[torch.Tensor]:
        while True:
            state.position += 1
            yield counting_sequences(state.position - 1)

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = state.model(input_ids=batch, labels=batch).loss  # transformers shifts the labels
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=1.0)
        state.optimizer.step()
        state.scheduler.step()
        return loss.detach()


class TextClassifier(tp.Recipe):
    def __init__(self, architecture: str = "bert") -> None:
        self.architecture = architecture

    def setup(self) -> tp.State:
        from transformers import get_linear_schedule_with_warmup  # type: ignore[import-not-found,unused-ignore]

        model = tiny_model(self.architecture, seed=0, hidden_dropout_prob=0.0)
        optimizer = adamw(model, CLASSIFIER_LR)
        scheduler = get_linear_schedule_with_warmup(  # type: ignore[no-untyped-call,unused-ignore]
            optimizer, CLASSIFIER_WARMUP, CLASSIFIER_TOTAL)
        return tp.State(model=model, optimizer=optimizer, scheduler=scheduler, position=0)

    def batches(self, state: tp.State) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            state.position += 1
            yield sentiments(state.position - 1)

    def step(self, state: tp.State, batch: tuple[torch.Tensor, torch.Tensor]) -> Any:
        tokens, labels = batch
        loss: torch.Tensor = state.model(input_ids=tokens, labels=labels).loss
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        state.optimizer.step()
        state.scheduler.step()
        return loss.detach()
