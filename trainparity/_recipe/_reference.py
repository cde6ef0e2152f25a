"""`RecipeRef`: how a recipe travels to a fresh process.

A recipe is rebuilt in every run, so what travels is a reference to its class (module, the module's
file and qualified name) plus its constructor arguments, never the live object.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import pickle
import sys
from typing import Any, TypeAlias

from trainparity._recipe._modules import ALIAS_PREFIX, MAIN_ALIAS, attribute, load_module, module_file
from trainparity._recipe._recipe import Recipe
from trainparity._recipe._spec import load_spec, parse_spec
from trainparity._validation import InvalidArgument

#: what a check's `recipe` argument may be: a Recipe subclass, an instance of one, or a spec string
RecipeSpec: TypeAlias = type[Recipe[Any]] | Recipe[Any] | str


@dataclasses.dataclass(frozen=True)
class RecipeRef:
    """A picklable reference to a recipe: where its class lives and how it was constructed."""

    module: str
    qualname: str
    #: the module's file, loaded as `module` where that name does not import it (a script run as __main__,
    #: a test module pytest imported with --import-mode=importlib, a `path/to/file.py:Class` spec)
    file: str | None
    #: pickled (args, kwargs) of the constructor
    arguments: bytes
    #: the class comes from the script run as `__main__`: the objects of `__main__` in `arguments` (a config
    #: dataclass of the script) are the objects of `module` where `__main__` is another program (a fresh process)
    from_main: bool = False

    @property
    def name(self) -> str:
        """`module:Class`, with the constructor arguments when there are any: `m:Recipe(fault='ema')`."""
        module = pathlib.Path(self.file).stem if self.file and self.module.startswith(ALIAS_PREFIX) else self.module
        args, kwargs = self._arguments()
        shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        return f"{module}:{self.qualname}" + (f"({', '.join(shown)})" if shown else "")

    def recipe_class(self) -> type[Recipe[Any]]:
        obj = attribute(load_module(self.module, self.file), self.qualname)
        if not (isinstance(obj, type) and issubclass(obj, Recipe)):
            raise InvalidArgument(f"{self.module}:{self.qualname} is not a tp.Recipe subclass")
        return obj

    def build(self, **overrides: Any) -> Recipe[Any]:
        """Construct the recipe anew, with `overrides` replacing constructor keyword arguments."""
        cls = self.recipe_class()  # first: the arguments may hold objects of the recipe's module
        args, kwargs = self._arguments(rebuilding=True)
        try:
            return cls(*args, **{**kwargs, **overrides})
        except TypeError as error:
            if overrides:
                names = ", ".join(f"{k}=" for k in overrides)
                raise InvalidArgument(f"{self.name} could not be built with {names}: {error}") from error
            raise


    def _arguments(self, *, rebuilding: bool = False) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The constructor's arguments. To rebuild the recipe, objects of `__main__` are taken from the module its
        class is loaded from (the script again, under another name, in this process too), so that they are the
        class's own; to name it, from `__main__` where that is the script (nothing is loaded for a name)."""
        script_is_main = module_file(sys.modules.get("__main__")) == self.file
        arguments: tuple[tuple[Any, ...], dict[str, Any]] = (
            _MainUnpickler(io.BytesIO(self.arguments), self).load()
            if self.from_main and (rebuilding or not script_is_main) else pickle.loads(self.arguments))
        return arguments


class _MainUnpickler(pickle.Unpickler):
    """Reads `__main__.<name>` as `<name>` of the recipe's module, loaded as the recipe's class is."""

    def __init__(self, file: io.BytesIO, reference: RecipeRef) -> None:
        super().__init__(file)
        self.reference = reference

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__":
            return attribute(load_module(self.reference.module, self.reference.file), name)
        return super().find_class(module, name)


def resolve_recipe(recipe: object) -> RecipeRef:
    """Validate the `recipe` argument of a check and make it a `RecipeRef`.

    Accepts a Recipe subclass, an instance (its constructor arguments must pickle) or a spec
    string (`package.module:ClassName`, `path/to/file.py:ClassName`, either with literal
    constructor arguments). Misuse raises `InvalidArgument` naming the fix.
    """
    if isinstance(recipe, str):
        spec = parse_spec(recipe)
        obj = load_spec(spec)
        if not (isinstance(obj, type) and issubclass(obj, Recipe)):
            raise InvalidArgument(f"{recipe!r} is not a tp.Recipe subclass (got {type(obj).__name__})")
        if spec.called:
            try:
                obj(*spec.args, **spec.kwargs)
            except (TypeError, ValueError) as error:  # the constructor refused the spec's arguments
                raise InvalidArgument(f"{recipe!r} could not be built: {error}") from None
        return _reference(obj, spec.args, spec.kwargs)
    if isinstance(recipe, type):
        if not issubclass(recipe, Recipe):
            raise InvalidArgument(f"{recipe.__qualname__} is not a tp.Recipe subclass: derive it from tp.Recipe")
        return _reference(recipe, (), {})
    if isinstance(recipe, Recipe):
        args, kwargs = recipe._tp_init_args
        return _reference(type(recipe), args, kwargs)
    raise InvalidArgument(
        "recipe must be a tp.Recipe subclass, an instance of one, or a 'package.module:ClassName' string, "
        f"got {type(recipe).__name__}"
    )


def _reference(cls: type[Recipe[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> RecipeRef:
    if "<locals>" in cls.__qualname__:
        raise InvalidArgument(
            f"recipe {cls.__qualname__} is defined inside a function; define it at module level so a "
            "fresh process can import it"
        )
    try:
        arguments = pickle.dumps((args, kwargs))
    except Exception as error:
        raise InvalidArgument(
            f"the constructor arguments of {cls.__qualname__} must be picklable: every run of a check builds the "
            f"recipe anew from them, in a fresh process or (isolation='inprocess') in this one (a "
            f"lambda or a closure does not pickle: pass a module-level function): {error}"
        ) from error
    module = cls.__module__
    file = module_file(sys.modules.get(module))
    if module == "__main__":
        main = sys.modules["__main__"]
        spec_name = getattr(getattr(main, "__spec__", None), "name", None)
        if spec_name:
            module = spec_name
        elif file is not None:
            module = MAIN_ALIAS  # the script is executed again under another name: its main block stays idle
        else:
            raise InvalidArgument(
                f"recipe {cls.__qualname__} is defined in an interactive session; define it in a module "
                "so a fresh process can import it"
            )
    return RecipeRef(module, cls.__qualname__, file, arguments, from_main=cls.__module__ == "__main__")
