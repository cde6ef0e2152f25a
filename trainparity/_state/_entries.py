"""`State` and the one walk over its entries.

One walk serves snapshots (`_snapshot.py`) and the reference checkpoint
(`save_state`/`load_state`): `entry_components` says, for each State entry, which of its
parts carry state (a `state_dict()`, plain public module attributes, generators,
tensors, scalars), so that what is saved is exactly what is compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import nn

from trainparity._state._containers import container_values, is_container, is_dataclass_instance
from trainparity._state._rng import stream_kind
from trainparity._validation import check_argument

T = TypeVar("T")
SCALARS = (bool, int, float, str, type(None))
#: attributes of loaders and samplers that hold the data itself (a list is a dataset too)
DATA_ATTRIBUTES = frozenset({"dataset", "data_source"})


class State:
    """An attribute container for a run's stateful objects: `tp.State(model=..., optimizer=...)`.

    Entries are plain attributes (`state.model`, `state.global_step += 1`); `list(state)`
    gives their names in insertion order and `state["model"]` also works. There are no
    public methods, so any name can be an entry. For type checkers, a subclass annotates its
    entries (`class MyState(tp.State): model: nn.Linear`) and `tp.Recipe[MyState]` uses it.
    """

    def __init__(self, **entries: Any) -> None:
        for name, value in entries.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        check_argument(not name.startswith("_"), f"State entry names must not start with '_': {name!r}")
        object.__setattr__(self, name, value)

    def __iter__(self) -> Iterator[str]:
        return iter(list(vars(self)))

    def __len__(self) -> int:
        return len(vars(self))

    def __contains__(self, name: object) -> bool:
        return name in vars(self)

    def __getitem__(self, name: str) -> Any:
        try:
            return vars(self)[name]
        except KeyError:
            raise KeyError(f"State has no entry {name!r}; it has {sorted(vars(self))}") from None

    def __getattr__(self, name: str) -> Any:
        # Only reached for missing entries; also tells type checkers that entries are dynamic.
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"State has no entry {name!r}; it has {sorted(vars(self))}")

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={type(value).__name__}" for name, value in vars(self).items())
        return f"{type(self).__name__}({inner})"


# -- the walk over State entries -------------------------------------------------------------------


def is_leaf(value: Any) -> bool:
    """Values a snapshot keeps as they are (after copying tensors)."""
    return isinstance(value, (*SCALARS, torch.Tensor, np.ndarray, np.generic, torch.Generator))


def is_plain(value: Any, enclosing: frozenset[int] = frozenset()) -> bool:
    """Leaves and containers of leaves (any keys; a container may hold itself): what a plain attribute may
    hold to be state."""
    if is_container(value) and not is_dataclass_instance(value):  # a dataclass held by a module is configuration
        if id(value) in enclosing:
            return True  # a back-reference: the snapshot shows it as such
        inside = enclosing | {id(value)}
        return all(is_plain(v, inside) for v in container_values(value))
    return is_leaf(value) and not isinstance(value, torch.Generator)


def plain_dataclass(value: Any) -> bool:
    """A dataclass instance of plain fields: state where the State holds it (a module's config dataclass, such as a
    transformers model's, is configuration: not among a module's plain attributes)."""
    return is_dataclass_instance(value) and all(is_plain(item) for item in container_values(value))


def is_stream(value: Any) -> bool:
    """A random stream object: torch's, numpy's (`Generator`, `RandomState`) or Python's `random.Random`."""
    return stream_kind(value) is not None


def module_modes(state: State) -> dict[str, str]:
    """`<entry>.training` -> the mode of each module of the State: "train", "eval", or "train, eval: <the
    submodules in eval>" (and the reverse). Not state a checkpoint holds: what a run trains in."""
    modes = {}
    for entry, module in state_objects(state, nn.Module):
        named = list(unwrap_module(module).named_modules())
        evaluating = [name or "(the module)" for name, sub in named if not sub.training]
        if not evaluating or len(evaluating) == len(named):
            modes[f"{entry}.training"] = "eval" if evaluating else "train"
        elif named[0][1].training:
            modes[f"{entry}.training"] = f"train, eval: {', '.join(evaluating)}"
        else:
            training = [name for name, sub in named if sub.training]
            modes[f"{entry}.training"] = f"eval, train: {', '.join(training)}"
    return modes


