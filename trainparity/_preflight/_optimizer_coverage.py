"""`check_optimizer_coverage`: which parameters the optimizers hold, and which got gradients.

The run records, right after `setup()` (step 0) and after the last step, every parameter of the
State (its modules' and its tensor entries that require grad or are `nn.Parameter`s) with the
optimizer groups that list it, and every optimizer parameter that belongs to none of them; during
each step, through the observer's gradient hooks, the trainable parameters an optimizer holds that
no gradient reached; and, through the `FrozenWatch` (`_watch.py`) that the frozen check also uses, whether
a frozen parameter an optimizer holds changed or was stepped with a `.grad` that was not None (a frozen
parameter that is neither is harmless: torch's optimizers skip a parameter whose `.grad` is None). Parameters
are identified by object, so tied weights (GPT's `wte` and `lm_head`) are one parameter under its first name.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.optim.swa_utils import AveragedModel

from trainparity._preflight._run import (
    Preflight,
    PreflightPayload,
    observed_calls,
    observed_recipe,
    once_per_path,
    steps_text,
)
from trainparity._preflight._watch import Change, FrozenWatch, WatchRecord, change_violation
from trainparity._process import _session
from trainparity._process._options import Isolation
from trainparity._recipe._reference import RecipeSpec
from trainparity._results._result import OptimizerCoverageResult
from trainparity._results._violation import Outcome, Violation, listed
from trainparity._state._entries import State, state_objects, state_parameters, unwrap_module

__all__ = ["check_optimizer_coverage"]

TASK = "trainparity._preflight._optimizer_coverage:optimizer_coverage_run"


@dataclasses.dataclass
class Parameter:
    """A parameter of the State at one moment, with every optimizer group that lists it."""

    name: str
    #: None: a lazy module's parameter that no forward pass has given a size yet
    shape: list[int] | None
    trainable: bool
    #: `<optimizer entry>.param_groups.<i>`, once per listing
    groups: list[str]
    #: its other names, for a tied weight (`lm_head.weight` beside `transformer.wte.weight`)
    tied: list[str]
    #: the path of the `AveragedModel` (an EMA or SWA copy) that holds it: averaging updates it, no optimizer
    averaged_by: str | None = None


@dataclasses.dataclass
class Foreign:
    """An optimizer's parameter that is no parameter of the State."""

    group: str
    position: int
    shape: list[int] | None


@dataclasses.dataclass
class Layout:
    """Which optimizer group holds which parameter, right after setup() (step 0) or after step `step`."""

    step: int
    parameters: list[Parameter]
    #: optimizer entry -> how many parameters it holds
    optimizers: dict[str, int]
    #: optimizer entry -> its parameters that are no parameter of the State
    foreign: dict[str, list[Foreign]]


@dataclasses.dataclass
class CoverageTrace:
    """One run of the optimizer coverage check."""

    #: after setup() and, when steps were taken, after the last one
    layouts: list[Layout]
    #: per step: the trainable parameters an optimizer holds that got no gradient (None: no parameter got one)
    without_grad: list[list[str] | None]
    #: the frozen parameters the optimizers held right after setup() (or once seen frozen), watched
    watch: WatchRecord


# -- the run (in the child) -------------------------------------------------------------------------


def _tied_names(state: State, parameters: dict[int, tuple[str, torch.Tensor]]) -> dict[int, list[str]]:
    """id -> the other names of each parameter that a module holds under several (tied weights)."""
    names: dict[int, list[str]] = {}
    for _, module in state_objects(state, nn.Module):
        for name, parameter in unwrap_module(module).named_parameters(remove_duplicate=False):
            names.setdefault(id(parameter), []).append(name)
    tied = {}
    for key, found in names.items():
        if len(found) > 1 and key in parameters:
            prefix = parameters[key][0].removesuffix(found[0])  # the entry, where names carry one
            tied[key] = [prefix + name for name in dict.fromkeys(found[1:])]
    return tied


def _shape_of(tensor: torch.Tensor) -> list[int] | None:
    return None if is_lazy(tensor) else list(tensor.shape)


def _averaged(state: State) -> dict[int, str]:
    """id -> the path of the `torch.optim.swa_utils.AveragedModel` that holds the parameter."""
    found: dict[int, str] = {}
    for entry, module in state_objects(state, nn.Module):
        for name, sub in unwrap_module(module).named_modules():
            if isinstance(sub, AveragedModel):
                path = f"{entry}.{name}" if name else entry
                found.update(dict.fromkeys(map(id, sub.parameters()), path))
    return found


