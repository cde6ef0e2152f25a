"""The child-to-parent format: round trips exactly, refuses what it cannot carry, runs no code."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from trainparity._process import _wire as wire

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]


def test_round_trip(tmp_path: pathlib.Path) -> None:
    value = {
        "scalars": [None, True, 3, -2.5, float("inf"), "text"],
        "tensors": {
            "f32": torch.randn(3, 4),
            "bf16": torch.randn(5).to(torch.bfloat16),
            "i64": torch.arange(6).reshape(2, 3),
            "bool": torch.tensor([True, False]),
            "scalar": torch.tensor(7.5),
            "empty": torch.zeros(0, 3),
            "strided": torch.arange(10)[::2],
        },
        "array": np.array(["a", "bc"]),
        "numbers": np.arange(4, dtype=np.uint32),
        "numpy_scalar": np.int64(9),
        "int_keys": {1: "one", "two": 2},
        "tuple": (1, 2),
    }
    path = tmp_path / "out.bin"
    wire.dump(value, path)
    back = wire.load(path)
    for name, tensor in value["tensors"].items():  # type: ignore[union-attr]
        assert back["tensors"][name].dtype == tensor.dtype
        assert torch.equal(back["tensors"][name], tensor), name
    assert back["scalars"] == value["scalars"]
    assert back["array"].tolist() == ["a", "bc"] and back["numbers"].dtype == np.uint32
    assert back["numpy_scalar"] == 9 and type(back["numpy_scalar"]) is int
    assert back["int_keys"] == {1: "one", "two": 2}
    assert back["tuple"] == [1, 2]


@pytest.mark.parametrize("value", [object(), {(1, 2): 3}, np.array([object()]), b"bytes"])
def test_refuses_what_it_cannot_carry(value: object, tmp_path: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="between processes"):
        wire.dump(value, tmp_path / "out.bin")

