"""One side of the equivalence check: a recipe set up from the seed, then `steps` calls of its `step()` observed.

Per call: the batch's sample IDs, the loss, and one snapshot of the State after the call, led by the gradients each
optimizer stepped on (`gradients.<param>`, the vocabulary of `check_runs_equivalent`); the activation-checkpoint
regions the run entered (`CheckpointRegions`) for the judge's diagnoses. Nothing of the recipe is changed: dropout
stays on (both runs draw from the same seed), the mode is the recipe's own.
"""

from __future__ import annotations

import dataclasses
import pathlib

from torch import nn

from trainparity._batches._sample_ids import normalize_sample_ids
from trainparity._observe._checkpoints import CheckpointRegion, CheckpointRegions
from trainparity._observe._observer import OBSERVATION_LOCK, Observer
from trainparity._observe._records import StepEvent
from trainparity._recipe._recipe import LossAccounting, batch_iterator, loss_value, next_batch, require_state
from trainparity._recipe._reference import RecipeRef
from trainparity._resume._trace import StepRecord
from trainparity._state._compare import Snapshot
from trainparity._state._entries import is_compiled, module_modes, state_objects, unobserved_entries
from trainparity._state._precision import (
    cast_batch,
    convert_state,
    require_float64_loss,
    require_float64_steps,
    running_in,
)
from trainparity._state._rng import seed_everything
from trainparity._state._snapshot import flatten, snapshot_state

GRADIENTS = "gradients."


@dataclasses.dataclass(frozen=True)
class EquivalentPayload:
    """One run: the reference or the candidate."""

    recipe: RecipeRef
    steps: int
    seed: int
    #: "float64": the run trains in float64 (`trainparity._state._precision`); "native": in the recipe's dtypes
    precision: str


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
        regions = CheckpointRegions(state)
        with Observer(state, type(recipe), [regions], before_step=require_float64_steps if float64 else None,
                      fingerprint_rng=False) as observer:
            initial = snapshot_state(state)
            steps = []
            with batch_iterator(recipe, state) as batches:
                for step in range(1, payload.steps + 1):
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
                    steps.append(StepRecord(step, {}, ids, loss, after, modes=module_modes(state)))
    return EquivalentTrace(initial, steps, unobserved_entries(state), regions.regions, compiled)
