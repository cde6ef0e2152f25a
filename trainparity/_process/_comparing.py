"""The set-up every comparison check (resume, accumulation, data parallel, equivalent) shares, as the preflight
checks share `Preflight.prepare`: each check validates its own arguments and states its runs; this resolves the
recipe, the seed, the precision and the comparison it implies, the isolation and the deadline, starts the config
the result shows, and turns a run's error into the check's result.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from trainparity._process import _session
from trainparity._process._options import Deadline, Isolation
from trainparity._process._world import world_isolation
from trainparity._recipe._reference import RecipeRef, RecipeSpec, resolve_recipe
from trainparity._results._result import Result
from trainparity._results._violation import ChildError, JsonValue
from trainparity._state._compare import Comparison, ignoring, resolve_comparison
from trainparity._state._precision import describe_comparison, dtype_error_hints, effective_comparison
from trainparity._validation import check_globs, check_seed

R = TypeVar("R", bound=Result)


@dataclasses.dataclass(frozen=True)
class ComparisonSetup:
    """A comparison check's resolved common arguments, and the config its result shows."""

    recipe: RecipeRef
    seed: int
    precision: _session.Precision
    #: the comparison the user declared; None where the precision decides (`effective_comparison`)
    declared: Comparison | None
    #: what the runs are judged with: the declared comparison, else the precision's own, passing over the ignored
    #: paths
    judged: Comparison
    isolation: Isolation
    deadline: Deadline
    #: the recipe, the check's own arguments (`shown`), the seed, the precision, the comparison and the isolation
    config: dict[str, JsonValue]

    @classmethod
    def prepare(cls, recipe: RecipeSpec, *, comparison: Comparison | None, precision: object, seed: object,
                isolation: object, timeout: object, default_isolation: Isolation, backend: str | None = None,
                shown: dict[str, JsonValue] | None = None, key: str = "recipe",
                ignore: object = None) -> ComparisonSetup:
        """Resolve (misuse raises TypeError/ValueError naming the fix) before anything runs. `precision`,
        `isolation` and `timeout` left at None take the session's defaults; `backend`: the runs are worlds of ranks
        on it, whose isolation follows from it (`world_isolation`); `shown`: the check's own arguments; `key`: the
        recipe's name in the config (`reference` where a check compares two recipes); `ignore`: globs over State paths
        the comparison passes over (`Comparison.ignore`)."""
        ref = resolve_recipe(recipe)
        declared = None if comparison is None else resolve_comparison(comparison)
        chosen_precision = _session.precision(precision)
        chosen_isolation = world_isolation(isolation, backend) if backend is not None else _session.isolation(
            isolation, default_isolation)
        valid_seed = check_seed(seed)
        globs = check_globs(ignore, "ignore", "ema.*") or ()
        config: dict[str, JsonValue] = {
            key: ref.name,
            **(shown or {}),
            "seed": valid_seed,
            "precision": chosen_precision,
            "comparison": describe_comparison(declared, chosen_precision),
            "isolation": chosen_isolation,
            **({"ignore": list(globs)} if globs else {}),  # shown where given
        }
        judged = ignoring(effective_comparison(declared, chosen_precision), globs)
        return cls(ref, valid_seed, chosen_precision, declared, judged, chosen_isolation,
                   Deadline.after(_session.timeout(timeout)), config)

    def showing(self, more: dict[str, JsonValue]) -> ComparisonSetup:
        """This set-up with `more` shown in its config, after what `prepare` put there (arguments that could only be
        checked once the set-up was resolved)."""
        return dataclasses.replace(self, config={**self.config, **more})

    def errored(self, kind: type[R], error: ChildError, exception: BaseException | None = None) -> R:
        """The check's ERROR result for a run that raised, hung or died, with what the error says of dtypes."""
        result = kind.errored(error, self.config, exception)
        result.notes += dtype_error_hints(error.message, self.precision)
        return result