def _layout(state: State, step: int) -> Layout:
    parameters = state_parameters(state, lazy=True)
    tied = _tied_names(state, parameters)
    averaged = _averaged(state)
    groups: dict[int, list[str]] = {key: [] for key in parameters}
    optimizers: dict[str, int] = {}
    foreign: dict[str, list[Foreign]] = {}
    for entry, optimizer in state_objects(state, torch.optim.Optimizer):
        optimizers[entry] = 0
        for index, group in enumerate(optimizer.param_groups):
            where = f"{entry}.param_groups.{index}"
            for position, tensor in enumerate(group["params"]):
                optimizers[entry] += 1
                if id(tensor) in groups:
                    groups[id(tensor)].append(where)
                else:
                    foreign.setdefault(entry, []).append(Foreign(where, position, _shape_of(tensor)))
    return Layout(step, [Parameter(name, _shape_of(tensor), tensor.requires_grad, groups[key], tied.get(key, []),
                                   averaged.get(key)) for key, (name, tensor) in parameters.items()],
                  optimizers, foreign)


def optimizer_coverage_run(payload: PreflightPayload, workdir: pathlib.Path) -> CoverageTrace:
    """Task: the layouts after setup() and after the steps, the parameters without a gradient per step, and the
    frozen parameters the optimizers hold, watched."""
    watch = FrozenWatch()
    with observed_recipe(payload, record_contributions=True, before_step=watch.before_step,
                         after_step=watch.after_step) as (recipe, observer):
        state = observer.state
        layouts = [_layout(state, 0)]
        known = state_parameters(state, lazy=True)
        held = {id(p): (f"parameters.{known[id(p)][0]}", p) for pairs in observer.optimizer_parameters.values()
                for _, p in pairs if id(p) in known}
        # The frozen ones from now on, the others from the moment they are seen frozen.
        watch.start(observer, {path: p for path, p in held.values() if not p.requires_grad},
                    {key: (path, p) for key, (path, p) in held.items() if p.requires_grad})
        # The observer's gradient hooks sit on the trainable parameters its optimizers held at setup().
        hooked = {id(p): name for pairs in observer.optimizer_parameters.values() for name, p in pairs
                  if p.requires_grad and id(p) in known}
        without_grad: list[list[str] | None] = []
        for call in observed_calls(recipe, observer, payload.steps):
            watch.end_call(call.number, None)
            got = call.record.contribution
            # None: no parameter an optimizer holds got a gradient (a call without a backward pass); one frozen
            # during the run is not missing its gradient
            without_grad.append([known[key][0] for key, name in hooked.items()
                                 if name not in got and known[key][1].requires_grad] if got or not hooked else None)
        if payload.steps:
            layouts.append(_layout(state, payload.steps))
    return CoverageTrace(layouts, without_grad, watch.record)


# -- the judgement (in the parent) ------------------------------------------------------------------


def _shape(shape: list[int] | None) -> str:
    return "not materialized yet" if shape is None else str(list(shape))


def _unoptimized(parameter: Parameter) -> bool:
    """Trainable, and neither an optimizer nor averaging updates it; a lazy module's parameter once a forward pass
    gave it values (before, it takes part in nothing: it is judged after the steps)."""
    return (parameter.trainable and not parameter.groups and parameter.averaged_by is None
            and parameter.shape is not None)


