"""The accumulation check's runs: the recipe set up, then `cycles` windows observed.

The reference (`microbatches=None`) gets one `step()` per full batch, each window started from
gradients set to None (so a missing `zero_grad` in the recipe cannot hide in the reference
too); the candidate gets one `step()` per micro-batch of the same full batches.

In a child process a task runs one side (`accumulation_run`). In this process one task runs both in
lockstep (`accumulation_lockstep`), window by window, each with its own global RNG streams and its observer
installed only while it runs: the candidate compares its State after each window with the reference's live
one, so no run keeps a copy of what both agree on, and the check's memory is about the two trainings'.
"""

from __future__ import annotations

import contextlib
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
from trainparity._process._engine import enter_phase
from trainparity._recipe._modules import import_attribute
from trainparity._recipe._recipe import LossAccounting, Recipe, batch_iterator, loss_value, next_batch, require_state
from trainparity._recipe._reference import RecipeRef
from trainparity._state._compare import EXACT, Comparison, Snapshot
from trainparity._state._entries import optimizer_named_state_dict
from trainparity._state._precision import cast_batch, convert_state, require_float64, running_in
from trainparity._state._rng import capture_rng, restore_rng, seed_everything
from trainparity._state._snapshot import Digesting, Sharing, flatten, snapshot_rng, snapshot_state
from trainparity._state._tensors import copied_to_cpu, note, readable

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
    #: in lockstep, what the candidate's tensors agree with the reference's under (`Sharing`)
    comparison: Comparison = EXACT


class _InputError(Exception):
    """The batch cannot be cut as declared: the check's input is wrong, not the recipe."""


class _Run:
    """One side of the check, set up in this process and observed window by window. Its global RNG streams
    are its own (restored before each window, kept after it) and its observer is installed only during its
    windows, so that the other side can run between them."""

    def __init__(self, payload: AccumulationPayload, stack: contextlib.ExitStack) -> None:
        self.payload = payload
        self.recipe = payload.recipe.build(accumulation_steps=payload.accumulation_steps)
        seed_everything(payload.seed)
        state = require_state(self.recipe.setup(), self.recipe, "setup")
        convert_state(state, payload.precision)

        def before_step(entry: str, optimizer: torch.optim.Optimizer) -> None:
            if payload.precision == "float64":
                parameters = [p for group in optimizer.param_groups for p in group["params"]]
                require_float64(iter(parameters), f"a parameter that optimizer '{entry}' steps")

        self.observer = Observer(state, type(self.recipe), disable_dropout=payload.disable_dropout,
                                 record_contributions=payload.microbatches is not None,
                                 batch_dependent=payload.batch_dependent, before_step=before_step)
        with self.observer:
            # Snapshot after dropout was disabled, so both runs are compared as they will train.
            # Compared exactly: large tensors as digests.
            self.initial, self.initial_rng = snapshot_state(state, Digesting()), snapshot_rng()
            self.batches = stack.enter_context(batch_iterator(self.recipe, state))
        self.rng = capture_rng()
        self.windows: list[Window] = []
        self.input_error: str | None = None

    def window(self, expected: Window | None = None, borrow: bool = False) -> bool:
        """Observe the next window (sharing `expected`'s tensors where they agree, or with the State after it
        `borrow`ed: see `_observe_window`); False when its batch could not be cut as declared."""
        if "cuda" not in self.rng and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            # CUDA started since this run's last window, in the other run: this one's streams stand seeded.
            torch.cuda.manual_seed_all(self.payload.seed)
        restore_rng(self.rng)
        try:
            with self.observer:
                self.windows.append(_observe_window(self.recipe, self.observer, self.payload, self.batches,
                                                    len(self.windows) + 1, expected, borrow))
        except _InputError as error:
            self.input_error = str(error)
            return False
        finally:
            self.rng = capture_rng()
        return True

    def trace(self) -> AccumulationTrace:
        observer = self.observer
        return AccumulationTrace(self.initial, self.initial_rng, self.input_error, self.windows,
                                 list(observer.optimizers), observer.dropout, sorted(observer.batch_dependent),
                                 observer.stride)


