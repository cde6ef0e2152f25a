"""`check_train_mode`: the modules whose behaviour depends on their mode train in train mode, and evaluations
leave the training alone.

The run observes `steps` calls of `step()` with the forward passes of the State's modules recorded
(`_observe/_forwards.py`): per outermost forward (a *pass*), which modules read their `training` and what they
read, what it changed and drew, whether a backward pass went through its output; and who switched a module's
mode. A pass builds the loss when a backward pass went through its output. It is an evaluation when it ran under
`torch.no_grad()` or `torch.inference_mode()`, or when its output took no part in the backward passes of a
call that did back-propagate. The judgement, in the order things happened:

- `module_left_in_eval`: a module read `training` as False in a pass that built the loss, and `eval_modules`
  does not declare it; the message names the switch that put it in eval mode, or says that `setup()` left it so;
- `eval_in_train_mode`: an evaluation pass in which modules ran in train mode and changed buffers or drew from
  torch's RNG streams, or a module in eval mode called a functional dropout that dropped (transformers PR 33844).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from trainparity._observe._forwards import ForwardRecorder
from trainparity._observe._records import ForwardPass, ForwardRecord, ModeSwitch
from trainparity._preflight._frozen import NO_MODULE
from trainparity._preflight._run import (
    Preflight,
    PreflightPayload,
    matches,
    observed_calls,
    observed_recipe,
    once_per_path,
    unmatched_globs,
)
from trainparity._process import _session
from trainparity._process._options import Isolation
from trainparity._recipe._reference import RecipeSpec
from trainparity._results._result import TrainModeResult
from trainparity._results._violation import Outcome, Violation, listed
from trainparity._state._entries import module_prefixes
from trainparity._validation import check_globs, check_misuse

__all__ = ["check_train_mode"]

TASK = "trainparity._preflight._train_mode:train_mode_run"
#: what a module's mode changes, by the category the recorder gives it
EFFECTS = {
    "dropout": "it dropped nothing",
    "norm": "it normalized with its running statistics instead of the batch's and did not update them",
    "other": "its forward reads self.training",
}


@dataclasses.dataclass(frozen=True)
class TrainModePayload(PreflightPayload):
    #: the globs of the modules deliberately in eval mode
    eval_modules: tuple[str, ...] | None = None


@dataclasses.dataclass
class TrainModeTrace:
    """One run of the train-mode check, or the misuse found once the State was set up."""

    #: per step() call, its forward passes and the mode switches since the last call
    calls: list[ForwardRecord]
    #: module name -> [class name, category], of the modules whose mode mattered in a pass
    kinds: dict[str, list[str]]
    #: the modules in eval mode right after setup()
    eval_after_setup: list[str]
    misuse: str | None = None


# -- the run (in the child) -------------------------------------------------------------------------


def train_mode_run(payload: TrainModePayload, workdir: pathlib.Path) -> TrainModeTrace:
    """Task: `steps` observed calls of `step()`, their forward passes recorded."""
    with observed_recipe(payload, watches=[ForwardRecorder]) as (recipe, observer):
        recorder = observer.watch(ForwardRecorder)
        if not module_prefixes(observer.state):
            return TrainModeTrace([], {}, [], NO_MODULE)
        if payload.eval_modules is not None:
            misuse = unmatched_globs(payload.eval_modules, list(recorder.names.values()), "eval_modules",
                                     "module of the State")
            if misuse is not None:
                return TrainModeTrace([], {}, [], misuse)
        calls = []
        for call in observed_calls(recipe, observer, payload.steps):
            assert call.record.forwards is not None
            calls.append(call.record.forwards)
        return TrainModeTrace(calls, recorder.kinds, recorder.eval_after_setup)


# -- the judgement (in the parent) ------------------------------------------------------------------


class _Judge:
    def __init__(self, trace: TrainModeTrace, eval_modules: tuple[str, ...] | None) -> None:
        self.trace, self.eval_modules = trace, eval_modules or ()
        #: each module's last mode switch so far
        self.switches: dict[str, ModeSwitch] = {}
        self.declared_in_eval: dict[str, None] = {}

    def kind(self, name: str) -> str:
        return f"{self.trace.kinds.get(name, ['module'])[0]} '{name}'"

    def declared(self, name: str) -> bool:
        """Whether `eval_modules` declares the module, or a module containing it, deliberately in eval mode."""
        parts = name.split(".")
        return any(matches(".".join(parts[:end]), self.eval_modules) for end in range(len(parts), 0, -1))

    def left_in_eval(self, forward: ForwardPass, step: int) -> list[Violation]:
        found = []
        for name, training in forward.modes:
            if training:
                continue
            if self.declared(name):
                self.declared_in_eval[name] = None
                continue
            category = self.trace.kinds.get(name, ["", "other"])[1]
            switch = self.switches.get(name)
            if switch is not None and not switch.training:
                when = (f"in step {switch.step}" if switch.inside else
                        f"before step {switch.step}, as its batch was drawn")
                origin = (f"It was set to eval mode by {switch.site} {when}, and nothing set it back: call "
                          "model.train() after evaluating.")
            else:
                origin = "It was already in eval mode right after setup()."
            found.append(Violation(
                "module_left_in_eval", f"modules.{name}",
                f"{self.kind(name)} was in eval mode in the forward pass that built the loss at step {step}: "
                f"{EFFECTS[category]}. {origin} If it is meant to stay in eval mode (a frozen BatchNorm), declare "
                f"it: eval_modules=[{name!r}].", step=step, expected="train", actual="eval",
                cause="module_left_in_eval"))
        return found

    def eval_in_train_mode(self, forward: ForwardPass, step: int, how: str) -> Violation | None:
        trained = forward.in_train_mode
        ignored_mode = [(name, function) for name, function, training in forward.dropouts if not training]
        if not ((trained and (forward.buffers or forward.rng)) or (ignored_mode and forward.rng)):
            return None
        owners = [b.rsplit(".", 1)[0] if "." in b else forward.module for b in forward.buffers]
        dropping = [name for name, _, training in forward.dropouts if training]
        culprit = next(iter([*owners, *dropping, *(name for name, _ in ignored_mode), *trained]))
        effects = []
        if forward.buffers:
            effects.append(f"it updated the buffers {listed(forward.buffers)}")
        if forward.rng:
            where = f" (dropout in {listed(list(dict.fromkeys(name for name, *_ in forward.dropouts)))})" if (
                forward.dropouts) else ""
            effects.append(f"it drew from torch's RNG stream of training{where}")
        message = f"The forward of '{forward.module}' at step {step} ran {how}"
        if trained:
            message += f" with modules in train mode ({listed([self.kind(name) for name in trained])})"
        message += ": " + " and ".join(effects) + ". "
        for name, function in ignored_mode:
            message += (f"{self.kind(name)} is in eval mode, but its forward called {function} with training=True: "
                        "pass training=self.training (transformers PR 33844). ")
        if trained:
            message += ("An evaluation in train mode changes the training that follows it (other running "
                        "statistics, other dropout masks): call model.eval() before evaluating and model.train() "
                        "after.")
        else:
            message += "An evaluation that draws from it changes the dropout masks of the training that follows it."
        return Violation("eval_in_train_mode", f"modules.{culprit}", message, step=step,
                         expected="eval" if trained else None, actual="train" if trained else None,
                         cause="eval_in_train_mode")

    def call(self, record: ForwardRecord, step: int, notes: list[str]) -> list[Violation]:
        backward = any(forward.reached for forward in record.passes)
        found: list[Violation] = []
        unjudged = []
        events: list[ForwardPass | ModeSwitch] = sorted([*record.passes, *record.switches], key=lambda e: e.order)
        for event in events:
            if isinstance(event, ModeSwitch):
                self.switches[event.module] = event
                continue
            forward = event
            if forward.grad and not forward.inference and forward.reached:
                found += self.left_in_eval(forward, step)
                continue
            if forward.inference or not forward.grad:
                how = "under torch.inference_mode()" if forward.inference else "under torch.no_grad()"
            elif backward and (forward.reached is False or (forward.reached is None and not forward.trainable)):
                how = "with gradients enabled, but its output took no part in a backward pass"
            else:
                unjudged.append(forward.module)
                continue
            violation = self.eval_in_train_mode(forward, step, how)
            if violation is not None:
                found.append(violation)
        if unjudged and not backward:
            notes.append(f"In step {step} no backward pass went through the output of a forward pass of the State's "
                         f"modules ({listed(list(dict.fromkeys(unjudged)))}): its passes were not judged.")
        elif unjudged:
            notes.append(f"In step {step} the output of {listed(list(dict.fromkeys(unjudged)))} holds no tensor that "
                         "requires grad where the check looks (tensors in tuples, lists, dicts and dataclasses): "
                         "whether it built the loss is unknown, and it was not judged.")
        return found


def judge_train_mode(trace: TrainModeTrace, config: dict[str, Any],
                     eval_modules: tuple[str, ...] | None) -> TrainModeResult:
    check_misuse(trace.misuse)
    if not any(record.passes for record in trace.calls):
        return TrainModeResult(Outcome.ABSTAIN, config=config, reason=(
            f"no forward pass of a module of the State ran in the {config['steps']} steps: call the model the State "
            "holds"))
    judge, notes = _Judge(trace, eval_modules), list[str]()
    found = [v for step, record in enumerate(trace.calls, start=1) for v in judge.call(record, step, notes)]
    violations = once_per_path(found)
    dependent = dict.fromkeys(name for record in trace.calls for forward in record.passes for name, _ in forward.modes)
    kinds = [judge.kind(name) for name in dependent]
    notes.insert(0, f"Modules whose behaviour depends on their mode: {listed(kinds)}." if kinds else
                 "No module of the State read its mode (self.training) in a forward pass: nothing depends on it.")
    if judge.declared_in_eval:
        notes.append(f"In eval mode as eval_modules declares: {listed(list(judge.declared_in_eval))}.")
    return TrainModeResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes, config)


@_session.recorded
def check_train_mode(
    recipe: RecipeSpec,
    *,
    steps: int = 3,
    eval_modules: str | list[str] | tuple[str, ...] | None = None,
    seed: int = 0,
    isolation: Isolation | None = None,
    timeout: float | None = None,
) -> TrainModeResult:
    """Check that every module whose behaviour depends on its mode is in train mode in the forward passes that
    build the loss, and that evaluations leave the training alone, over `steps` calls of `step()`.

    A module depends on its mode when its forward reads `self.training` (dropout, batch norm, a module that
    calls `F.dropout(..., training=self.training)`). Reports `module_left_in_eval` (in eval mode in a pass that
    built the loss, naming the call that switched it, e.g. an evaluation in an earlier step) unless
    `eval_modules` (a glob or list of globs over module names; a module inside a declared one is declared too)
    declares it, and `eval_in_train_mode` (a forward under no_grad/inference_mode, or whose output took no part
    in a backward pass, ran modules in train mode and changed buffers or drew from torch's RNG streams).
    `isolation` is "inprocess" (default), "process" or "spawn"; `timeout` bounds the whole check. Never raises
    for a FAIL; misuse (a glob that matches no module, a State without a module, `steps` below 1) raises
    TypeError/ValueError.
    """
    globs = check_globs(eval_modules, "eval_modules", "backbone.*")
    preflight = Preflight.prepare(recipe, steps=steps, minimum_steps=1, seed=seed, isolation=isolation,
                                  timeout=timeout)
    payload = TrainModePayload(**vars(preflight.payload), eval_modules=globs)
    preflight = dataclasses.replace(preflight, payload=payload, config={
        **preflight.config, "eval_modules": None if globs is None else list(globs)})
    return preflight.judged(TASK, TrainModeTrace, TrainModeResult,
                            lambda trace: judge_train_mode(trace, preflight.config, globs))
