"""Traces: what one run of a recipe observed, step by step.

A trace is built in the child (`train_run`) and travels to the parent as a typed record (`RunTrace`, written
and read back by `trainparity._records`): per step, the RNG streams at the start of the step, the batch's
sample IDs, the loss, and a snapshot of the State after the step.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Iterator

from torch.utils.data import DataLoader, Sampler

from trainparity._batches._sample_ids import SampleIds, normalize_sample_ids
from trainparity._process._child import error_record
from trainparity._process._threads import RankFailure, ThreadedWorld
from trainparity._process._world import World, join, leave
from trainparity._recipe._recipe import Recipe, loss_value, next_batch, require_state
from trainparity._recipe._reference import RecipeRef
from trainparity._results._violation import ChildError
from trainparity._state._compare import (
    Comparison,
    Mismatch,
    Snapshot,
    compare_leaves,
    compare_snapshots,
    exact_like,
)
from trainparity._state._entries import State, module_modes, unobserved_entries
from trainparity._state._precision import cast_batch, convert_state, running_in
from trainparity._state._rng import seed_everything
from trainparity._state._snapshot import Digesting, snapshot_rng, snapshot_state

#: the prefix of the gradients at an optimizer step, where a run records them in its State's snapshot
GRADIENTS = "gradients."


@dataclasses.dataclass(frozen=True)
class StepRecord:
    step: int
    rng: Snapshot
    sample_ids: SampleIds | None
    loss: float | None
    state: Snapshot
    #: a script's State at the step's first backward or optimizer step (None for recipes, whose load() hands back
    #: the State before any of the step's code runs): what a resumed script's restored State is held against
    start: Snapshot | None = None
    #: the modes of the State's modules after the step (`module_modes`; a script's: none)
    modes: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Boundary:
    """The State and the RNG streams at a save or a load, kept apart so that no entry name can collide, and the
    modules' modes (not compared there: a loop may set the mode at the start of each step)."""

    state: Snapshot
    rng: Snapshot
    modes: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def capture(cls, state: State, digesting: Digesting | None) -> Boundary:
        return cls(snapshot_state(state, digesting), snapshot_rng(), module_modes(state))


@dataclasses.dataclass(frozen=True)
class RankCopy:
    """A State path (or gradient) whose copy on `rank` differs, after `step` or at the load, from the copy on
    `first`: the lowest of the ranks of a torchrun launch that hold the same paths (replicas of one another)."""

    step: int
    rank: int
    first: int
    mismatch: Mismatch
    #: in the State right after the load of the checkpoint written after `step`, not after the step
    at_load: bool = False


@dataclasses.dataclass(frozen=True)
class RunTrace:
    """One run of the resume check: its steps, and the State right after load() and right after save()."""

    steps: list[StepRecord]
    loaded: Boundary | None
    saved: Boundary | None
    #: State entries that could not be observed, hence not compared (`unobserved_entries`)
    unobserved: list[str]
    #: in a world of ranks, the State entries that are each rank's own by nature: its loaders and samplers
    rank_local: list[str] = dataclasses.field(default_factory=list)
    #: a script's: per State entry (or `data.sample_ids`), which of its framework's checkpoint holders saves it
    holders: dict[str, str] = dataclasses.field(default_factory=dict)
    #: a torchrun-launched script's: where its replicas' copies differ, at the first step where any do
    copies: list[RankCopy] = dataclasses.field(default_factory=list)


def record_steps(recipe: Recipe, state: State, first: int, last: int,
                 digesting: Callable[[int], Digesting | None] = lambda step: None,
                 precision: str = "native", states_at: frozenset[int] | None = None) -> Iterator[StepRecord]:
    """Train steps `first..last` (1-based, inclusive), yielding a record after each; the State is snapshotted
    after the steps in `states_at` (None: after every step), an empty snapshot elsewhere."""
    batches = iter(recipe.batches(state))
    name = type(recipe).__name__
    for step in range(first, last + 1):
        batch = cast_batch(next_batch(batches, recipe, f"step {step}"), precision)
        rng = snapshot_rng(digesting(step))
        ids = normalize_sample_ids(recipe.sample_ids(batch), f"{name}.sample_ids() at step {step}")
        loss = loss_value(recipe.step(state, batch), f"{name}.step() at step {step}")
        snapshot = snapshot_state(state, digesting(step)) if states_at is None or step in states_at else {}
        yield StepRecord(step, rng, ids, loss, snapshot, modes=module_modes(state))


#: paths shipped whole all the same: at a step (by number), or at the load and the save (key 0)
Whole = tuple[tuple[int, frozenset[str]], ...]


