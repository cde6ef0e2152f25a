"""Traces: what one run of a recipe observed, step by step.

A trace is built in the child (`record_training`) and travels to the parent as a plain
dict of tensors and scalars: per step, the RNG streams at the start of the step, the
batch's sample IDs, the loss, and a snapshot of the State after the step.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from trainparity._compare import EXACT, Comparison, Mismatch, Snapshot, compare_leaves, compare_snapshots
from trainparity._recipe import LossAccounting, Recipe, RecipeRef
from trainparity._snapshot import snapshot_rng, snapshot_state
from trainparity._state import State, seed_everything

SampleIds = list[int | str]


@dataclasses.dataclass(frozen=True)
class StepRecord:
    step: int
    rng: Snapshot
    sample_ids: SampleIds | None
    loss: float | None
    state: Snapshot

    def to_dict(self) -> dict[str, Any]:
        # Shallow on purpose: dataclasses.asdict would deep-copy every tensor.
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**data)


def normalize_sample_ids(ids: Any, where: str) -> SampleIds | None:
    """Sample IDs as a list of ints or strings; anything else is a TypeError naming the place."""
    if ids is None:
        return None
    ids_list: SampleIds = sample_id_array(ids, where).tolist()
    return ids_list


_INT64_MAX = np.iinfo(np.int64).max


def sample_id_array(ids: Any, where: str) -> np.ndarray[Any, Any]:
    """Sample IDs as a flat int64 or str array; anything else is a TypeError naming `where` and the position.

    IDs are ints (Python, numpy, integer tensors) or strings, not both in one batch. Tensors,
    arrays and lists of plain ints or of plain strings are converted without a Python loop.
    """
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"{where}: sample IDs must be integers or strings, got a {ids.dtype} tensor")
        ids = ids.detach().cpu().numpy()
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind in "iu":
            if ids.dtype == np.uint64 and ids.size and int(ids.max()) > _INT64_MAX:
                raise TypeError(f"{where}: sample IDs must fit in int64, got {int(ids.max())}")
            return ids.reshape(-1).astype(np.int64, copy=False)
        if ids.dtype.kind == "U":
            return ids.reshape(-1)
        if ids.dtype.kind != "O":
            raise TypeError(f"{where}: sample IDs must be integers or strings, got an array of {ids.dtype}")
        ids = ids.reshape(-1).tolist()
    if isinstance(ids, Mapping):  # iterating it would take its keys (field names) for IDs
        keys = list(ids)
        example = f"lambda batch: batch[{keys[0]!r}]" if keys else "lambda batch: batch[...]"
        raise TypeError(f"{where}: sample IDs must be a sequence of ints or strings, got a {type(ids).__name__} with "
                        f"keys {keys[:8]}; extract the IDs from the batch with sample_ids, e.g. {example}")
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{where}: sample_ids() must return a sequence of IDs, got {type(ids).__name__}")
    values = ids if isinstance(ids, (list, tuple)) else list(ids)
    kinds = set(map(type, values))
    if kinds <= {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            raise TypeError(f"{where}: sample IDs must fit in int64") from None
    if kinds == {str}:
        return np.array(values, dtype=np.str_)
    return _checked_id_array(values, where)


def _checked_id_array(values: list[Any] | tuple[Any, ...], where: str) -> np.ndarray[Any, Any]:
    """The slow path: numpy integers, 0-d integer tensors, and a precise error for anything else."""
    out: SampleIds = []
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.ndim == 0 and not (
            value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool
        ):
            value = int(value)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, str, np.integer)):
            fields = isinstance(value, (torch.Tensor, np.ndarray, list, tuple, dict))
            raise TypeError(
                f"{where}: sample ID at position {position} is {type(value).__name__} {value!r}; "
                "IDs must be ints or strings"
                + ("; a batch of several fields? extract the IDs with sample_ids, e.g. lambda batch: batch[0]"
                   if fields else "")
            )
        if out and isinstance(value, str) != isinstance(out[0], str):
            raise TypeError(
                f"{where}: sample ID at position {position} is {type(value).__name__} {value!r} but position 0 is "
                f"{type(out[0]).__name__} {out[0]!r}; IDs must be all ints or all strings"
            )
        out.append(value if isinstance(value, str) else int(value))
    return np.array(out, dtype=np.str_ if out and isinstance(out[0], str) else np.int64)


def loss_value(loss: Any, where: str) -> float | None:
    if isinstance(loss, LossAccounting):
        loss = loss.value
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise TypeError(f"{where}: step() must return a scalar loss, got a tensor of shape {list(loss.shape)}")
        return float(loss.detach().reshape(()).item())
    if isinstance(loss, (int, float, np.floating, np.integer)) and not isinstance(loss, bool):
        return float(loss)
    raise TypeError(
        f"{where}: step() must return a loss (tensor or float) or tp.LossAccounting, got {type(loss).__name__}"
    )


def require_state(state: Any, recipe: Recipe, method: str) -> State:
    if not isinstance(state, State):
        raise TypeError(f"{type(recipe).__name__}.{method}() must return a tp.State, got {type(state).__name__}")
    return state


def next_batch(batches: Iterator[Any], recipe: Recipe, at: str) -> Any:
    """The next batch; a recipe whose batches() runs out before the check is done raises, saying where."""
    try:
        return next(batches)
    except StopIteration:
        raise RuntimeError(f"{type(recipe).__name__}.batches() ran out of batches at {at}") from None


def record_steps(recipe: Recipe, state: State, first: int, last: int) -> Iterator[StepRecord]:
    """Train steps `first..last` (1-based, inclusive), yielding a record after each."""
    batches = iter(recipe.batches(state))
    name = type(recipe).__name__
    for step in range(first, last + 1):
        batch = next_batch(batches, recipe, f"step {step}")
        rng = snapshot_rng()
        ids = normalize_sample_ids(recipe.sample_ids(batch), f"{name}.sample_ids() at step {step}")
        loss = loss_value(recipe.step(state, batch), f"{name}.step() at step {step}")
        yield StepRecord(step, rng, ids, loss, snapshot_state(state))


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


def train_run(payload: TrainPayload, workdir: pathlib.Path) -> dict[str, Any]:
    """Child task: train and trace. `loaded`/`saved` are snapshots (with RNG) around load/save."""
    recipe = payload.recipe.build()
    seed_everything(payload.seed)
    loaded = None
    if payload.load:
        state = require_state(recipe.load(pathlib.Path(payload.checkpoint)), recipe, "load")
        loaded = snapshot_state(state, rng=True)
    else:
        state = require_state(recipe.setup(), recipe, "setup")
    steps = [record.to_dict() for record in record_steps(recipe, state, payload.first, payload.last)]
    saved = None
    if payload.save:
        recipe.save(state, pathlib.Path(payload.checkpoint))
        saved = snapshot_state(state, rng=True)
    return {"steps": steps, "loaded": loaded, "saved": saved}


@dataclasses.dataclass(frozen=True)
class StepDifference:
    """One difference between two records of the same step; `aspect` is rng, data, loss or state."""

    aspect: str
    mismatch: Mismatch


def diff_steps(expected: StepRecord, actual: StepRecord, comparison: Comparison) -> Iterator[StepDifference]:
    """Differences of one step in observation order: RNG at the start, sample IDs, loss, state after."""
    for mismatch in compare_snapshots(expected.rng, actual.rng, EXACT):
        yield StepDifference("rng", mismatch)
    if expected.sample_ids is not None and actual.sample_ids is not None and expected.sample_ids != actual.sample_ids:
        yield StepDifference(
            "data", Mismatch("data.sample_ids", "The batch's sample IDs differ.", list(expected.sample_ids),
                             list(actual.sample_ids))
        )
    if expected.loss is not None and actual.loss is not None:
        loss = compare_leaves(expected.loss, actual.loss, comparison)
        if loss is not None:
            yield StepDifference("loss", dataclasses.replace(loss, path="loss"))
    for mismatch in compare_snapshots(expected.state, actual.state, comparison):
        yield StepDifference("state", mismatch)
