"""One side of the accumulation check: the recipe set up, then `cycles` windows observed.

The reference (`microbatches=None`) gets one `step()` per full batch, each window started from
gradients set to None (so a missing `zero_grad` in the recipe cannot hide in the reference
too); the candidate gets one `step()` per micro-batch of the same full batches.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from trainparity._accumulation._trace import AccumulationTrace, Window
from trainparity._batches._split import Microbatches, batch_size, leaves, split_batch
from trainparity._compat import state_dict
from trainparity._observe._observer import OBSERVATION_LOCK, Observer
from trainparity._observe._records import CallRecord, StepEvent
from trainparity._observe._watches import BatchDependentModules, DropoutOff, Float64Only
from trainparity._recipe._modules import import_attribute
from trainparity._recipe._recipe import LossAccounting, Recipe, batch_iterator, loss_value, next_batch, require_state
from trainparity._recipe._reference import RecipeRef
from trainparity._state._compare import EXACT, Comparison, Snapshot
from trainparity._state._entries import optimizer_named_state_dict
from trainparity._state._precision import (
    cast_batch,
    convert_state,
    require_float64_loss,
    require_float64_steps,
    running_in,
)
from trainparity._state._rng import seed_everything
from trainparity._state._snapshot import Digesting, Sharing, flatten, snapshot_rng, snapshot_state
from trainparity._state._tensors import readable

SplitFunction = Callable[[Any, Microbatches], Sequence[Any]]


@dataclasses.dataclass(frozen=True)
class AccumulationPayload:
    """One run: the reference (`microbatches=None`) or the candidate."""

    recipe: RecipeRef
    accumulation_steps: int
    microbatches: Microbatches | None
    #: the function itself in-process; "module:qualname" for a child, resolved after its sys.path is set
    split: SplitFunction | str | None
    cycles: int
    seed: int
    disable_dropout: bool
    precision: str
    batch_dependent: str
    #: in this process, the reference's trace that the candidate shares the tensors it agrees with (`Sharing`)
    expected: AccumulationTrace | None = None
    comparison: Comparison = EXACT
    #: the candidate samples each micro-batch's gradient contribution (`CallRecord.contribution`); in this process
    #: it first runs without, and again with them only when the judge needs them (`check_accumulation`)
    sample_contributions: bool = True


class _InputError(Exception):
    """The batch cannot be cut as declared: the check's input is wrong, not the recipe."""


def accumulation_run(payload: AccumulationPayload, workdir: pathlib.Path) -> AccumulationTrace:
    """Task: set the recipe up and observe `cycles` windows; returns the trace in wire form."""
    recipe = payload.recipe.build(accumulation_steps=payload.accumulation_steps)
    # The lock covers seeding and setup() too: two in-process checks in threads share the global RNG
    # streams, torch's default dtype and the patched functions.
    with OBSERVATION_LOCK, running_in(payload.precision):
        seed_everything(payload.seed)
        state = require_state(recipe.setup(), recipe, "setup")
        convert_state(state, payload.precision)

        dropout = DropoutOff(state, type(recipe))
        batch_dependent = BatchDependentModules(state, payload.batch_dependent)
        float64_only = [Float64Only(state)] if payload.precision == "float64" else []
        with Observer(state, type(recipe), [dropout, batch_dependent, *float64_only] if payload.disable_dropout
                      else [batch_dependent, *float64_only],
                      record_contributions=payload.microbatches is not None and payload.sample_contributions,
                      before_step=require_float64_steps if payload.precision == "float64" else None) as observer:
            # Snapshot after dropout was disabled, so both runs are compared as they will train.
            # Compared exactly: large tensors as digests.
            initial, initial_rng = snapshot_state(state, Digesting()), snapshot_rng()
            input_error, windows = None, []
            try:
                windows = _run_windows(recipe, observer, payload)
            except _InputError as error:
                input_error = str(error)
            trace = AccumulationTrace(initial, initial_rng, input_error, windows, list(observer.optimizers),
                                      dropout.record, sorted(batch_dependent.ran), observer.stride,
                                      observer.record_contributions)
    return trace


def _run_windows(recipe: Recipe, observer: Observer, payload: AccumulationPayload) -> list[Window]:
    with batch_iterator(recipe, observer.state) as batches:
        return [_observe_window(recipe, observer, payload, batches, window) for window in range(1, payload.cycles + 1)]


