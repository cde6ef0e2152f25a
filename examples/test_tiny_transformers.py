"""The tiny-transformers helper: every architecture builds from its config alone, offline, seeded, small, and leaves
the caller's RNG streams alone. transformers is a test-only extra: these tests skip without it.

Run: python -m pytest examples/test_tiny_transformers.py
"""

import importlib.util
import socket
import unittest
from typing import Any
from unittest import mock

import torch
from tiny_transformers import ARCHITECTURES, tiny_config, tiny_model

EXTRA = 'transformers is a test-only extra: python -m pip install -e ".[frameworks]" "torch==2.13.0"'


def inputs(architecture: str) -> dict[str, Any]:
    if architecture == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
    return {"input_ids": torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))}


def refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("a tiny model must build without the network")


@unittest.skipIf(importlib.util.find_spec("transformers") is None, EXTRA)
class TestTinyTransformers(unittest.TestCase):
    def test_each_architecture_builds_offline_small_and_seeded(self) -> None:
        for architecture in ARCHITECTURES:
            with self.subTest(architecture=architecture), mock.patch.object(socket.socket, "connect", refuse):
                before = torch.get_rng_state()
                model = tiny_model(architecture, seed=3)
                self.assertTrue(torch.equal(torch.get_rng_state(), before), "the caller's RNG stream moved")
                self.assertTrue(model.training)
                self.assertLess(sum(p.numel() for p in model.parameters()), 100_000)
                same, other = tiny_model(architecture, seed=3), tiny_model(architecture, seed=4)
                for (name, a), b in zip(model.state_dict().items(), same.state_dict().values(), strict=True):
                    self.assertTrue(torch.equal(a, b), name)
                self.assertFalse(all(torch.equal(a, c) for a, c in zip(model.parameters(), other.parameters(),
                                                                       strict=True)))
                model.eval()
                logits = model(**inputs(architecture)).logits
                self.assertTrue(bool(torch.isfinite(logits).all()))

    def test_overrides_and_misuse(self) -> None:
        self.assertEqual(tiny_config("gpt2", n_layer=3).n_layer, 3)
        self.assertEqual(tiny_config("llama").num_key_value_heads, 2)
        with self.assertRaisesRegex(ValueError, "unknown architecture 't5'; one of gpt2, llama, qwen2, bert, vit"):
            tiny_model("t5")


if __name__ == "__main__":
    unittest.main()