def accumulation_run(payload: AccumulationPayload, workdir: pathlib.Path) -> dict[str, Any]:
    """Task: one side, set up and observed for `cycles` windows; returns its trace in wire form."""
    # The lock covers seeding and setup() too: two in-process checks in threads share the global RNG
    # streams, torch's default dtype and the patched functions.
    with OBSERVATION_LOCK, running_in(payload.precision), contextlib.ExitStack() as stack:
        run = _Run(payload, stack)
        for _ in range(payload.cycles):
            if not run.window():
                break
        return run.trace().to_wire()


def accumulation_lockstep(payloads: tuple[AccumulationPayload, AccumulationPayload],
                          workdir: pathlib.Path) -> dict[str, Any]:
    """Task in this process: the reference and the candidate, window by window; returns both traces in wire form.

    The candidate is set up after the reference's first window: a State that setup() shares between the
    runs (a module-level model) then differs at the start, as when the candidate ran after the whole reference.
    """
    reference_payload, candidate_payload = payloads
    with OBSERVATION_LOCK, running_in(reference_payload.precision), contextlib.ExitStack() as stack:
        enter_phase("reference")
        reference, candidate = _Run(reference_payload, stack), None
        for _ in range(reference_payload.cycles):
            enter_phase("reference")
            reference.window(borrow=True)  # never False: the reference's full batches are not cut
            enter_phase("candidate")
            candidate = candidate or _Run(candidate_payload, stack)
            cut = candidate.window(reference.windows[-1])
            _settle(reference.windows[-1], candidate.windows[-1] if cut else None)
            if not cut:
                break
        assert candidate is not None
        return {"reference": reference.trace().to_wire(), "candidate": candidate.trace().to_wire()}


def lockstep_traces(output: dict[str, Any]) -> tuple[AccumulationTrace, AccumulationTrace]:
    return AccumulationTrace.from_wire(output["reference"]), AccumulationTrace.from_wire(output["candidate"])


def _settle(reference: Window, candidate: Window | None) -> None:
    """Before the reference trains on: its State after the window was borrowed (its live tensors). Where the
    candidate's agreed with one and holds it, both now hold a note saying so; the others are copied."""
    pairs = [(reference.parameters, candidate.parameters if candidate else {}),
             (reference.optimizers, candidate.optimizers if candidate else {})]
    for borrowed, compared in pairs:
        for path, leaf in borrowed.items():
            if not isinstance(leaf, torch.Tensor):
                continue
            if compared.get(path) is leaf:
                borrowed[path] = compared[path] = note(leaf, "agreed in both runs under the comparison: not kept")
            else:
                borrowed[path] = copied_to_cpu(leaf)


def _observe_window(recipe: Recipe, observer: Observer, payload: AccumulationPayload, batches: Iterator[Any],
                    window: int, expected: Window | None, borrow: bool) -> Window:
    """One window. `expected`: the reference's same window, whose tensors the candidate holds instead of copies
    where its own agree with them. `borrow`: the State after the window is held as the live tensors, not copied
    (`_settle` copies them before they change)."""
    name = type(recipe).__name__
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
    calls = []
    for index, part in enumerate(parts):
        observer.begin_call(index)
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
        flatten(f"parameters.{parameter_name}", parameter, parameters, sharing=shared, borrow=borrow)
    optimizers: Snapshot = {}
    shared = None if expected is None else Sharing(expected.optimizers, payload.comparison)
    for entry, optimizer in observer.optimizers.items():
        flatten(entry, optimizer_named_state_dict(optimizer, observer.names), optimizers, sharing=shared,
                borrow=borrow)
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
    if precision == "float64" and isinstance(value, torch.Tensor):
        require_float64(iter([value]), f"the loss that {where} returned")
    call.loss = loss_value(returned, where)
    if isinstance(returned, LossAccounting):
        call.accounting = True
        call.numerator = loss_value(returned.numerator, f"{where}, LossAccounting.numerator")
        call.denominator = loss_value(returned.denominator, f"{where}, LossAccounting.denominator")