def _layout_violations(layout: Layout) -> Iterator[Violation]:
    """The optimizers that hold foreign parameters, then every parameter's findings, in the State's order."""
    step = layout.step
    when = "right after setup()" if step == 0 else f"after step {step}"
    unoptimized = [p for p in layout.parameters if _unoptimized(p)]
    copied_shapes: set[str] = set()
    for entry, foreign in layout.foreign.items():
        total = layout.optimizers[entry]
        shapes = Counter(_shape(f.shape) for f in foreign)
        matched = shapes & Counter(_shape(p.shape) for p in unoptimized)
        which = (f"none of its {total} parameters belongs to a module (or is a tensor entry) of the State"
                 if len(foreign) == total else
                 f"{len(foreign)} of its {total} parameters belong to no module (and are no tensor entry) of the State")
        positions: dict[str, list[str]] = {}
        for f in foreign:
            positions.setdefault(f.group, []).append(str(f.position))
        where = "; ".join(f"{group} positions {listed(indices)}" for group, indices in positions.items())
        shapes_text = listed([_shape(f.shape) for f in foreign])
        message = (f"Optimizer '{entry}' {when}: {which} ({where}; shapes {shapes_text}). Stepping them changes "
                   "nothing the State trains.")
        if sum(matched.values()) == len(foreign):
            copied_shapes.update(matched)
            message += ("\nIts parameters have the shapes of State parameters that no optimizer holds: it was built "
                        "for another copy of the model (one rebuilt, deep-copied or reloaded after the optimizer was "
                        "created). Build the optimizer from the model that the State holds.")
        else:
            message += ("\nThey belong to a module the State does not hold: one replaced after the optimizer was built "
                        "(model.head = nn.Linear(...)), or one kept outside the State (put it in the State).")
        yield Violation("optimizer_for_other_model", entry, message, step=step, expected=0, actual=len(foreign),
                        cause="optimizer_for_other_model")
    for parameter in layout.parameters:
        path = f"parameters.{parameter.name}"
        tied = f", tied: also {', '.join(parameter.tied)}" if parameter.tied else ""
        what = f"Parameter '{parameter.name}' (shape {_shape(parameter.shape)}{tied})"
        if len(parameter.groups) > 1:
            yield Violation(
                "param_in_several_groups", path,
                f"{what} is listed {len(parameter.groups)} times {when}: in {', '.join(parameter.groups)}. Every "
                f"listing updates it, so each training step updates it {len(parameter.groups)} times. List it in one "
                "group of one optimizer.",
                step=step, expected=1, actual=len(parameter.groups), cause="param_in_several_groups")
        if _unoptimized(parameter):
            copy = _shape(parameter.shape) in copied_shapes
            yield Violation(
                "param_not_optimized", path,
                f"{what} requires grad, but no optimizer of the State holds it {when}: training never updates it. "
                + ("It has the shape of a parameter that an optimizer built for another copy of the model holds "
                   "(see optimizer_for_other_model)." if copy else
                   "Add it to an optimizer, or freeze it with requires_grad_(False) if it is not meant to train."),
                step=step, cause="optimizer_for_other_model" if copy else "param_not_optimized")


def _frozen_findings(trace: CoverageTrace, layouts: list[Layout]) -> tuple[list[Violation], list[str]]:
    """The frozen parameters the optimizers hold: FAIL when one changed while frozen (`frozen_param_changed`) or was
    stepped with a `.grad` that was not None (`frozen_param_optimized`); the others are harmless, named in a note."""
    held: dict[str, list[str]] = {}
    for layout in layouts:
        for parameter in layout.parameters:
            if not parameter.trainable and parameter.groups:
                held.setdefault(f"parameters.{parameter.name}", parameter.groups)
    for path in trace.watch.frozen:
        held.setdefault(path, [])
    changes: dict[str, list[Change]] = {}
    for event in trace.watch.events:
        if isinstance(event, Change) and not event.trainable:  # one unfrozen before it changed is trained, not frozen
            changes.setdefault(event.path, []).append(event)
    found, harmless = [], []
    for path, groups in held.items():
        name = path.split(".", 1)[1]
        stepped = trace.watch.stepped.get(path)
        if path in changes:
            found += [change_violation(change, declared=False) for change in changes[path]]
        elif stepped:
            holders = f"{', '.join(groups)} holds it" if groups else "an optimizer holds it"
            found.append(Violation(
                "frozen_param_optimized", path,
                f"Parameter '{name}' is frozen (requires_grad=False) and {holders}, but its .grad was not None at "
                f"{steps_text(stepped)}, so the optimizer did not skip it. It did not move in the observed steps; "
                "weight decay or momentum would move it. Set its gradient to None when freezing it "
                "(optimizer.zero_grad() with the default set_to_none=True), or build the optimizer from the "
                "trainable parameters only.", step=stepped[0], cause="frozen_param_optimized"))
        else:
            harmless.append(name)
    notes = [f"Held but frozen: {listed(harmless)}: torch's optimizers skip a parameter while its .grad is None; "
             "check_frozen verifies it stays put."] if harmless else []
    return found, notes


def _without_grad_violations(without_grad: list[list[str] | None]) -> Iterator[Violation]:
    steps: dict[str, list[int]] = {}
    for step, names in enumerate(without_grad, start=1):
        for name in names or ():
            steps.setdefault(name, []).append(step)
    judged = sum(names is not None for names in without_grad)
    for name, missing in steps.items():
        yield Violation(
            "param_without_grad", f"gradients.{name}",
            f"Parameter '{name}' requires grad and an optimizer holds it, but no gradient reached it in "
            f"{steps_text(missing)} (of {judged} with a backward pass): it took no part in the loss. "
            "DistributedDataParallel then fails ('Expected to have finished reduction in the prior iteration') "
            "unless find_unused_parameters=True; use it in the loss, freeze it, or remove it from the model.",
            step=missing[0], expected=judged, actual=judged - len(missing), cause="param_without_grad")


