"""What the preflight checks share: one seeded, observed run of the recipe, run as a job, and findings
reported once each.

The run sets the recipe up from the seed and calls `step()` under the one observer of optimizer
steps (`_observe.Observer`, dropout left as it is); the check validates its arguments, runs the
task through the engine (in-process by default) and judges the typed trace the task returned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fnmatch
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from trainparity._observe._hooks import Watch
from trainparity._observe._observer import OBSERVATION_LOCK, Observer
from trainparity._observe._records import CallRecord
from trainparity._process import _session
from trainparity._process._engine import Job, run_jobs
from trainparity._process._options import Deadline
from trainparity._recipe._recipe import Recipe, batch_iterator, loss_value, next_batch, require_state
from trainparity._recipe._reference import RecipeRef, RecipeSpec, resolve_recipe
from trainparity._results._result import Result
from trainparity._results._violation import JsonValue, Violation
from trainparity._state._entries import State
from trainparity._state._rng import seed_everything
from trainparity._validation import check_int, check_seed

T = TypeVar("T")
R = TypeVar("R", bound=Result)


@dataclasses.dataclass(frozen=True)
class PreflightPayload:
    """One run: the recipe set up from `seed`, then `steps` calls of `step()`."""

    recipe: RecipeRef
    steps: int
    seed: int


@dataclasses.dataclass(frozen=True)
class Preflight:
    """A preflight check's validated arguments: what its run gets, and the config its result shows."""

    payload: PreflightPayload
    config: dict[str, JsonValue]
    isolation: str
    #: the check's, from the moment its arguments were validated
    deadline: Deadline

    @classmethod
    def prepare(cls, recipe: RecipeSpec, *, steps: object, minimum_steps: int, seed: object, isolation: object,
                timeout: object) -> Preflight:
        """Validate the arguments (misuse raises TypeError/ValueError naming the fix) before anything runs."""
        ref = resolve_recipe(recipe)
        steps = check_int("steps", steps, minimum_steps, "calls of step() observed")
        seed = check_seed(seed)
        chosen = _session.isolation(isolation, "inprocess")
        config: dict[str, JsonValue] = {"recipe": ref.name, "steps": steps, "seed": seed, "isolation": chosen}
        return cls(PreflightPayload(ref, steps, seed), config, chosen, Deadline.after(_session.timeout(timeout)))

    def judged(self, task: str, record: type[T], result: type[R], judge: Callable[[T], R]) -> R:
        """Run `task` on the payload and judge the trace it returns (a `record`); a run that raised, hung or died
        is the ERROR result (of type `result`)."""
        job = Job(task, self.payload, "training", record=record, workdir=False)  # no preflight task writes files
        outcome = run_jobs([job], deadline=self.deadline, isolation=self.isolation)[0]
        if outcome.error is not None:
            return result.errored(outcome.error, self.config, outcome.exception)
        trace: T = outcome.output
        return judge(trace)


@contextlib.contextmanager
def observed_recipe(payload: PreflightPayload, *, watches: Sequence[Callable[[State, type], Watch]] = (),
                    **options: Any) -> Iterator[tuple[Recipe[Any], Observer]]:
    """The recipe, set up from the seed, its State under an Observer (dropout left as the recipe has it) with the
    watches `watches` make of the State and the recipe's type; `options` are the Observer's keyword arguments
    (`before_step`, `after_step`, `record_contributions`, ...)."""
    recipe = payload.recipe.build()
    # The lock covers seeding and setup() too: in-process checks in threads share the global RNG streams
    # and the functions the observer patches.
    with OBSERVATION_LOCK:
        seed_everything(payload.seed)
        state = require_state(recipe.setup(), recipe, "setup")
        with Observer(state, type(recipe), [make(state, type(recipe)) for make in watches], fingerprint_rng=False,
                      **options) as observer:
            yield recipe, observer


@dataclasses.dataclass
class Call:
    """One observed call of `step()`, numbered from 1."""

    number: int
    record: CallRecord
    #: what the call raised, when the run accepted it as a consequence of what was observed (the run ends there)
    error: str | None = None


def observed_calls(recipe: Recipe[Any], observer: Observer, steps: int,
                   tolerate: Callable[[CallRecord, Exception], bool] | None = None, *,
                   repeat_first: bool = False) -> Iterator[Call]:
    """`steps` calls of `recipe.step()` on its batches, each observed; with `repeat_first`, every call gets the
    recipe's first batch again (the same object).

    When a call raises and `tolerate(record, error)` says that what it observed explains the error, the call
    is yielded with the error and the run ends; otherwise the error propagates (the check's ERROR).
    """
    name = type(recipe).__name__
    with batch_iterator(recipe, observer.state) as batches:
        first = next_batch(batches, recipe, "step 1") if repeat_first else None
        for number in range(1, steps + 1):
            batch = first if repeat_first else next_batch(batches, recipe, f"step {number}")
            observer.begin_call(number)
            try:
                returned = recipe.step(observer.state, batch)
            except Exception as error:
                record = observer.end_call()
                if tolerate is None or not tolerate(record, error):
                    raise
                yield Call(number, record, f"{type(error).__name__}: {error}")
                return
            record = observer.end_call()
            record.loss = loss_value(returned, f"{name}.step() at step {number}")
            yield Call(number, record)


def nonfinite(tensor: torch.Tensor) -> bool:
    """Whether a tensor holds an inf or a NaN."""
    return not bool(torch.isfinite(tensor).all())


def finite_number(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def steps_text(steps: Iterable[int]) -> str:
    """`step 3` or `steps 1, 2, 4`."""
    listed = list(steps)
    return f"step{'s' if len(listed) != 1 else ''} {', '.join(map(str, listed))}"


def once_per_path(violations: Iterable[Violation]) -> list[Violation]:
    """The first violation of each (kind, path), in order; a message says at which later steps it recurred."""
    first: dict[tuple[str, str], Violation] = {}
    later: dict[tuple[str, str], list[int]] = {}
    for violation in violations:
        key = (violation.kind, violation.path)
        if key not in first:
            first[key], later[key] = violation, []
        elif violation.step is not None and violation.step not in later[key]:
            later[key].append(violation.step)
    return [dataclasses.replace(v, message=f"{v.message}\nAlso at {steps_text(later[key])}.") if later[key] else v
            for key, v in first.items()]


def matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


def unmatched_globs(globs: Iterable[str], names: list[str], argument: str, what: str) -> str | None:
    """The misuse message for the globs that match none of `names`, naming the closest names; None when each
    glob matches one."""
    lines = []
    for glob in globs:
        if any(fnmatch.fnmatchcase(name, glob) for name in names):
            continue
        below = sum(fnmatch.fnmatchcase(name, f"{glob}.*") for name in names)
        close = difflib.get_close_matches(glob, names, n=3, cutoff=0.3)
        hint = (f"; did you mean {glob + '.*'!r} (it matches {below})?" if below else
                f"; the closest are {', '.join(map(repr, close))}" if close else "")
        lines.append(f"{glob!r} matches no {what}{hint}")
    return f"{argument}=: " + "; ".join(lines) if lines else None