def _observe_window(
    recipe: Recipe, observer: Observer, payload: AccumulationPayload, batches: Iterator[Any], window: int
) -> Window:
    name = type(recipe).__name__
    expected = payload.expected.windows[window - 1] if payload.expected and len(payload.expected.windows) >= window \
        else None
    observer.share_gradient = None if expected is None else functools.partial(_shared_gradient, expected,
                                                                                payload.comparison)
    batch = cast_batch(next_batch(batches, recipe, f"window {window}"), payload.precision)
    record: Snapshot = {}
    for path, leaf in leaves(batch):
        flatten(path, leaf, record)  # a nested tensor's components, a sparse one's values
    if payload.microbatches is None:
        observer.zero_grad()
        parts: Sequence[Any] = [batch]
    else:
        parts = _split(batch, payload)
    calls: list[CallRecord] = []
    for index, part in enumerate(parts):
        observer.begin_call(index, after=calls[-1] if calls else None)
        try:
            returned = recipe.step(observer.state, part)
        finally:
            call = observer.end_call()
        _record_loss(call, returned, f"{name}.step() in window {window}, call {index}", payload.precision)
        calls.append(call)
    steps = observer.take_step_events()
    if expected is not None and _gradients_shared(expected, steps):
        # The judge reads the micro-batches' gradient contributions only to explain a gradient that differs
        # from the reference's: none can here, so they are not held (and paged in) for the rest of the run.
        for call in calls:
            call.contribution = {}
    parameters: Snapshot = {}
    shared = None if expected is None else Sharing(expected.parameters, payload.comparison)
    for parameter_name, parameter in observer.parameters():
        flatten(f"parameters.{parameter_name}", parameter, parameters, sharing=shared)
    optimizers: Snapshot = {}
    shared = None if expected is None else Sharing(expected.optimizers, payload.comparison)
    for entry, optimizer in observer.optimizers.items():
        flatten(entry, optimizer_named_state_dict(optimizer, observer.names), optimizers, sharing=shared)
    schedulers: Snapshot = {}
    for entry, scheduler in observer.schedulers.items():
        flatten(entry, state_dict(scheduler), schedulers)
    return Window(record, _sizes(parts), calls, steps, parameters, optimizers, schedulers)


def _gradients_shared(expected: Window, steps: dict[str, list[StepEvent]]) -> bool:
    """Every step of the window took, for every gradient the reference had, the reference's own tensor (shared
    because it agreed, `_shared_gradient`), and there were as many steps as in the reference."""
    return steps.keys() == expected.steps.keys() and all(
        len(events) == len(expected.steps[entry]) and all(
            event.grads.get(name, ...) is grad
            for reference, event in zip(expected.steps[entry], events, strict=True)
            for name, grad in reference.grads.items())
        for entry, events in steps.items())


def _shared_gradient(expected: Window, comparison: Comparison, entry: str, index: int, name: str,
                     gradient: torch.Tensor) -> torch.Tensor | None:
    """The reference's gradient at the same step of the same optimizer, where the candidate's agrees with it."""
    events = expected.steps.get(entry, [])
    values = readable(gradient)
    if index >= len(events) or not isinstance(values, torch.Tensor):
        return None
    return Sharing({name: events[index].grads.get(name)}, comparison).leaf(name, values)


def _split(batch: Any, payload: AccumulationPayload) -> Sequence[Any]:
    assert payload.microbatches is not None
    k = payload.microbatches if isinstance(payload.microbatches, int) else len(payload.microbatches)
    if payload.split is None:
        try:
            return split_batch(batch, payload.microbatches)
        except ValueError as error:
            raise _InputError(str(error)) from None
    split = payload.split if callable(payload.split) else import_attribute(*payload.split.split(":", 1))
    parts = split(batch, payload.microbatches)
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or len(parts) != k:
        got = f"{len(parts)} parts" if isinstance(parts, Sequence) else type(parts).__name__
        raise _InputError(f"split= must return a sequence of {k} micro-batches, got {got}")
    return parts


def _sizes(parts: Sequence[Any]) -> list[int] | None:
    try:
        return [batch_size(part) for part in parts]
    except ValueError:
        return None


def _record_loss(call: CallRecord, returned: Any, where: str, precision: str) -> None:
    value = returned.value if isinstance(returned, LossAccounting) else returned
    if precision == "float64":
        require_float64_loss(value, where)
    call.loss = loss_value(returned, where)
    if isinstance(returned, LossAccounting):
        call.accounting = True
        call.numerator = loss_value(returned.numerator, f"{where}, LossAccounting.numerator")
        call.denominator = loss_value(returned.denominator, f"{where}, LossAccounting.denominator")
