"""`Recipe`: the user's training semantics, and `RecipeRef`: how a recipe travels to a fresh process.

A recipe is rebuilt in every run, so what travels is a reference to its class (module,
the module's file and qualified name) plus its constructor arguments, never the live object.
Specs (`package.module:Class`, `path/to/file.py:Class`, with literal constructor arguments
`module:Class(k=1, name="x")`) are parsed here without executing anything but the module.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import importlib.util
import pathlib
import pickle
import sys
from collections.abc import Iterable, Iterator, Sequence
from types import ModuleType
from typing import Any, Generic, Self, TypeAlias

import torch
from typing_extensions import TypeVar

from trainparity._process import _session
from trainparity._state._entries import State, load_state, save_state


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


#: the State type of a recipe: `tp.Recipe[MyState]` types `setup`, `step`, `batches`, `save` and `load`
S = TypeVar("S", bound=State, default=State)


class Recipe(Generic[S]):
    """Subclass this to state your training semantics (see docs/api.md).

    The constructor takes configuration only (picklable values): the harness rebuilds the
    recipe in fresh processes from its class and these arguments. `tp.Recipe[MyState]`,
    with `MyState` a `tp.State` subclass that annotates its entries, types the state that
    `setup` returns and the other methods receive.
    """

    _tp_init_args: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        self = super().__new__(cls)
        self._tp_init_args = (args, kwargs)
        return self

    def setup(self) -> S:
        """Build everything from scratch; the harness has seeded torch, numpy and random."""
        raise NotImplementedError(f"{type(self).__name__} must define setup(self) -> tp.State")

    def batches(self, state: S) -> Iterable[Any]:
        """The batches to train on; by default `state.loader`, epoch after epoch.

        A sampler with `set_epoch` (DistributedSampler, also behind a batch sampler) is told each
        epoch's number.
        """
        if "loader" not in state:
            raise NotImplementedError(
                f"{type(self).__name__} has no State entry 'loader': define batches(self, state)"
            )
        return _epochs(state.loader)

    def step(self, state: S, batch: Any) -> torch.Tensor | float | LossAccounting:
        """Train on one batch and return its loss."""
        raise NotImplementedError(f"{type(self).__name__} must define step(self, state, batch)")

    def sample_ids(self, batch: Any) -> Sequence[int | str] | torch.Tensor | None:
        """The IDs of the samples in `batch`; None (the default) leaves the data stream unchecked."""
        return None

    def save(self, state: S, path: pathlib.Path) -> None:
        """Your checkpoint code; by default `tp.save_state`, one file per rank in a world of ranks."""
        save_state(state, _rank_file(path))

    def load(self, path: pathlib.Path) -> S:
        """Your resume code; by default `setup()` then `tp.load_state` (in a world of ranks, the rank's own file)."""
        return load_state(self.setup(), _rank_file(path))


def _rank_file(path: pathlib.Path) -> pathlib.Path:
    """The default checkpoint's file: `path`, or `path.rank<r>` in an initialized world of several ranks (whose
    ranks each hold their own loader position and RNG state)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return path.with_name(f"{path.name}.rank{dist.get_rank()}")
    return path


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


@contextlib.contextmanager
def batch_iterator(recipe: Recipe[Any], state: State) -> Iterator[Iterator[Any]]:
    """`iter(recipe.batches(state))`, closed on exit: a generator over a DataLoader stops its workers now,
    not at garbage collection."""
    batches = iter(recipe.batches(state))
    try:
        yield batches
    finally:
        close = getattr(batches, "close", None)
        if callable(close):
            close()


#: what a check's `recipe` argument may be: a Recipe subclass, an instance of one, or a spec string
RecipeSpec: TypeAlias = type[Recipe[Any]] | Recipe[Any] | str
#: module names under which files that cannot be imported by name are loaded (a script run as __main__,
#: a `path/to/file.py:Class` spec); reports show the file's stem instead
ALIAS_PREFIX = "__trainparity_"
MAIN_ALIAS = "__trainparity_main__"


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

    @property
    def name(self) -> str:
        """`module:Class`, with the constructor arguments when there are any: `m:Recipe(fault='ema')`."""
        module = pathlib.Path(self.file).stem if self.file and self.module.startswith(ALIAS_PREFIX) else self.module
        args, kwargs = pickle.loads(self.arguments)
        shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        return f"{module}:{self.qualname}" + (f"({', '.join(shown)})" if shown else "")

    def recipe_class(self) -> type[Recipe[Any]]:
        obj = attribute(load_module(self.module, self.file), self.qualname)
        if not (isinstance(obj, type) and issubclass(obj, Recipe)):
            raise TypeError(f"{self.module}:{self.qualname} is not a tp.Recipe subclass")
        return obj

    def build(self, **overrides: Any) -> Recipe[Any]:
        """Construct the recipe anew, with `overrides` replacing constructor keyword arguments."""
        cls = self.recipe_class()  # first: the arguments may hold objects of the recipe's module
        args, kwargs = pickle.loads(self.arguments)
        try:
            return cls(*args, **{**kwargs, **overrides})
        except TypeError as error:
            if overrides:
                names = ", ".join(f"{k}=" for k in overrides)
                raise TypeError(f"{self.name} could not be built with {names}: {error}") from error
            raise


def attribute(module: ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def import_module(name: str) -> ModuleType:
    # The import statement's machinery, unlike importlib.import_module, drops importlib's own frames from the
    # traceback of an error raised while the module executes: the report shows the user's frames only.
    if name not in sys.modules:  # (a module already imported may have no importable parent package)
        __import__(name)
    return sys.modules[name]


def import_attribute(module_name: str, qualname: str) -> Any:
    return attribute(import_module(module_name), qualname)


def _origin(name: str) -> str | None:
    """The file that importing `name` would execute, or None when the name does not import."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None or spec.origin is None else str(pathlib.Path(spec.origin).resolve())


def load_module(name: str, file: str | None) -> ModuleType:
    """The module `name`: imported by name, or, where that name does not import `file`, executed from `file`
    under that name (as pytest's --import-mode=importlib does with test modules)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    with _session.importing(name):
        if file is None or _origin(name) == file:
            return import_module(name)
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load module {name!r} from {file}", name=name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


# -- specs: `package.module:Class`, `path/to/file.py:Class`, `module:Class(k=1, name="x")` ----------


class SpecError(ValueError):
    """A spec that cannot be parsed, or names a module, file or attribute that does not exist."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """A parsed spec: where to find an object (a module name or a .py file), its name, literal call arguments."""

    text: str
    source: str
    qualname: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def called(self) -> bool:
        return bool(self.args or self.kwargs)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise SpecError(
            f"argument {ast.unparse(node)} in {text!r} is not a literal (numbers, strings, bytes, True, False, "
            "None, and tuples, lists, dicts and sets of them)"
        ) from None


def parse_spec(text: str, shape: str = "package.module:ClassName") -> Spec:
    """Parse `source:Name`, `source:Name(literal, key=literal, ...)`; nothing is evaluated but literals."""
    source, sep, target = text.partition(":")
    usage = f"a spec looks like '{shape}', 'path/to/file.py:{shape.partition(':')[2]}' or '{shape}(key=1, name=\"x\")'"
    if not sep or not source.strip() or not target.strip():
        raise SpecError(f"{usage}, got {text!r}")
    try:
        expression = ast.parse(target.strip(), mode="eval").body
    except SyntaxError:
        raise SpecError(f"{usage}, got {text!r}") from None
    call = expression if isinstance(expression, ast.Call) else None
    qualname = _dotted(call.func if call is not None else expression)
    if qualname is None:
        raise SpecError(f"{usage}, got {text!r}")
    if call is None:
        return Spec(text, source.strip(), qualname)
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        raise SpecError(f"*args and **kwargs are not literals: spell the arguments out in {text!r}")
    args = tuple(_literal(arg, text) for arg in call.args)
    kwargs = {kw.arg: _literal(kw.value, text) for kw in call.keywords if kw.arg is not None}
    return Spec(text, source.strip(), qualname, args, kwargs)


def _is_path(source: str) -> bool:
    return source.endswith(".py") or "/" in source


def load_spec(spec: Spec) -> Any:
    """The object a spec names. A module or file that cannot be found, or a missing name, is a SpecError;
    whatever the module raises while it is executed propagates."""
    if _is_path(spec.source):
        path = pathlib.Path(spec.source).resolve()
        if not path.is_file():
            raise SpecError(f"no such file {spec.source!r} for {spec.text!r}")
        name = path.stem
        if _origin(name) != str(path):  # not importable by name: a name of its own, unique per file
            name = f"{ALIAS_PREFIX}file_{name}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        module = load_module(name, str(path))
    else:
        try:
            module = import_module(spec.source)
        except ModuleNotFoundError as error:
            if error.name is None or not (spec.source + ".").startswith(error.name + "."):
                raise  # the module itself imports something missing: its own error
            raise SpecError(f"cannot import module {spec.source!r} for {spec.text!r}: {error}") from error
    try:
        return attribute(module, spec.qualname)
    except AttributeError:
        raise SpecError(f"module {spec.source!r} has no attribute {spec.qualname!r}") from None


def resolve_recipe(recipe: object) -> RecipeRef:
    """Validate the `recipe` argument of a check and make it a `RecipeRef`.

    Accepts a Recipe subclass, an instance (its constructor arguments must pickle) or a spec
    string (`package.module:ClassName`, `path/to/file.py:ClassName`, either with literal
    constructor arguments). Misuse raises TypeError/ValueError naming the fix.
    """
    if isinstance(recipe, str):
        spec = parse_spec(recipe)
        obj = load_spec(spec)
        if not (isinstance(obj, type) and issubclass(obj, Recipe)):
            raise TypeError(f"{recipe!r} is not a tp.Recipe subclass (got {type(obj).__name__})")
        if spec.called:
            try:
                obj(*spec.args, **spec.kwargs)
            except TypeError as error:
                raise TypeError(f"{recipe!r} could not be built: {error}") from None
        return _reference(obj, spec.args, spec.kwargs)
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


def _module_file(module: ModuleType | None) -> str | None:
    file = getattr(module, "__file__", None)
    return str(pathlib.Path(file).resolve()) if isinstance(file, str) and file.endswith(".py") else None


def _reference(cls: type[Recipe[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> RecipeRef:
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
    module = cls.__module__
    file = _module_file(sys.modules.get(module))
    if module == "__main__":
        main = sys.modules["__main__"]
        spec_name = getattr(getattr(main, "__spec__", None), "name", None)
        if spec_name:
            module = spec_name
        elif file is not None:
            module = MAIN_ALIAS  # the script is executed again under another name: its main block stays idle
        else:
            raise TypeError(
                f"recipe {cls.__qualname__} is defined in an interactive session; define it in a module "
                "so a fresh process can import it"
            )
    return RecipeRef(module, cls.__qualname__, file, arguments)
