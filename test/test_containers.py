"""Every container a user keeps state in is kept by tp.save_state/tp.load_state and compared item by item, with
its kind (a deque's maxlen, a defaultdict's factory, a class): a checkpoint that loses one is named at its path."""

from __future__ import annotations

import collections
import pathlib
from typing import Any, NamedTuple

import pytest
from container_recipes import ContainerRecipe, Frozen, Point, Progress, containers, emptied

import trainparity as tp
from trainparity._state._compare import EXACT, compare_snapshots
from trainparity._state._snapshot import snapshot_state

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]


def differing(expected: tp.State, actual: tp.State) -> list[str]:
    return [m.path for m in compare_snapshots(snapshot_state(expected), snapshot_state(actual), EXACT)]


def saved_and_loaded(state: tp.State, fresh: tp.State, tmp_path: pathlib.Path) -> tp.State:
    tp.save_state(state, tmp_path / "checkpoint.pt")
    return tp.load_state(fresh, tmp_path / "checkpoint.pt")


@pytest.mark.parametrize("name", sorted(containers()))
def test_each_container_is_kept_with_its_kind_and_items(name: str, tmp_path: pathlib.Path) -> None:
    value = containers()[name]
    saved = tp.State(x=value, nested={"in": [value]})
    loaded = saved_and_loaded(saved, tp.State(x=emptied(value), nested={"in": [emptied(value)]}), tmp_path)
    assert differing(saved, loaded) == []
    for restored in (loaded.x, loaded.nested["in"][0]):
        assert type(restored) is type(value) and len(restored) == len(value) if hasattr(value, "__len__") else True
        assert type(restored) is type(value) and differing(tp.State(x=value), tp.State(x=restored)) == []
    if isinstance(value, collections.deque):
        assert loaded.x.maxlen == value.maxlen
    if isinstance(value, collections.defaultdict):
        assert loaded.x.default_factory is not None and loaded.x["new"] == value.default_factory()  # type: ignore[misc]


def test_a_container_whose_class_cannot_be_imported_takes_the_fresh_states(tmp_path: pathlib.Path) -> None:
    class Local(NamedTuple):
        a: int

    loaded = saved_and_loaded(tp.State(x=Local(3)), tp.State(x=Local(0)), tmp_path)
    assert type(loaded.x) is Local and loaded.x == Local(3)
    with pytest.raises(ValueError, match=r"cannot rebuild a namedtuple .*Local .*define it at module level"):
        saved_and_loaded(tp.State(x=Local(3)), tp.State(x=None), tmp_path)
    with pytest.raises(ValueError, match=r"cannot rebuild a defaultdict\(.*<lambda>\): its factory cannot be"):
        saved_and_loaded(tp.State(x=collections.defaultdict(lambda: 0)), tp.State(x=None), tmp_path)


@pytest.mark.parametrize(("name", "other", "paths"), [
    ("seen", {1, 2}, ["seen"]),
    ("names", frozenset({"a", "c"}), ["names.'b'", "names.'c'"]),
    ("pairs", {(1, "a")}, ["pairs.(0, 'b')"]),
    ("window", collections.deque([0.5, 0.25]), ["window.<type>"]),
    ("window", [0.5, 0.25], ["window.<type>"]),
    ("tensors", collections.deque([]), ["tensors.0"]),
    ("cache", {"b": 1, "a": emptied({})}, ["cache.<type>", "cache.a"]),
    ("grouped", collections.defaultdict(set, {"x": [1, 2]}), ["grouped.<type>"]),
    ("counts", collections.Counter({"cat": 2, "dog": 2}), ["counts.dog"]),
    ("point", (1, 2.5), ["point.<type>", "point.x", "point.y", "point"]),
    ("point", Point(1, 3.5), ["point.y"]),
    ("frozen", Frozen("a", 0.25), ["frozen.scale"]),
    ("progress", Progress(2, {"shard-2"}), ["progress.shards_done.'shard-1'", "progress.shards_done.'shard-2'"]),
])
def test_a_changed_container_differs_at_its_items_or_its_kind(name: str, other: Any, paths: list[str]) -> None:
    assert differing(tp.State(**{name: containers()[name]}), tp.State(**{name: other})) == paths


def test_set_and_frozenset_items_read_the_same_in_every_process() -> None:
    """A frozenset's repr follows string hashing, which differs between processes: its text is sorted."""
    state = tp.State(x={frozenset({"b", "a", "c"}), ("z", frozenset({"y", "x"}))})
    assert sorted(snapshot_state(state)) == ["x.('z', frozenset({'x', 'y'}))", "x.<type>",
                                             "x.frozenset({'a', 'b', 'c'})"]


def test_a_resume_passes_a_state_of_every_container() -> None:
    result = tp.check_resume(ContainerRecipe, steps=4, resume_at=2, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.parametrize(("lost", "path"), [("window", "window"), ("window_maxlen", "window.<type>"),
                                            ("seen", "seen"), ("progress", "progress.epoch")])
def test_a_checkpoint_that_loses_a_containers_content_is_not_restored_at_it(lost: str, path: str) -> None:
    result = tp.check_resume(ContainerRecipe(lost), steps=4, resume_at=2, isolation="inprocess")
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.cause) == (path, "not_restored"), result.report()
