"""`State`, the walk over its entries, the RNG streams, and the reference save/load.

One walk serves snapshots (`_snapshot.py`) and the reference checkpoint
(`save_state`/`load_state`): `entry_components` says, for each State entry, which of its
parts carry state (a `state_dict()`, plain public module attributes, generators,
tensors, scalars), so that what is saved is exactly what is compared.
"""

from __future__ import annotations

import hashlib
import pathlib
import random
import struct
from collections.abc import Iterator
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import nn

T = TypeVar("T")
StateT = TypeVar("StateT", bound="State")
CHECKPOINT_FORMAT = "trainparity.save_state/1"
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
        if name.startswith("_"):
            raise ValueError(f"State entry names must not start with '_': {name!r}")
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


# -- RNG streams -----------------------------------------------------------------------------------


#: seeds torch, numpy (modulo 2**32) and Python's random all accept
SEED_LIMIT = 2**63


def validate_seed(seed: object) -> int:
    """The `seed=` of a check, refused at the call rather than blamed on the recipe in a child."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed= must be an int, got {type(seed).__name__}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed= must be in [0, 2**63), got {seed}")
    return seed


def seed_everything(seed: int) -> None:
    """Seed every global stream the harness tracks (torch, numpy, python, cuda)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_fingerprint() -> str:
    """A digest of the global RNG streams as they are now: equal digests, equal streams.

    Cheaper than `capture_rng` (no conversion), for telling whether something drew between two moments.
    """
    digest = hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=16)
    numpy_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    _, keys, pos, has_gauss, cached = numpy_state
    digest.update(keys.tobytes())
    digest.update(repr((pos, has_gauss, cached, random.getstate())).encode())
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for state in torch.cuda.get_rng_state_all():
            digest.update(state.numpy().tobytes())
    return digest.hexdigest()


def _float_bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _bits_float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", bits))[0])