def module_plain_attributes(module: nn.Module) -> dict[str, Any]:
    """Public attributes of a module and its submodules that its state_dict does not hold.

    `model.temperature = 0.5`, a step counter on the module, a cached tensor that is not a
    buffer: state that `load_state_dict` silently leaves behind.
    """
    found: dict[str, Any] = {}
    for prefix, sub in module.named_modules():
        for name, value in vars(sub).items():
            if name.startswith("_") or name == "training" or not is_plain(value):
                continue
            found[f"{prefix}.{name}" if prefix else name] = value
    return found


def object_attributes(obj: Any) -> dict[str, Any]:
    """Public state of an object without `state_dict()`: plain values and generators.

    Datasets are data, not state, and are skipped; nested objects are walked one level
    at a time by the caller (with a visited set, so a loader's sampler is seen once).
    """
    try:
        attributes = dict(vars(obj))
    except Exception:  # noqa: BLE001 - no __dict__, or one that raises: nothing to observe
        return {}
    found: dict[str, Any] = {}
    for name, value in attributes.items():
        if name.startswith("_") or callable(value) and not isinstance(value, (nn.Module, torch.Generator)):
            continue
        if isinstance(value, torch.utils.data.Dataset) or name in DATA_ATTRIBUTES:
            continue
        found[name] = value
    return found


def has_state_dict(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


#: wrappers whose `.module` is the model: paths name the model's own parameters (`fc.weight`, not
#: `module.fc.weight`), the same in every check and every world size (and `is_compiled`'s, by `_orig_mod`)
WRAPPERS: tuple[type[nn.Module], ...] = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def is_compiled(module: object) -> bool:
    """`torch.compile(model)`'s wrapper (an `OptimizedModule`, told by its name: torch._dynamo is not imported for
    it), whose `_orig_mod` is the model."""
    return type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module)


def unwrap_module(module: nn.Module) -> nn.Module:
    """The model inside DataParallel/DistributedDataParallel and torch.compile wrappers: paths never carry their
    `module.` or `_orig_mod.` prefix."""
    while isinstance(module, WRAPPERS) or is_compiled(module):
        module = cast(nn.Module, module._orig_mod if is_compiled(module) else module.module)
    return module


def module_prefixes(state: State) -> list[tuple[str, str, nn.Module]]:
    """(entry, prefix, module) for each module of the State, wrappers looked through: the prefix of the names of
    what it holds is empty for the one module that owns parameters, when only one does, and `<entry>.` otherwise
    (the rule `parameter_names` names parameters by, so that parameters, buffers and modules share one vocabulary)."""
    modules = [(path, unwrap_module(m)) for path, m in state_objects(state, nn.Module)]
    owners = [path for path, m in modules if any(True for _ in m.parameters())]
    return [(path, "" if owners == [path] else f"{path}.", module) for path, module in modules]


def parameter_names(state: State) -> dict[int, str]:
    """id(parameter) -> name, so optimizer state can be keyed by name instead of position.

    Names carry no prefix when one module in the State owns parameters (`fc.weight`), and
    the entry name otherwise (`student.fc.weight`). Wrappers are looked through.
    """
    names: dict[int, str] = {}
    for _, prefix, module in module_prefixes(state):
        for pname, parameter in module.named_parameters():
            names.setdefault(id(parameter), prefix + pname)
    return names


def buffer_names(state: State) -> dict[int, str]:
    """id(buffer) -> name, by the rule of `parameter_names` (`bn.running_mean`, `student.bn.running_mean`)."""
    names: dict[int, str] = {}
    for _, prefix, module in module_prefixes(state):
        for bname, buffer in module.named_buffers():
            names.setdefault(id(buffer), prefix + bname)
    return names


def named_state_modules(state: State) -> list[tuple[str, nn.Module]]:
    """Every module of the State once (one reachable from two entries, or twice in one, under its first name), named
    by the rule of `parameter_names` (`encoder.0`); a module entry itself is named by its entry (`model`)."""
    found: dict[int, tuple[str, nn.Module]] = {}
    for entry, prefix, module in module_prefixes(state):
        for sub_name, sub in module.named_modules():
            found.setdefault(id(sub), (prefix + sub_name if sub_name else entry, sub))
    return list(found.values())


def module_names(state: State) -> dict[int, str]:
    """id(module) -> name, as `named_state_modules` names it."""
    return {id(module): name for name, module in named_state_modules(state)}


