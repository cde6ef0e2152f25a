"""States holding every container a user keeps state in: sets, deques, Counters, OrderedDicts, defaultdicts,
namedtuples and dataclass instances, and a recipe whose checkpoint can lose each one's content."""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from typing import Any, NamedTuple

import torch
from resume_recipes import ResumeRecipe

import trainparity as tp


class Point(NamedTuple):
    x: int
    y: float


@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    scale: float


@dataclasses.dataclass
class Progress:
    epoch: int = 0
    shards_done: set[str] = dataclasses.field(default_factory=set)
    skipped: int = dataclasses.field(default=0, init=False)


def containers() -> dict[str, Any]:
    """One of each container, with content: the values a fresh `setup()` would not have."""
    return {
        "seen": {3, 1, 2},
        "names": frozenset({"b", "a"}),
        "pairs": {(1, "a"), (0, "b")},
        "window": collections.deque([0.5, 0.25], maxlen=3),
        "tensors": collections.deque([torch.ones(2)]),
        "cache": collections.OrderedDict([("b", 1), ("a", torch.zeros(2))]),
        "grouped": collections.defaultdict(list, {"x": [1, 2]}),
        "counted": collections.defaultdict(lambda: 0, {"y": 3}),
        "counts": collections.Counter({"cat": 2, "dog": 1}),
        "point": Point(1, 2.5),
        "frozen": Frozen("a", 0.5),
        "progress": Progress(2, {"shard-1"}),
    }


def emptied(value: Any) -> Any:
    """A container of the same kind without its content (what a checkpoint that lost it gives back)."""
    if isinstance(value, collections.deque):
        return collections.deque(maxlen=value.maxlen)
    if isinstance(value, collections.defaultdict):
        return collections.defaultdict(value.default_factory)
    if isinstance(value, Point):
        return Point(0, 0.0)
    if isinstance(value, Frozen):
        return Frozen("", 0.0)
    if isinstance(value, Progress):
        return Progress()
    return type(value)()


class ContainerRecipe(ResumeRecipe):
    """The resume test recipe beside a State entry per container, each changed by every step; `lost=<name>`
    loads that one emptied (its kind kept), `lost="window_maxlen"` a window without its maxlen."""

    def __init__(self, lost: str | None = None) -> None:
        if lost is not None and lost not in containers() and lost != "window_maxlen":
            raise ValueError(f"unknown container {lost!r}")
        super().__init__()
        self.lost = lost

    def setup(self) -> tp.State:
        state = super().setup()
        for name, value in containers().items():
            setattr(state, name, emptied(value))
        return state

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        loss = super().step(state, batch)
        step = state.global_step
        state.seen.add(step)
        state.names = state.names | {f"n{step}"}
        state.pairs.add((step, "p"))
        state.window.append(float(loss))
        state.tensors.append(torch.full((2,), float(step)))
        state.cache[f"k{step}"] = torch.full((2,), float(step))
        state.cache.move_to_end(f"k{step}")
        state.grouped[f"g{step % 2}"].append(step)
        state.counted[f"c{step % 3}"] += 1
        state.counts.update([f"w{step % 2}"])
        state.point = Point(step, float(loss))
        state.frozen = Frozen(f"f{step}", float(step))
        state.progress.shards_done.add(f"shard-{step}")
        state.progress.epoch = step
        return loss

    def load(self, path: pathlib.Path) -> tp.State:
        state = super().load(path)
        if self.lost == "window_maxlen":
            state.window = collections.deque(state.window)
        elif self.lost is not None:
            setattr(state, self.lost, emptied(getattr(state, self.lost)))
        return state
