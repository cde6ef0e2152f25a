"""Tiny, randomly initialised transformers built from a `transformers` config alone: real architectures for tests,
with nothing downloaded.

`tiny_model("gpt2")`, `"llama"`, `"qwen2"` (causal language models), `"bert"` (sequence classification) and `"vit"`
(image classification): 2 layers, width 32, 4 attention heads (2 key-value heads where the architecture has them),
an MLP of 64, a vocabulary of 128 and 64 positions (ViT: 16x16 images of 3 channels in 4x4 patches), 2 labels. The
weights are drawn under `torch.manual_seed(seed)` in a forked RNG, so the same seed builds the same model and the
caller's RNG streams are left as they were. Any config field can be overridden: `tiny_model("gpt2", n_layer=4,
resid_pdrop=0.0)`.

transformers is a test-only extra (`python -m pip install -e ".[frameworks]"`), imported when a model is built:
tests skip with that reason where it is not installed (see examples/test_transformer_training.py).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

#: per architecture: the config class, the auto class that builds the model, and the shrunk sizes
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", "AutoModelForCausalLM", {
        "n_layer": 2, "n_embd": 32, "n_head": 4, "n_inner": 64, "vocab_size": 128, "n_positions": 64,
        "bos_token_id": 127, "eos_token_id": 127}),
    "llama": ("LlamaConfig", "AutoModelForCausalLM", {
        "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64}),
    "qwen2": ("Qwen2Config", "AutoModelForCausalLM", {
        "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64}),
    "bert": ("BertConfig", "AutoModelForSequenceClassification", {
        "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
        "vocab_size": 128, "max_position_embeddings": 64, "num_labels": 2}),
    "vit": ("ViTConfig", "AutoModelForImageClassification", {
        "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
        "image_size": 16, "patch_size": 4, "num_channels": 3, "num_labels": 2}),
}


def tiny_config(architecture: str, **overrides: Any) -> Any:
    """The architecture's `transformers` config, shrunk, with `overrides` applied (a `PretrainedConfig`)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}; one of {', '.join(ARCHITECTURES)}")
    transformers = importlib.import_module("transformers")
    config_class, _, sizes = ARCHITECTURES[architecture]
    return getattr(transformers, config_class)(**{**sizes, **overrides})


def tiny_model(architecture: str, *, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A randomly initialised model of the architecture (in train mode, float32), from its config alone."""
    config = tiny_config(architecture, **overrides)
    auto_class = getattr(importlib.import_module("transformers"), ARCHITECTURES[architecture][1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: torch.nn.Module = auto_class.from_config(config)
    return model