@dataclasses.dataclass(frozen=True)
class TrainPayload:
    """One run of a recipe: from scratch or from a checkpoint, optionally saving at the end."""

    recipe: RecipeRef
    seed: int
    #: steps first..last are trained (1-based, inclusive)
    first: int
    last: int
    checkpoint: str
    load: bool = False
    save: bool = False
    #: large tensors are shipped as digests (None: every value whole, as a tolerance needs them)
    digests: bool = False
    whole: Whole = ()
    #: this process's rank in a world of ranks, which it joins before the recipe's first line
    world: World | None = None
    #: "float64": the run trains in float64 (`trainparity._state._precision`); "native": in the recipe's dtypes
    precision: str = "native"
    #: the steps after which the State is snapshotted (None: every step); the RNG streams, sample IDs, loss and
    #: modes are recorded at every step all the same
    states_at: frozenset[int] | None = None

    def digesting(self, step: int) -> Digesting | None:
        """How the snapshot after `step` (0: at the load and the save) is taken."""
        if not self.digests:
            return None
        return Digesting.at(self.whole, step, every_step=True)


def train_run(payload: TrainPayload, workdir: pathlib.Path) -> RunTrace:
    """Child task: train and trace (one process; a rank of a world when the payload names one)."""
    if payload.world is not None:
        join(payload.world)
    recipe = payload.recipe.build()
    with running_in(payload.precision):
        trace, state = _train(payload, recipe)
    if payload.world is not None:
        leave(recipe, state)
    return trace


@dataclasses.dataclass(frozen=True)
class WorldRuns:
    """A run's world of ranks as threads of one process (`backend="threads"`): each rank's trace in rank order, or
    the failure of the first rank that raised (its phase is the run's, which the parent sets)."""

    ranks: list[RunTrace]
    failure: ChildError | None


def train_threads(payload: TrainPayload, workdir: pathlib.Path) -> WorldRuns:
    """Child task: the run's whole world (`payload.world.size` ranks), each rank a thread of this process trained as
    `train_run` trains a process; the process exits after, as a world of processes would."""
    assert payload.world is not None

    def rank(number: int) -> RunTrace:
        threads.join()
        recipe = payload.recipe.build()
        assert payload.world is not None
        trace, state = _train(dataclasses.replace(payload, world=dataclasses.replace(payload.world, rank=number)),
                              recipe)
        leave(recipe, state)
        return trace

    threads = ThreadedWorld(payload.world.size, rank)
    with running_in(payload.precision):  # process-wide: set once for every rank
        try:
            return WorldRuns(threads.run(), None)
        except RankFailure as failure:
            return WorldRuns([], ChildError.raised(error_record(failure.error), "", failure.rank))


def _train(payload: TrainPayload, recipe: Recipe) -> tuple[RunTrace, State]:
    seed_everything(payload.seed)
    loaded = None
    if payload.load:
        state = require_state(recipe.load(pathlib.Path(payload.checkpoint)), recipe, "load")
        convert_state(state, payload.precision)
        loaded = Boundary.capture(state, payload.digesting(0))
    else:
        state = require_state(recipe.setup(), recipe, "setup")
        convert_state(state, payload.precision)
    steps = list(record_steps(recipe, state, payload.first, payload.last, payload.digesting, payload.precision,
                              payload.states_at))
    saved = None
    if payload.save:
        recipe.save(state, pathlib.Path(payload.checkpoint))
        saved = Boundary.capture(state, payload.digesting(0))
    rank_local = [] if payload.world is None else [
        name for name in state if isinstance(state[name], (DataLoader, Sampler))]
    return RunTrace(steps, loaded, saved, unobserved_entries(state), rank_local), state


@dataclasses.dataclass(frozen=True)
class StepDifference:
    """One difference between two records of the same step; `aspect` is rng, data, mode, loss or state."""

    aspect: str
    mismatch: Mismatch


def diff_steps(expected: StepRecord, actual: StepRecord, comparison: Comparison) -> Iterator[StepDifference]:
    """Differences of one step in observation order: RNG at the start, sample IDs, the modules' modes (what the
    step's forward passes ran in, as far as the mode after the step tells), loss, state after."""
    for mismatch in compare_snapshots(expected.rng, actual.rng, exact_like(comparison)):
        yield StepDifference("rng", mismatch)
    if expected.sample_ids is not None and actual.sample_ids is not None and expected.sample_ids != actual.sample_ids:
        yield StepDifference(
            "data", Mismatch("data.sample_ids", "The batch's sample IDs differ.", list(expected.sample_ids),
                             list(actual.sample_ids))
        )
    for path in sorted(expected.modes.keys() & actual.modes.keys()):
        if expected.modes[path] != actual.modes[path]:
            yield StepDifference("mode", Mismatch(path, "Modes are not equal!", expected.modes[path],
                                                  actual.modes[path]))
    if expected.loss is not None and actual.loss is not None:
        loss = compare_leaves(expected.loss, actual.loss, comparison)
        if loss is not None:
            yield StepDifference("loss", dataclasses.replace(loss, path="loss"))
    for mismatch in compare_snapshots(expected.state, actual.state, comparison):
        yield StepDifference("state", mismatch)