def capture_rng() -> dict[str, torch.Tensor]:
    """The global RNG streams as int64/uint8 tensors (safe for `torch.load(weights_only=True)`)."""
    streams: dict[str, torch.Tensor] = {"torch": torch.get_rng_state()}
    numpy_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    _, keys, pos, has_gauss, cached = numpy_state
    streams["numpy"] = torch.tensor([*keys.tolist(), pos, has_gauss, _float_bits(cached)], dtype=torch.int64)
    version, internal, gauss_next = random.getstate()
    extra = [0, 0] if gauss_next is None else [1, _float_bits(gauss_next)]
    streams["python"] = torch.tensor([version, *internal, *extra], dtype=torch.int64)
    # is_initialized() first: is_available() would initialize the driver, and a process that has
    # (the fork server) cannot fork children that use CUDA.
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        streams["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return streams


def restore_rng(streams: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(streams["torch"])
    values = streams["numpy"].tolist()
    keys = np.array(values[:624], dtype=np.uint32)
    np.random.set_state(("MT19937", keys, values[624], values[625], _bits_float(values[626])))
    values = streams["python"].tolist()
    gauss = None if values[-2] == 0 else _bits_float(values[-1])
    random.setstate((values[0], tuple(values[1:-2]), gauss))
    if "cuda" in streams:
        torch.cuda.set_rng_state_all(list(streams["cuda"]))


# -- the walk over State entries -------------------------------------------------------------------


def is_leaf(value: Any) -> bool:
    """Values a snapshot keeps as they are (after copying tensors)."""
    return isinstance(value, (*SCALARS, torch.Tensor, np.ndarray, np.generic, torch.Generator))


def is_plain(value: Any) -> bool:
    """Leaves and containers of leaves: what a plain attribute may hold to be state."""
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and is_plain(v) for k, v in value.items())
    return is_leaf(value) and not isinstance(value, torch.Generator)


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
#: `module.fc.weight`), the same in every check and every world size
WRAPPERS: tuple[type[nn.Module], ...] = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def unwrap_module(module: nn.Module) -> nn.Module:
    """The model inside DataParallel/DistributedDataParallel wrappers."""
    while isinstance(module, WRAPPERS):
        module = cast(nn.Module, module.module)
    return module


def parameter_names(state: State) -> dict[int, str]:
    """id(parameter) -> name, so optimizer state can be keyed by name instead of position.

    Names carry no prefix when one module in the State owns parameters (`fc.weight`), and
    the entry name otherwise (`student.fc.weight`). Wrappers are looked through.
    """
    owners = [(path, unwrap_module(m)) for path, m in state_objects(state, nn.Module)
              if any(True for _ in m.parameters())]
    names: dict[int, str] = {}
    for entry, module in owners:
        for pname, parameter in module.named_parameters():
            names.setdefault(id(parameter), pname if len(owners) == 1 else f"{entry}.{pname}")
    return names


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


def entry_components(name: str, value: Any, names: dict[int, str]) -> Iterator[tuple[str, Any]]:
    """The state-carrying parts of one State entry as (path, structured value) pairs.

    The structured values are state dicts, containers and leaves; `_snapshot` flattens
    them into paths, `save_state` stores them. Generators are yielded as they are.
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
    elif is_plain(value) or isinstance(value, torch.Generator):
        yield name, value
    elif isinstance(value, (list, tuple)):  # e.g. a list of models or optimizers
        for index, item in enumerate(value):
            yield from entry_components(f"{name}.{index}", item, names)
    elif isinstance(value, dict) and all(isinstance(k, str) and "." not in k for k in value):
        for key, item in value.items():
            yield from entry_components(f"{name}.{key}", item, names)
    else:
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
        elif is_plain(value) or isinstance(value, torch.Generator):
            yield child, value
        elif not isinstance(value, nn.Module):
            yield from _object_components(child, value, seen, depth - 1)


# -- the reference checkpoint ----------------------------------------------------------------------


def _to_storable(value: Any) -> Any:
    """Containers of tensors and scalars only, so the file loads with weights_only=True."""
    if isinstance(value, torch.Generator):
        return {"__generator_state__": value.get_state()}
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return {"__ndarray__": torch.from_numpy(value.copy()), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_storable(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {"__tuple__": [_to_storable(v) for v in value]}
    if isinstance(value, list):
        return [_to_storable(v) for v in value]
    return value


def _from_storable(value: Any) -> Any:
    if isinstance(value, dict):
        if "__tuple__" in value and len(value) == 1:
            return tuple(_from_storable(v) for v in value["__tuple__"])
        if "__ndarray__" in value:
            return value["__ndarray__"].numpy().astype(value["dtype"])
        return {k: _from_storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_storable(v) for v in value]
    return value


def save_state(state: State, path: str | pathlib.Path) -> None:
    """The reference checkpoint: every State entry and every global RNG stream.

    Stored as plain containers of tensors, so `load_state` reads it with
    `torch.load(weights_only=True)`.
    """
    if not isinstance(state, State):
        raise TypeError(f"save_state() takes a tp.State, got {type(state).__name__}")
    names = parameter_names(state)
    components = {}
    for name in state:
        for path_, value in entry_components(name, state[name], names):
            components[path_] = _to_storable(value)
    document = {"format": CHECKPOINT_FORMAT, "components": components, "rng": capture_rng()}
    torch.save(document, pathlib.Path(path))


def load_state(state: StateT, path: str | pathlib.Path) -> StateT:
    """Restore what `save_state` wrote into `state` (in place) and the RNG streams; returns `state`."""
    if not isinstance(state, State):
        raise TypeError(f"load_state() takes a tp.State (e.g. the one setup() returns), got {type(state).__name__}")
    document = torch.load(pathlib.Path(path), weights_only=True)
    if not isinstance(document, dict) or document.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} was not written by tp.save_state()")
    components: dict[str, Any] = document["components"]
    names = parameter_names(state)
    current = {p: v for name in state for p, v in entry_components(name, state[name], names)}
    missing = sorted(current.keys() - components.keys())
    if missing:
        raise ValueError(f"the checkpoint has no component {missing[0]!r}; was it saved from this recipe?")
    for path_, saved in components.items():
        if path_ in current:
            _restore_component(state, path_, current[path_], _from_storable(saved), names)
            continue
        # A module attribute set during training (model.temperature) that a fresh setup() lacks.
        *parents, attribute = path_.split(".")
        owner = _resolve(state, parents)
        if not isinstance(owner, nn.Module):
            raise ValueError(f"the checkpoint has a component {path_!r} that this State does not have")
        setattr(owner, attribute, _from_storable(saved))
    restore_rng(document["rng"])
    return state


def _restore_component(state: State, path: str, current: Any, saved: Any, names: dict[int, str]) -> None:
    *parents, target_name = path.split(".")
    owner = _resolve(state, parents)
    target = _member(owner, target_name)
    if isinstance(target, torch.optim.Optimizer):
        _load_named_optimizer_state(target, saved, names)
    elif has_state_dict(target):
        target.load_state_dict(saved)
    elif isinstance(target, torch.Generator):
        target.set_state(saved["__generator_state__"])
    elif isinstance(target, torch.Tensor) and isinstance(saved, torch.Tensor) and target.shape == saved.shape:
        with torch.no_grad():
            target.copy_(saved)
    elif isinstance(owner, list):
        owner[int(target_name)] = saved
    elif isinstance(owner, dict):
        owner[target_name] = saved
    elif isinstance(owner, (nn.Module, State)) or not plain_equal(current, saved):
        # Other objects get only what changed: a DataLoader refuses any set of batch_size.
        setattr(owner, target_name, saved)


def _resolve(state: State, names: list[str]) -> Any:
    owner: Any = state
    for name in names:
        owner = _member(owner, name)
    return owner


def _member(owner: Any, name: str) -> Any:
    if isinstance(owner, (list, tuple)):
        member = owner[int(name)]
    elif isinstance(owner, dict):
        member = owner[name]
    else:
        member = getattr(owner, name)
    return unwrap_module(member) if isinstance(member, nn.Module) else member


def plain_equal(a: Any, b: Any) -> bool:
    """Equality for plain values that also holds for tensors and arrays inside containers."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(plain_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(plain_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _load_named_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any], names: dict[int, str]) -> None:
    """Inverse of `optimizer_named_state_dict`: map names back to this optimizer's positions."""
    by_name = {}
    position = 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            by_name[names.get(id(parameter), f"param{position}")] = position
            position += 1
    state = {by_name[k]: v for k, v in saved["state"].items()}
    groups = []
    for group in saved["param_groups"]:
        group = dict(group)
        group["params"] = [by_name[n] for n in group["params"].split(",") if n]
        groups.append(group)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