def state_parameters(state: State, *, lazy: bool = False) -> dict[int, tuple[str, torch.Tensor]]:
    """id -> (name, parameter): the modules' parameters, named as everywhere (`parameter_names`), then the
    tensor entries that are `nn.Parameter`s or require grad, named by their entry. A lazy module's parameters
    count once its first forward gave them values (before, with `lazy=True`)."""
    names = parameter_names(state)
    found: dict[int, tuple[str, torch.Tensor]] = {}
    for _, module in state_objects(state, nn.Module):
        for parameter in unwrap_module(module).parameters():
            found.setdefault(id(parameter), (names[id(parameter)], parameter))
    for path, tensor in state_objects(state, torch.Tensor):
        if isinstance(tensor, nn.Parameter) or tensor.requires_grad:
            found.setdefault(id(tensor), (path, tensor))
    return {key: found[key] for key in found
            if lazy or not isinstance(found[key][1], nn.parameter.UninitializedParameter)}


def state_objects(state: State, kind: type[T]) -> Iterator[tuple[str, T]]:
    """The State's objects of type `kind` (modules, optimizers...) with their paths, including
    those in a list or dict entry (`models.0`, `optimizers.generator`)."""
    for name in state:
        value = state[name]
        if isinstance(value, kind):
            yield name, value
        items: Any = enumerate(value) if isinstance(value, (list, tuple)) else ()
        for key, item in value.items() if isinstance(value, dict) else items:
            if isinstance(item, kind):
                yield f"{name}.{key}", item


def optimizer_named_state_dict(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, Any]:
    """`optimizer.state_dict()` with parameter positions replaced by parameter names."""
    state_dict = optimizer.state_dict()
    position_names: dict[int, str] = {}
    position = 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            position_names[position] = names.get(id(parameter), f"param{position}")
            position += 1
    groups = []
    for group in state_dict["param_groups"]:
        group = dict(group)
        group["params"] = ",".join(position_names.get(p, f"param{p}") for p in group["params"])
        groups.append(group)
    named = {position_names.get(k, f"param{k}"): v for k, v in state_dict["state"].items()}
    return {"state": named, "param_groups": groups}


def entry_components(name: str, value: Any, names: dict[int, str],
                     enclosing: frozenset[int] = frozenset()) -> Iterator[tuple[str, Any]]:
    """The state-carrying parts of one State entry as (path, structured value) pairs.

    The structured values are state dicts, containers and leaves; `_snapshot` flattens
    them into paths, `save_state` stores them. Random streams are yielded as they are. A list
    of models that holds itself is walked once.
    """
    if isinstance(value, torch.optim.Optimizer):
        yield name, optimizer_named_state_dict(value, names)
    elif isinstance(value, nn.Module):
        value = unwrap_module(value)
        yield name, value.state_dict()
        for attribute, attr_value in module_plain_attributes(value).items():
            yield f"{name}.{attribute}", attr_value
    elif has_state_dict(value):
        yield name, value.state_dict()
    elif is_plain(value) or is_stream(value) or plain_dataclass(value):
        yield name, value
    elif isinstance(value, (list, tuple)) and id(value) not in enclosing:  # e.g. a list of models or optimizers
        for index, item in enumerate(value):
            yield from entry_components(f"{name}.{index}", item, names, enclosing | {id(value)})
    elif (isinstance(value, dict) and id(value) not in enclosing
          and all(isinstance(k, str) and "." not in k for k in value)):
        for key, item in value.items():
            yield from entry_components(f"{name}.{key}", item, names, enclosing | {id(value)})
    elif not isinstance(value, (list, tuple, dict)):
        yield from _object_components(name, value, set(), depth=3)


def unobserved_entries(state: State) -> list[str]:
    """The State entries nothing of which can be observed (no state_dict, tensors or plain attributes)."""
    names = parameter_names(state)
    return [f"{name} ({type(state[name]).__name__})" for name in state
            if next(entry_components(name, state[name], names), None) is None]


def _object_components(path: str, obj: Any, seen: set[int], depth: int) -> Iterator[tuple[str, Any]]:
    if id(obj) in seen or depth == 0:
        return
    seen.add(id(obj))
    for attribute, value in object_attributes(obj).items():
        child = f"{path}.{attribute}"
        if has_state_dict(value) and not isinstance(value, nn.Module):
            yield child, value.state_dict()
        elif is_plain(value) or is_stream(value):
            yield child, value
        elif not isinstance(value, nn.Module):
            yield from _object_components(child, value, seen, depth - 1)
