"""Values a State may hold besides tensors: numpy arrays of every dtype (strings, objects, datetimes, records,
float128) and random stream objects (numpy's Generator and RandomState, Python's random.Random). The reference
checkpoint keeps them, in place, and the resume check compares the streams by their exact state."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import state_values_recipes as recipes
import torch

import trainparity as tp
from trainparity._state._compare import EXACT, compare_snapshots
from trainparity._state._snapshot import snapshot_state

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]

ARRAYS = {
    "strings": lambda: np.array([["a", "bc"], ["def", ""]]),
    "bytes": lambda: np.array([b"x", b"yz"]),
    "objects": lambda: np.array([{"a": 1}, None, [2, 3], "s"], dtype=object),
    "datetimes": lambda: np.array(["2026-12-05", "1970-01-01"], dtype="datetime64[D]"),
    "records": lambda: np.array([(1, 2.5), (3, -1.0)], dtype=[("x", "<i4"), ("y", "<f8")]),
    "float128": lambda: np.array([1.0, 1 / 3], dtype=np.longdouble),
    "empty strings": lambda: np.zeros((0, 2), dtype="<U3"),
    "zero-width": lambda: np.array(["", ""], dtype="<U0"),
    "0-dim string": lambda: np.array("scalar"),
    "int32": lambda: np.arange(6, dtype=np.int32).reshape(2, 3),
    "big-endian": lambda: np.arange(4, dtype=">f4"),
    "records with an object": lambda: np.array([(1, "a"), (2, None)], dtype=[("x", "<i4"), ("y", "O")]),
}


def same_array(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tolist() == b.tolist() if a.dtype.hasobject else a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", sorted(ARRAYS))
def test_every_array_survives_the_reference_checkpoint(kind: str, tmp_path: pathlib.Path) -> None:
    saved = tp.State(x=ARRAYS[kind](), nested={"inner": [ARRAYS[kind]()]})
    tp.save_state(saved, tmp_path / "checkpoint.pt")
    loaded = tp.load_state(tp.State(x=None, nested={"inner": [None]}), tmp_path / "checkpoint.pt")
    assert same_array(saved.x, loaded.x), (saved.x, loaded.x)
    assert same_array(saved.nested["inner"][0], loaded.nested["inner"][0])
    assert list(compare_snapshots(snapshot_state(saved), snapshot_state(loaded), EXACT)) == []


def test_arrays_of_objects_side_by_side_keep_their_own_items(tmp_path: pathlib.Path) -> None:
    # Each array's list of items is made while saving and freed after: another must not be taken for it.
    saved = tp.State(meta={"a": np.array(["x", None], dtype=object), "b": np.array([1, None], dtype=object),
                           "c": np.array([2.5, "y", None], dtype=object)})
    tp.save_state(saved, tmp_path / "checkpoint.pt")
    loaded = tp.load_state(tp.State(meta=None), tmp_path / "checkpoint.pt")
    assert {key: array.tolist() for key, array in loaded.meta.items()} == {
        "a": ["x", None], "b": [1, None], "c": [2.5, "y", None]}


def test_a_checkpoint_of_another_format_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    torch.save({"format": "trainparity.save_state/1", "components": {}, "rng": {}}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"old.pt was written by another version of tp.save_state\(\) \(format "
                                         r"'trainparity.save_state/1'; this one reads 'trainparity.save_state/2'\)"):
        tp.load_state(tp.State(x=1), tmp_path / "old.pt")
    torch.save({"something": "else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other.pt was not written by tp.save_state\(\)"):
        tp.load_state(tp.State(x=1), tmp_path / "other.pt")


@pytest.mark.parametrize("stream", sorted(recipes.STREAMS))
def test_a_stream_object_is_restored_in_place_to_draw_what_it_would_have(stream: str, tmp_path: pathlib.Path) -> None:
    build, draw = recipes.STREAMS[stream]
    state = tp.State(rng=build())
    draw(state.rng)
    tp.save_state(state, tmp_path / "checkpoint.pt")
    expected = [draw(state.rng) for _ in range(5)]
    held = state.rng  # a dataset may hold the same object
    tp.load_state(state, tmp_path / "checkpoint.pt")
    assert state.rng is held
    assert [draw(state.rng) for _ in range(5)] == expected


@pytest.mark.parametrize("stream", sorted(recipes.STREAMS))
def test_a_stream_object_compares_by_its_exact_state(stream: str) -> None:
    build, draw = recipes.STREAMS[stream]
    a, b = tp.State(rng=build()), tp.State(rng=build())
    assert list(compare_snapshots(snapshot_state(a), snapshot_state(b), EXACT)) == []
    draw(b.rng)
    assert [m.path for m in compare_snapshots(snapshot_state(a), snapshot_state(b), EXACT)] == ["rng"]


@pytest.mark.parametrize("stream", sorted(recipes.STREAMS))
def test_resume_passes_a_recipe_drawing_from_a_stream_object_in_its_state(stream: str) -> None:
    result = tp.check_resume(recipes.Noisy(stream))
    assert result.passed, result.report()


def test_a_checkpoint_without_the_stream_object_is_not_restored_at_the_stream() -> None:
    result = tp.check_resume(recipes.ForgetsStream("numpy_generator"))
    first = result.violations[0]
    assert (first.kind, first.path, first.step, first.cause) == ("state_mismatch", "rng", 3, "not_restored"), \
        result.report()
    assert "<numpy.random.Generator state " in first.message