def judge_optimizer_coverage(trace: CoverageTrace, config: dict[str, Any]) -> OptimizerCoverageResult:
    """Violations in observation order: right after setup(), during the steps, after the last step (each once)."""
    layouts = [layout for layout in trace.layouts if layout.optimizers]
    steps = config["steps"]
    if not any(layout.parameters for layout in trace.layouts):
        return OptimizerCoverageResult(
            Outcome.ABSTAIN, config=config, reason="the State holds no module with parameters (nor a tensor entry "
            "that requires grad): put the model in the State so its parameters can be matched to the optimizers")
    if not layouts:
        after = f" nor after step {steps}" if steps else ""
        return OptimizerCoverageResult(
            Outcome.ABSTAIN, config=config,
            reason=f"the State holds no optimizer, right after setup(){after}: put the optimizer in the State")
    notes = []
    if not trace.layouts[0].optimizers:
        notes.append(f"Right after setup() the State held no optimizer: the optimizers were judged after step {steps}, "
                     "and param_without_grad was not judged (its gradient hooks sit on the parameters that the "
                     "optimizers hold right after setup()).")
    if not steps:
        notes.append("steps=0: param_without_grad was not judged (no step was taken).")
    silent = [step for step, names in enumerate(trace.without_grad, start=1) if names is None]
    if silent:
        notes.append(f"No gradient reached any parameter an optimizer holds in {steps_text(silent)}: "
                     "param_without_grad was not judged there.")
    tied = {f"{p.name} (also {', '.join(p.tied)})": None for layout in layouts for p in layout.parameters if p.tied}
    if tied:
        notes.append(f"Tied weights are one parameter each: {', '.join(tied)}.")
    averaged = {p.averaged_by: None for layout in layouts for p in layout.parameters
                if p.averaged_by is not None and p.trainable and not p.groups}
    if averaged:
        notes.append(f"Averaged copies: the parameters of {', '.join(map(str, averaged))} (a torch.optim.swa_utils."
                     "AveragedModel) require grad and no optimizer holds them: its update_parameters() averages them.")
    first, *later = layouts
    frozen, frozen_notes = _frozen_findings(trace, layouts)
    notes += frozen_notes
    during = sorted([*_without_grad_violations(trace.without_grad), *frozen], key=lambda v: v.step or 0)
    found = [*_layout_violations(first), *during]
    known = {(v.kind, v.path) for v in found}
    found += [v for layout in later for v in _layout_violations(layout) if (v.kind, v.path) not in known]
    violations = once_per_path(found)
    outcome = Outcome.FAIL if violations else Outcome.PASS
    return OptimizerCoverageResult(outcome, violations, notes, config)


@_session.recorded
def check_optimizer_coverage(
    recipe: RecipeSpec,
    *,
    steps: int = 1,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
) -> OptimizerCoverageResult:
    """Check that every trainable parameter of the recipe's State is in exactly one optimizer group.

    Right after `setup()` and after `steps` calls of `step()`, reports trainable parameters in no
    optimizer (`param_not_optimized`), parameters listed in several optimizers or groups
    (`param_in_several_groups`), optimizers holding parameters of no module of the State
    (`optimizer_for_other_model`), and, during the steps, trainable parameters an optimizer holds
    that got no gradient (`param_without_grad`), frozen parameters an optimizer holds that changed
    (`frozen_param_changed`) or that it stepped with a `.grad` that was not None
    (`frozen_param_optimized`); a frozen parameter it holds that is neither is a note. Tied weights
    are one parameter. `isolation` is "inprocess" (default), "process" or "spawn"; `timeout` bounds
    the whole check (in-process too: the run is interrupted at the deadline). Never raises for a FAIL; misuse
    raises TypeError/ValueError.
    """
    preflight = Preflight.prepare(recipe, steps=steps, minimum_steps=0, seed=seed, isolation=isolation,
                                  timeout=timeout)
    return preflight.judged(TASK, CoverageTrace, OptimizerCoverageResult,
                            lambda trace: judge_optimizer_coverage(trace, preflight.config))
