"""The child-to-parent format: round trips exactly, refuses what it cannot carry, runs no code; records (dataclasses)
come back as themselves, or as an error that names the field."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import pytest
import torch

from trainparity._process import _wire as wire
from trainparity._records import RecordError, read
from trainparity._results._violation import json_safe

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



# -- records: dataclasses written field by field, read back by their annotations ------------------------


@dataclasses.dataclass(frozen=True)
class _Inner:
    name: str
    shape: tuple[int, ...]
    scale: float | None = None


@dataclasses.dataclass(frozen=True)
class _Other:
    name: str
    step: int


@dataclasses.dataclass
class _Outer:
    step: int
    loss: float
    inner: list[_Inner]
    by_name: dict[str, _Inner | torch.Tensor | int | None]
    events: list[_Inner | _Other]
    kind: Literal["a", "b"]
    seen: frozenset[str] = frozenset()
    note: str | None = None


def _outer() -> _Outer:
    return _Outer(3, 0.5, [_Inner("x", (2, 3), 0.25)], {"t": torch.arange(4), "i": _Inner("y", ()), "n": None, "k": 7},
                  [_Other("o", 1), _Inner("z", (1,))], "b", frozenset({"p", "q"}))


def test_a_record_round_trips_through_the_wire_as_itself(tmp_path: pathlib.Path) -> None:
    outer = _outer()
    wire.dump(outer, tmp_path / "out.bin")
    back = read(_Outer, wire.load(tmp_path / "out.bin"), "output")
    assert isinstance(back.by_name["t"], torch.Tensor) and torch.equal(back.by_name["t"], torch.arange(4))
    back.by_name["t"] = outer.by_name["t"]  # tensors compare by identity in ==
    assert back == outer
    assert type(back.inner[0].shape) is tuple and type(back.events[0]) is _Other and type(back.seen) is frozenset


def test_a_record_round_trips_through_json_with_non_finite_floats() -> None:
    step = _Inner("x", (1,), float("inf"))
    text = json.dumps(json_safe(step))
    assert json.loads(text) == {"name": "x", "shape": [1], "scale": "inf"}
    assert read(_Inner, json.loads(text), "step", json=True) == step
    with pytest.raises(RecordError, match=r"^step \(_Inner\): scale must be float \| None, got 'inf'$"):
        read(_Inner, json.loads(text), "step")  # the wire carries floats as floats: a string is no float there


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("loss"), r"^output \(_Outer\) lacks 'loss'$"),
    (lambda d: d.update(colour=1), r"^output \(_Outer\) has unknown fields 'colour'$"),
    (lambda d: d.update(step="3"), r"^output \(_Outer\): step must be int, got '3'$"),
    (lambda d: d.update(step=True), r"^output \(_Outer\): step must be int, got True$"),
    (lambda d: d.update(kind="c"), r"^output \(_Outer\): kind must be Literal\['a', 'b'\], got 'c'$"),
    (lambda d: d["inner"][0].update(shape=[2, "3"]),
     r"^output \(_Outer\): inner\[0\] \(_Inner\): shape\[1\] must be int"),
    (lambda d: d["inner"].append(5), r"^output \(_Outer\): inner\[1\]: expected a JSON object, got int$"),
    (lambda d: d["by_name"].update(s="text"),
     r"^output \(_Outer\): by_name\['s'\] must be _Inner \| Tensor \| int \| None, got 'text'$"),
    (lambda d: d["events"].append({"name": "n"}),
     r"^output \(_Outer\): events\[2\] must be _Inner \| _Other, got \{'name': 'n'\}$"),
])
def test_a_record_that_was_not_written_as_one_is_refused_naming_the_field(
        edit: Callable[[dict[str, Any]], object], message: str, tmp_path: pathlib.Path) -> None:
    wire.dump(_outer(), tmp_path / "out.bin")
    data = wire.load(tmp_path / "out.bin")
    edit(data)
    with pytest.raises(RecordError, match=message):
        read(_Outer, data, "output")


def not_a_record(payload: object, workdir: pathlib.Path) -> object:
    """A task whose output is not the record its job names."""
    return _Other("o", 1)


def test_a_task_that_returns_another_type_than_its_record_is_a_corrupt_outcome() -> None:
    from trainparity._process._engine import Job, run_jobs
    from trainparity._process._options import Deadline

    job = Job("test_wire:not_a_record", None, "baseline", record=_Outer, workdir=False)
    for isolation in ("inprocess", "process"):
        outcome = run_jobs([job], deadline=Deadline.after(60), isolation=isolation)[0]
        assert outcome.output is None and outcome.error is not None and outcome.error.kind == "corrupt", isolation
        assert "baseline: its output could not be read" in outcome.error.headline()
