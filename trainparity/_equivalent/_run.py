"""One side of the equivalence check: a recipe set up from the seed, then `steps` calls of its `step()` observed.

Per call: the batch's sample IDs, the loss, and one snapshot of the State after the call, led by the gradients each
optimizer stepped on (`gradients.<param>`, the vocabulary of `check_runs_equivalent`); the activation-checkpoint
regions the run entered (`CheckpointRegions`) for the judge's diagnoses. Nothing of the recipe is changed: dropout
stays on (both runs draw from the same seed), the mode is the recipe's own.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import torch
from torch import nn

from trainparity._batches._sample_ids import normalize_sample_ids
from trainparity._equivalent._packing import cross_document_reads, documents
from trainparity._observe._checkpoints import CheckpointRegion, CheckpointRegions
from trainparity._observe._hooks import Watch
from trainparity._observe._observer import OBSERVATION_LOCK, Observer
from trainparity._observe._records import StepEvent
from trainparity._observe._watches import Float64Only
from trainparity._recipe._recipe import LossAccounting, batch_iterator, loss_value, next_batch, require_state
from trainparity._recipe._reference import RecipeRef
from trainparity._resume._trace import GRADIENTS, StepRecord
from trainparity._state._compare import Snapshot
from trainparity._state._entries import (
    State,
    is_compiled,
    module_modes,
    state_objects,
    unobserved_entries,
    unwrap_module,
)
from trainparity._state._precision import (
    cast_batch,
    convert_state,
    require_float64_loss,
    require_float64_steps,
    running_in,
)
from trainparity._state._rng import seed_everything
from trainparity._state._snapshot import flatten, snapshot_rng, snapshot_state


@dataclasses.dataclass(frozen=True)
class EquivalentPayload:
    """One run: the reference or the candidate."""

    recipe: RecipeRef
    steps: int
    seed: int
    #: "float64": the run trains in float64 (`trainparity._state._precision`); "native": in the recipe's dtypes
    precision: str


@dataclasses.dataclass(frozen=True)
class SettingChange:
    """A setting of a compiled module that differs, at a call of it in `step`, from what it was at its first call
    (what its compiled code captured): its hooks, its mode, a parameter's requires_grad."""

    step: int
    #: `model.head: forward hooks 0 -> 1`
    what: str


def _ours(hook: object) -> bool:
    """A hook this check installed (a watch's), not the recipe's."""
    function = getattr(hook, "func", hook)  # functools.partial
    return str(getattr(function, "__module__", "")).startswith("trainparity.")


def compiled_settings(state: State) -> dict[str, str]:
    """What compiled code may have captured of the State's compiled modules, by `<path>: <setting>`: each submodule's
    hooks (a forward hook added after the first compiled call is not seen: Dynamo does not guard module hooks by
    default) and mode, each parameter's requires_grad."""
    settings: dict[str, str] = {}
    for entry, module in state_objects(state, nn.Module):
        if not is_compiled(module):
            continue
        model = unwrap_module(module)
        for name, sub in model.named_modules():
            path = f"{entry}.{name}" if name else entry
            for kind, hooks in (("forward hooks", sub._forward_hooks), ("forward pre-hooks", sub._forward_pre_hooks),
                                ("backward hooks", sub._backward_hooks)):
                settings[f"{path}: {kind}"] = str(sum(1 for hook in hooks.values() if not _ours(hook)))
            settings[f"{path}: mode"] = "train" if sub.training else "eval"
        for name, parameter in model.named_parameters():
            settings[f"{entry}.{name}: requires_grad"] = str(parameter.requires_grad)
    return settings


@dataclasses.dataclass(frozen=True)
class CrossDocument:
    """The packing probe of the first call with packed rows (`_packing.cross_document_reads`)."""

    step: int
    #: `row 0: the document at positions 5-8 reads positions 0-4, ...`; empty: every document reads only itself
    reads: list[str]


