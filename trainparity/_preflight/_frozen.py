"""`check_frozen`: what is frozen stays bitwise unchanged through a few observed steps.

The run sets the recipe up and decides what is frozen: the parameters and buffers that `frozen=` globs match,
or by default every parameter with requires_grad=False right after `setup()`, with the persistent buffers of
the modules whose parameters are all frozen (a module without parameters of its own, `BatchNorm(affine=False)`,
goes with the closest module around it that has some). The `FrozenWatch` (`_watch.py`) compares each of them
through `steps` calls of `step()`, under the one observer with its forward passes recorded, and tells what
changed them: an optimizer step (with the parameter's `.grad`, weight decay and optimizer state), a train-mode
forward of a buffer's module, or the recipe's own code.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import torch
from torch import nn

from trainparity._observe._forwards import ForwardRecorder
from trainparity._preflight._run import (
    Preflight,
    PreflightPayload,
    matches,
    observed_calls,
    observed_recipe,
    once_per_path,
    steps_text,
    unmatched_globs,
)
from trainparity._preflight._watch import BufferRef, FrozenWatch, WatchRecord, watch_violations
from trainparity._process import _session
from trainparity._process._options import Isolation
from trainparity._recipe._reference import RecipeSpec
from trainparity._results._result import FrozenResult
from trainparity._results._violation import Outcome
from trainparity._state._entries import State, buffer_names, module_names, module_prefixes, state_parameters
from trainparity._validation import check_globs, check_misuse

__all__ = ["check_frozen"]

TASK = "trainparity._preflight._frozen:frozen_run"
#: what a State without a module is told
NO_MODULE = ("the State holds no nn.Module: put the model in the State (tp.State(model=model, ...)) so that its "
             "parameters and buffers can be watched")


@dataclasses.dataclass(frozen=True)
class FrozenPayload(PreflightPayload):
    #: the globs of what is frozen; None: what setup() froze
    frozen: tuple[str, ...] | None = None


@dataclasses.dataclass
class FrozenTrace:
    """One run of the frozen check, or the misuse found once the State was set up."""

    watch: WatchRecord
    misuse: str | None = None


# -- the run (in the child) -------------------------------------------------------------------------


def state_buffers(state: State) -> dict[str, tuple[BufferRef, bool]]:
    """The persistent buffers of the State's modules (those their state_dict holds), by name (`buffer_names`), each
    with whether every parameter of its module (or of the closest module around it that has some) is frozen."""
    names, modules = buffer_names(state), module_names(state)
    found: dict[str, tuple[BufferRef, bool]] = {}

    def visit(module: nn.Module, inherited: bool) -> None:
        parameters = list(module.parameters())
        frozen = not any(p.requires_grad for p in parameters) if parameters else inherited
        for attribute, buffer in module._buffers.items():
            if buffer is not None and attribute not in module._non_persistent_buffers_set and id(buffer) in names:
                reference = BufferRef(module, attribute, modules[id(module)], type(module).__name__)
                found.setdefault(names[id(buffer)], (reference, frozen))
        for child in module.children():
            visit(child, frozen)

    for _, _, root in module_prefixes(state):
        visit(root, False)
    return found


def frozen_run(payload: FrozenPayload, workdir: pathlib.Path) -> FrozenTrace:
    """Task: watch what is frozen through `steps` observed calls of `step()`."""
    watch = FrozenWatch()
    with observed_recipe(payload, before_step=watch.before_step,
                         after_step=watch.after_step, watches=[ForwardRecorder]) as (recipe, observer):
        state = observer.state
        if not module_prefixes(state):
            return FrozenTrace(watch.record, NO_MODULE)
        parameters = {f"parameters.{name}": p for name, p in state_parameters(state).values()}
        buffers = {f"buffers.{name}": found for name, found in state_buffers(state).items()}
        watched: dict[str, torch.Tensor | BufferRef]
        if payload.frozen is None:
            watched = {path: p for path, p in parameters.items() if not p.requires_grad}
            watched.update({path: reference for path, (reference, frozen) in buffers.items() if frozen})
        else:
            names = [path.split(".", 1)[1] for path in [*parameters, *buffers]]
            lazy = [name for name, _ in state_parameters(state, lazy=True).values()
                    if f"parameters.{name}" not in parameters]
            misuse = unmatched_globs(payload.frozen, names + lazy, "frozen", "parameter or buffer of the State")
            if misuse is None and any(matches(name, payload.frozen) for name in lazy):
                misuse = (f"frozen=: {', '.join(name for name in lazy if matches(name, payload.frozen))} belong to a "
                          "lazy module that no forward pass has given values yet, so they cannot be watched from the "
                          "start; materialize them in setup() with a forward pass of a dummy batch (as torch advises "
                          "for lazy modules)")
            if misuse is not None:
                return FrozenTrace(watch.record, misuse)
            every: dict[str, torch.Tensor | BufferRef] = {**parameters, **{p: ref for p, (ref, _) in buffers.items()}}
            watched = {path: source for path, source in every.items() if matches(path.split(".", 1)[1], payload.frozen)}
        watch.start(observer, watched, {})
        for call in observed_calls(recipe, observer, payload.steps):
            watch.end_call(call.number, call.record.forwards)
    return FrozenTrace(watch.record)


# -- the judgement (in the parent) ------------------------------------------------------------------


def _named(paths: list[str], limit: int = 4) -> str:
    names = [path.split(".", 1)[1] for path in paths]
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def judge_frozen(trace: FrozenTrace, config: dict[str, Any]) -> FrozenResult:
    check_misuse(trace.misuse)
    watch, declared = trace.watch, config["frozen"] is not None
    if not watch.frozen:
        return FrozenResult(Outcome.ABSTAIN, config=config, reason=(
            "nothing is frozen: no parameter of the State has requires_grad=False right after setup(), and frozen= "
            "declares none; declare what is meant to stay frozen, e.g. frozen='backbone.*'"))
    parameters = [path for path in watch.frozen if path.startswith("parameters.")]
    buffers = [path for path in watch.frozen if path.startswith("buffers.")]
    watched = [f"{len(paths)} {what}{'s' if len(paths) != 1 else ''} ({_named(paths)})"
               for paths, what in ((parameters, "parameter"), (buffers, "buffer")) if paths]
    notes = [f"Watched {' and '.join(watched)}."]
    violations = once_per_path(watch_violations(watch, declared))
    changed = {v.path for v in violations}
    unmoved = {path: steps for path, steps in watch.stepped.items() if path not in changed}
    if unmoved:
        notes.append(f"Optimizers stepped frozen parameters whose .grad was not None without moving them "
                     f"({', '.join(f'{_named([p])} at {steps_text(s)}' for p, s in list(unmoved.items())[:4])}): "
                     "with weight decay or momentum they would move; set their gradients to None.")
    return FrozenResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes, config)


@_session.recorded
def check_frozen(
    recipe: RecipeSpec,
    *,
    frozen: str | list[str] | tuple[str, ...] | None = None,
    steps: int = 2,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
) -> FrozenResult:
    """Check that what is frozen stays bitwise unchanged through `steps` calls of `step()`.

    `frozen` is a glob or a list of globs over the parameter and buffer names (`"backbone.*"`); None means every
    parameter with requires_grad=False right after `setup()`, with the buffers of
    the modules whose parameters are all frozen. Reports `frozen_param_changed` (the message says what moved
    it: an optimizer step on a stale `.grad`, weight decay, momentum, or the recipe's code),
    `frozen_buffer_changed` (cause `frozen_module_in_train_mode` when its module ran its forward in train mode)
    and `frozen_param_trainable` (a declared-frozen parameter that requires grad and got a gradient).
    `isolation` is "inprocess" (default), "process" or "spawn"; `timeout` bounds the whole check. Never raises
    for a FAIL; misuse (a glob that matches nothing, a State without a module, `steps` below 1) raises
    TypeError/ValueError.
    """
    globs = check_globs(frozen, "frozen", "backbone.*")
    preflight = Preflight.prepare(recipe, steps=steps, minimum_steps=1, seed=seed, isolation=isolation,
                                  timeout=timeout)
    payload = FrozenPayload(**vars(preflight.payload), frozen=globs)
    preflight = dataclasses.replace(preflight, payload=payload,
                                    config={**preflight.config, "frozen": None if globs is None else list(globs)})
    return preflight.judged(TASK, FrozenTrace, FrozenResult, lambda trace: judge_frozen(trace, preflight.config))
