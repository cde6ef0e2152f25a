"""`Recipe`: the user's training semantics, and `RecipeRef`: how a recipe travels to a fresh process.

A recipe is rebuilt in every run, so what travels is a reference to its class (module
and qualified name) plus its constructor arguments, never the live object.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import pickle
import runpy
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from trainparity._state import State, load_state, save_state


@dataclasses.dataclass(frozen=True)
class LossAccounting:
    """What `Recipe.step` may return instead of a bare loss, declaring how it was normalized.

    `numerator` is, say, the masked token-loss sum of the micro-batch and `denominator`
    the token count; only when a recipe returns this is the `loss_accounting` phase of
    the accumulation check judged.
    """

    value: torch.Tensor | float
    numerator: torch.Tensor | float | None = None
    denominator: torch.Tensor | float | None = None


class Recipe:
    """Subclass this to state your training semantics (see docs/api.md).

    The constructor takes configuration only (picklable values): the harness rebuilds the
    recipe in fresh processes from its class and these arguments.
    """

    _tp_init_args: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Recipe:
        self = super().__new__(cls)
        self._tp_init_args = (args, kwargs)
        return self

    def setup(self) -> State:
        """Build everything from scratch; the harness has seeded torch, numpy and random."""
        raise NotImplementedError(f"{type(self).__name__} must define setup(self) -> tp.State")

    def batches(self, state: State) -> Iterable[Any]:
        """The batches to train on; by default `state.loader`, epoch after epoch.

        A sampler with `set_epoch` (DistributedSampler, also behind a batch sampler) is told each
        epoch's number.
        """
        if "loader" not in state:
            raise NotImplementedError(
                f"{type(self).__name__} has no State entry 'loader': define batches(self, state)"
            )
        return _epochs(state.loader)

    def step(self, state: State, batch: Any) -> torch.Tensor | float | LossAccounting:
        """Train on one batch and return its loss."""
        raise NotImplementedError(f"{type(self).__name__} must define step(self, state, batch)")

    def sample_ids(self, batch: Any) -> Sequence[int | str] | torch.Tensor | None:
        """The IDs of the samples in `batch`; None (the default) leaves the data stream unchecked."""
        return None

    def save(self, state: State, path: pathlib.Path) -> None:
        """Your checkpoint code; by default `tp.save_state`."""
        save_state(state, path)

    def load(self, path: pathlib.Path) -> State:
        """Your resume code; by default `setup()` then `tp.load_state`."""
        return load_state(self.setup(), path)


def set_sampler_epoch(source: object, epoch: int) -> None:
    """Call `set_epoch(epoch)` on the first of `source`, its `.sampler`, its `.batch_sampler` or its
    `.batch_sampler.sampler` that has one (a DistributedSampler behind a DataLoader), as a training loop does."""
    batch_sampler = getattr(source, "batch_sampler", None)
    for target in (source, getattr(source, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        set_epoch = getattr(target, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return


def _epochs(loader: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        set_sampler_epoch(loader, epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return
        epoch += 1


@dataclasses.dataclass(frozen=True)
class RecipeRef:
    """A picklable reference to a recipe: where its class lives and how it was constructed."""

    module: str
    qualname: str
    #: for a class defined in a script run as __main__: the script, re-run under another name
    main_file: str | None
    #: pickled (args, kwargs) of the constructor
    arguments: bytes

    @property
    def name(self) -> str:
        """`module:Class`, with the constructor arguments when there are any: `m:Recipe(fault='ema')`."""
        module = pathlib.Path(self.main_file).stem if self.main_file else self.module
        args, kwargs = pickle.loads(self.arguments)
        shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        return f"{module}:{self.qualname}" + (f"({', '.join(shown)})" if shown else "")

    def recipe_class(self) -> type[Recipe]:
        if self.main_file is not None:
            namespace = runpy.run_path(self.main_file, run_name="__trainparity_main__")
            obj: Any = namespace[self.qualname.split(".")[0]]
            for part in self.qualname.split(".")[1:]:
                obj = getattr(obj, part)
        else:
            obj = import_attribute(self.module, self.qualname)
        if not (isinstance(obj, type) and issubclass(obj, Recipe)):
            raise TypeError(f"{self.module}:{self.qualname} is not a tp.Recipe subclass")
        return obj

    def build(self, **overrides: Any) -> Recipe:
        """Construct the recipe anew, with `overrides` replacing constructor keyword arguments."""
        args, kwargs = pickle.loads(self.arguments)
        try:
            return self.recipe_class()(*args, **{**kwargs, **overrides})
        except TypeError as error:
            if overrides:
                names = ", ".join(f"{k}=" for k in overrides)
                raise TypeError(f"{self.name} could not be built with {names}: {error}") from error
            raise


def import_attribute(module_name: str, qualname: str) -> Any:
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_recipe(recipe: object) -> RecipeRef:
    """Validate the `recipe` argument of a check and make it a `RecipeRef`.

    Accepts a Recipe subclass, an instance (its constructor arguments must pickle) or a
    `"package.module:ClassName"` string. Misuse raises TypeError/ValueError naming the fix.
    """
    if isinstance(recipe, str):
        module_name, sep, qualname = recipe.partition(":")
        if not sep or not module_name or not qualname:
            raise ValueError(f"a recipe spec looks like 'package.module:ClassName', got {recipe!r}")
        try:
            obj = import_attribute(module_name, qualname)
        except ImportError as error:
            raise ValueError(f"cannot import module {module_name!r} for recipe {recipe!r}: {error}") from error
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {qualname!r}") from None
        if not (isinstance(obj, type) and issubclass(obj, Recipe)):
            raise TypeError(f"{recipe!r} is not a tp.Recipe subclass (got {type(obj).__name__})")
        return _reference(obj, (), {})
    if isinstance(recipe, type):
        if not issubclass(recipe, Recipe):
            raise TypeError(f"{recipe.__qualname__} is not a tp.Recipe subclass: derive it from tp.Recipe")
        return _reference(recipe, (), {})
    if isinstance(recipe, Recipe):
        args, kwargs = recipe._tp_init_args
        return _reference(type(recipe), args, kwargs)
    raise TypeError(
        "recipe must be a tp.Recipe subclass, an instance of one, or a 'package.module:ClassName' string, "
        f"got {type(recipe).__name__}"
    )


def _reference(cls: type[Recipe], args: tuple[Any, ...], kwargs: dict[str, Any]) -> RecipeRef:
    if "<locals>" in cls.__qualname__:
        raise TypeError(
            f"recipe {cls.__qualname__} is defined inside a function; define it at module level so a "
            "fresh process can import it"
        )
    try:
        arguments = pickle.dumps((args, kwargs))
    except Exception as error:
        raise TypeError(
            f"the constructor arguments of {cls.__qualname__} must be picklable to rebuild it in a fresh "
            f"process: {error}"
        ) from error
    module, main_file = cls.__module__, None
    if module == "__main__":
        main = sys.modules["__main__"]
        spec_name = getattr(getattr(main, "__spec__", None), "name", None)
        if spec_name:
            module = spec_name
        elif getattr(main, "__file__", None):
            main_file = str(pathlib.Path(main.__file__).resolve())  # type: ignore[arg-type]
        else:
            raise TypeError(
                f"recipe {cls.__qualname__} is defined in an interactive session; define it in a module "
                "so a fresh process can import it"
            )
    return RecipeRef(module, cls.__qualname__, main_file, arguments)