class ModelCalls(Watch):
    """Watch: each call of the State's models, in the step it happens in: an evaluation (a call without gradients,
    or of a model in eval mode); for a compiled model, its settings held against those of its first call; at the
    first call with packed rows, the probe of what each document reads."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.models = [module for _, module in state_objects(state, nn.Module)]
        self.captured: dict[str, str] | None = None
        self.changes: list[SettingChange] = []
        #: the steps in which a model was called to evaluate
        self.evaluated: list[int] = []
        #: what the probe of the first call with packed rows found (`_packing`)
        self.cross_document: CrossDocument | None = None
        self.probing = False
        self.step = 0

    def _install(self) -> None:
        for model in self.models:
            self._stack.callback(model.register_forward_pre_hook(self._called, with_kwargs=True).remove)

    def begin_call(self, index: int) -> None:
        self.step = index + 1

    def _called(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.probing:  # the probe's own call of the model
            return
        if self.cross_document is None:
            rows = documents(args, kwargs)
            if rows is not None:
                self.probing = True
                try:
                    self.cross_document = CrossDocument(self.step, cross_document_reads(unwrap_module(module), args,
                                                                                        kwargs, rows))
                finally:
                    self.probing = False
        evaluating = not torch.is_grad_enabled() or torch.is_inference_mode_enabled() or not unwrap_module(
            module).training
        if evaluating and self.step not in self.evaluated:
            self.evaluated.append(self.step)
        if not is_compiled(module):
            return
        now = compiled_settings(self.state)
        if self.captured is None:
            self.captured = now
            return
        seen = {change.what for change in self.changes}
        self.changes += [SettingChange(self.step, what) for key, value in now.items()
                         if key in self.captured and self.captured[key] != value
                         for what in [f"{key} {self.captured[key]} -> {value}"] if what not in seen]


@dataclasses.dataclass
class EquivalentTrace:
    """One run of the equivalence check."""

    #: the State right after setup(), every value whole
    initial: Snapshot
    steps: list[StepRecord]
    #: State entries that could not be observed, hence not compared (`unobserved_entries`)
    unobserved: list[str]
    regions: list[CheckpointRegion]
    #: the State's modules that torch.compile wrapped (their paths carry no `_orig_mod.`)
    compiled: list[str]
    #: what changed in a compiled module after its first call, which its compiled code may not see
    compiled_changes: list[SettingChange]
    #: the steps in which a model of the State was called to evaluate (`ModelCalls`)
    evaluated: list[int]
    #: the packing probe, where a model was called with packed rows
    cross_document: CrossDocument | None


def step_gradients(events: dict[str, list[StepEvent]]) -> Snapshot:
    """The gradients each optimizer stepped on in one call, as `gradients.<param>`; an optimizer that stepped again
    in the same call adds `gradients.<param>.<k>` for its k-th step after the first."""
    out: Snapshot = {}
    for entry_events in events.values():
        for index, event in enumerate(entry_events):
            for name, grad in event.grads.items():
                flatten(f"{GRADIENTS}{name}" + (f".{index}" if index else ""), grad, out)
    return out


def equivalent_run(payload: EquivalentPayload, workdir: pathlib.Path) -> EquivalentTrace:
    """Task: set the recipe up and observe `steps` calls of `step()`."""
    recipe = payload.recipe.build()
    name = type(recipe).__name__
    float64 = payload.precision == "float64"
    # The lock covers seeding and setup() too: in-process checks in threads share the global RNG streams, torch's
    # default dtype and the patched functions.
    with OBSERVATION_LOCK, running_in(payload.precision):
        seed_everything(payload.seed)
        state = require_state(recipe.setup(), recipe, "setup")
        convert_state(state, payload.precision)
        compiled = [entry for entry, module in state_objects(state, nn.Module) if is_compiled(module)]
        if compiled:
            # Compiled code is cached per function, not per model, and module hooks are not guarded: a model of the
            # same class compiled earlier in this process would lend this run its graph, hooks and all. Each run
            # compiles afresh, as in a new process.
            torch._dynamo.reset()
        regions, calls = CheckpointRegions(state), ModelCalls(state)
        # A compiled model's ops are traced, not called: the refusal of float32 ops sees only eager code.
        float64_only = [Float64Only(state)] if float64 and not compiled else []
        with Observer(state, type(recipe), [regions, calls, *float64_only],
                      before_step=require_float64_steps if float64 else None, fingerprint_rng=False) as observer:
            initial = snapshot_state(state)
            steps = []
            with batch_iterator(recipe, state) as batches:
                for step in range(1, payload.steps + 1):
                    rng = snapshot_rng()  # before the batch: a batch drawn from another stream follows from it
                    batch = cast_batch(next_batch(batches, recipe, f"step {step}"), payload.precision)
                    ids = normalize_sample_ids(recipe.sample_ids(batch), f"{name}.sample_ids() at step {step}")
                    observer.begin_call(step - 1)
                    try:
                        returned = recipe.step(state, batch)
                    finally:
                        observer.end_call()
                    where = f"{name}.step() at step {step}"
                    if float64:
                        require_float64_loss(returned.value if isinstance(returned, LossAccounting) else returned,
                                             where)
                    loss = loss_value(returned, where)
                    after = step_gradients(observer.take_step_events())
                    after.update(snapshot_state(state))
                    steps.append(StepRecord(step, rng, ids, loss, after, modes=module_modes(state)))
    return EquivalentTrace(initial, steps, unobserved_entries(state), regions.regions, compiled,
                           calls.changes, calls.evaluated, calls.cross_document)
