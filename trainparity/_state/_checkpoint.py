"""The reference checkpoint: `tp.save_state` and `tp.load_state`.

They store and restore exactly the components the State walk yields (`_entries.entry_components`),
so what the reference checkpoint saves is what the resume check compares, and every global RNG
stream with them.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from trainparity._compat import dimension_names, named, unnamed
from trainparity._state._compare import bitwise_equal
from trainparity._state._containers import (
    container_kind,
    container_values,
    dataclass_fields,
    is_container,
    is_dataclass_instance,
    reference,
    resolve,
    set_items,
    shown_name,
)
from trainparity._state._entries import (
    State,
    entry_components,
    has_state_dict,
    parameter_names,
    unwrap_module,
)
from trainparity._state._rng import capture_rng, restore_rng, set_stream_state, stream_kind, stream_state
from trainparity._state._tensors import uninitialized

StateT = TypeVar("StateT", bound=State)
#: /2: random streams as {"__stream__": kind, "state": ...}, numpy arrays of every dtype
CHECKPOINT_FORMAT = "trainparity.save_state/2"


def _to_storable(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """Containers of tensors and scalars only, so the file loads with weights_only=True. A container met
    again (shared, or holding itself) is stored once, as pickle keeps references."""
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    kind = stream_kind(value)
    if kind is not None:  # the state is made for this call: its own memo, as its id is free again once it is stored
        return {"__stream__": kind, "state": _to_storable(stream_state(kind, value), {})}
    if uninitialized(value):  # a lazy module's: no values, and torch.load(weights_only=True) refuses it
        return {"__uninitialized__": isinstance(value, nn.Parameter)}
    if isinstance(value, torch.Tensor) and value.is_nested:  # not every torch's weights_only load rebuilds one
        jagged = value.layout == torch.jagged
        return {"__nested__": [part.detach().clone() for part in value.unbind()], "jagged": jagged}
    if isinstance(value, torch.Tensor) and dimension_names(value) is not None:  # torch.save refuses names
        return {"__named__": unnamed(value).detach().clone(), "names": dimension_names(value)}
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return _storable_array(value)
    if isinstance(value, np.generic):
        return value.item()
    if container_kind(value) is not None:
        return _storable_container(value, memo)
    if isinstance(value, dict):
        stored: dict[Any, Any] = memo.setdefault(id(value), {})
        stored.update((k, _to_storable(v, memo)) for k, v in value.items())
        return stored
    if isinstance(value, (tuple, list)):
        items: list[Any] = []
        memo[id(value)] = items if isinstance(value, list) else {"__tuple__": items}
        items.extend(_to_storable(v, memo) for v in value)
        return memo[id(value)]
    return value


def _storable_container(value: Any, memo: dict[int, Any]) -> dict[str, Any]:
    """A container of another kind than dict, list and tuple, with what rebuilds it: its class by reference
    (`_containers.reference`), a deque's maxlen, a defaultdict's factory."""
    stored: dict[str, Any] = {"__container__": reference(type(value)), "kind": container_kind(value)}
    memo[id(value)] = stored
    if isinstance(value, dict):
        stored["items"] = _to_storable(dict(value), memo)
        if isinstance(value, collections.defaultdict) and value.default_factory is not None:
            factory = value.default_factory
            stored["factory"] = {"reference": reference(factory), "name": shown_name(factory)}
    elif isinstance(value, (set, frozenset)):
        stored["items"] = [_to_storable(item, memo) for item in set_items(value)]
    elif is_dataclass_instance(value):
        stored["items"] = {name: _to_storable(item, memo) for name, item in dataclass_fields(value)}
    else:  # a deque, a namedtuple, a list or tuple subclass
        stored["items"] = [_to_storable(item, memo) for item in value]
        if isinstance(value, collections.deque):
            stored["maxlen"] = value.maxlen
    return stored


def _container_from_storable(value: dict[str, Any], memo: dict[int, Any], like: Any) -> Any:
    """Inverse of `_storable_container`; `like` is the fresh State's value at the same place, whose class (and
    defaultdict factory) is taken where the checkpoint's cannot be imported (a class of the user's script)."""
    cls: Any = resolve(value["__container__"], type(like))
    if cls is None and like is not None and container_kind(like) == value["kind"]:
        cls = type(like)  # a class of no importable name (defined in a function): the fresh State's own
    if not isinstance(cls, type):
        raise ValueError(f"tp.load_state() cannot rebuild a {value['kind']} (its class cannot be imported "
                         "and the State that setup() returns holds none in its place): define it at module level")
    stored = value["items"]
    if issubclass(cls, dict):
        items = _from_storable(stored, memo, like)
        if issubclass(cls, collections.defaultdict):
            return cls(_factory(value.get("factory"), like), items)
        return cls(items)
    if issubclass(cls, (set, frozenset)):
        return cls(_from_storable(item, memo) for item in stored)
    if issubclass(cls, collections.deque):
        return cls((_from_storable(item, memo, _item(like, i)) for i, item in enumerate(stored)), value["maxlen"])
    if dataclasses.is_dataclass(cls):
        rebuilt = object.__new__(cls)  # not __init__: a restore, not a construction (frozen and init=False fields)
        for name, item in stored.items():
            object.__setattr__(rebuilt, name, _from_storable(item, memo, getattr(like, name, None)))
        return rebuilt
    items = [_from_storable(item, memo, _item(like, i)) for i, item in enumerate(stored)]
    build: Any = cls
    return build(*items) if issubclass(cls, tuple) and hasattr(cls, "_fields") else build(items)


def _factory(stored: dict[str, str | None] | None, like: Any) -> Any:
    """A defaultdict's factory: imported by reference, else (a lambda, a local function) the fresh State's one of
    the same name."""
    if stored is None:
        return None
    own = like.default_factory if isinstance(like, collections.defaultdict) else None
    factory = resolve(stored["reference"], own)
    if factory is None and own is not None and shown_name(own) == stored["name"]:
        factory = own
    if not callable(factory):
        raise ValueError(f"tp.load_state() cannot rebuild a defaultdict({stored['name']}): its factory cannot be "
                         "imported and the State that setup() returns holds no defaultdict with it in its place")
    return factory


def _item(container: Any, index: Any) -> Any:
    """The item at `index` of the fresh State's counterpart, where it has one."""
    try:
        return container[index]
    except (TypeError, IndexError, KeyError):
        return None


def _storable_array(array: np.ndarray[Any, Any]) -> dict[str, Any]:
    """An array as a tensor of its values (in this machine's byte order), or of its bytes for a dtype torch lacks
    (strings, datetimes, records, float128); an array holding Python objects as the list of its items."""
    descr = np.lib.format.dtype_to_descr(array.dtype)
    if array.dtype.hasobject:  # the list is made for this call: its own memo, as its id is free again afterwards
        return {"__ndarray_objects__": _to_storable(array.ravel().tolist(), {}), "dtype": descr,
                "shape": list(array.shape)}
    try:
        native = array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
        return {"__ndarray__": torch.from_numpy(native.copy()), "dtype": str(array.dtype)}
    except TypeError:  # "can't convert np.ndarray of type numpy.str_"
        data = torch.frombuffer(bytearray(array.tobytes()), dtype=torch.uint8) if array.nbytes else torch.empty(0)
        return {"__ndarray_bytes__": data, "dtype": descr, "shape": list(array.shape)}


def _array_from_storable(value: dict[str, Any], memo: dict[int, Any]) -> np.ndarray[Any, Any]:
    if "__ndarray__" in value:
        return value["__ndarray__"].numpy().astype(value["dtype"])  # type: ignore[no-any-return]
    if "__ndarray_bytes__" in value:
        dtype = np.lib.format.descr_to_dtype(value["dtype"])
        if not dtype.itemsize:  # '<U0': no bytes to read
            return np.empty(value["shape"], dtype)
        return np.frombuffer(value["__ndarray_bytes__"].numpy().tobytes(), dtype).reshape(value["shape"])
    items = _from_storable(value["__ndarray_objects__"], memo)
    dtype = np.lib.format.descr_to_dtype(value["dtype"])
    if dtype.fields:  # records with an object field: each item is a record's tuple
        return np.array(items, dtype=dtype).reshape(value["shape"])
    array = np.empty(len(items), dtype=object)
    for index, item in enumerate(items):  # one by one: numpy would make an item that is a list a dimension
        array[index] = item
    return array.reshape(value["shape"])


def _from_storable(value: Any, memo: dict[int, Any] | None = None, like: Any = None) -> Any:
    """What `_to_storable` stored, rebuilt; `like` is the fresh State's value at the same place, or None."""
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, dict):
        if "__container__" in value:
            rebuilt = memo[id(value)] = _container_from_storable(value, memo, like)
            return rebuilt
        if "__tuple__" in value and len(value) == 1:
            return tuple(_from_storable(v, memo, _item(like, i)) for i, v in enumerate(value["__tuple__"]))
        if value.keys() & {"__ndarray__", "__ndarray_bytes__", "__ndarray_objects__"}:
            return _array_from_storable(value, memo)
        if "__named__" in value:
            return named(value["__named__"], value["names"])
        if "__nested__" in value:
            layout = torch.jagged if value["jagged"] else torch.strided
            return torch.nested.nested_tensor(value["__nested__"], layout=layout)
        if "__uninitialized__" in value and len(value) == 1:
            parameter = value["__uninitialized__"]
            return nn.parameter.UninitializedParameter() if parameter else nn.parameter.UninitializedBuffer()
        restored: dict[Any, Any] = memo.setdefault(id(value), {})
        restored.update((k, _from_storable(v, memo, _item(like, k))) for k, v in value.items())
        return restored
    if isinstance(value, list):
        items: list[Any] = memo.setdefault(id(value), [])
        items.extend(_from_storable(v, memo, _item(like, i)) for i, v in enumerate(value))
        return items
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
    written = document.get("format") if isinstance(document, dict) else None
    if isinstance(written, str) and written.startswith("trainparity.save_state/") and written != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} was written by another version of tp.save_state() (format {written!r}; this one "
                         f"reads {CHECKPOINT_FORMAT!r}): save it again with this version")
    if written != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} was not written by tp.save_state()")
    components: dict[str, Any] = document["components"]
    names = parameter_names(state)
    current = {p: v for name in state for p, v in entry_components(name, state[name], names)}
    missing = sorted(current.keys() - components.keys())
    if missing:
        raise ValueError(f"the checkpoint has no component {missing[0]!r}; was it saved from this recipe?")
    for path_, saved in components.items():
        if path_ in current:
            _restore_component(state, path_, current[path_], _from_storable(saved, like=current[path_]), names)
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
        if isinstance(target, nn.Module):
            _materialize_overlapping_buffers(target)
        target.load_state_dict(saved)
    elif stream_kind(target) is not None:
        set_stream_state(saved["__stream__"], target, saved["state"])
    elif isinstance(target, torch.Tensor) and isinstance(saved, torch.Tensor) and _copyable(target, saved):
        with torch.no_grad():
            target.copy_(saved)
    elif isinstance(owner, list):
        owner[int(target_name)] = saved
    elif isinstance(owner, dict):
        owner[target_name] = saved
    elif isinstance(owner, (nn.Module, State)) or not plain_equal(current, saved):
        # Other objects get only what changed: a DataLoader refuses any set of batch_size.
        setattr(owner, target_name, saved)


def _copyable(target: torch.Tensor, saved: torch.Tensor) -> bool:
    """Whether `saved` can be copied into `target` in place (kept, for references held elsewhere); a nested,
    sparse or quantized tensor, and one whose elements share memory (expanded), is replaced instead."""
    shaped = not uninitialized(target) and not uninitialized(saved)
    return (shaped and target.layout == saved.layout == torch.strided and not target.is_nested
            and not saved.is_nested and not target.is_quantized and target.shape == saved.shape
            and not overlaps_itself(target))


def overlaps_itself(tensor: torch.Tensor) -> bool:
    """Whether two elements of a strided tensor may share memory (an expanded tensor's stride 0, an
    `as_strided` view): torch refuses to write into one. Sufficient test: sorted by stride, each dimension
    steps past everything the smaller ones reach."""
    reach = 1
    for stride, size in sorted((stride, size) for stride, size in zip(tensor.stride(), tensor.shape, strict=True)
                               if size > 1):
        if stride < reach:
            return True
        reach += stride * (size - 1)
    return False


def _materialize_overlapping_buffers(module: nn.Module) -> None:
    """A module's buffers whose elements share memory (a broadcast mask registered expanded) become tensors of
    their own, which `load_state_dict` can copy into: it writes in place, and torch refuses such a write."""
    for sub in module.modules():
        for name, buffer in sub.named_buffers(recurse=False):
            if buffer is not None and buffer.layout == torch.strided and overlaps_itself(buffer):
                sub.register_buffer(name, buffer.clone(memory_format=torch.contiguous_format),
                                    persistent=name not in sub._non_persistent_buffers_set)


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


def plain_equal(a: Any, b: Any, compared: frozenset[tuple[int, int]] = frozenset()) -> bool:
    """Equality for plain values that also holds for tensors and arrays inside containers (which may hold
    themselves)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and bitwise_equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if (id(a), id(b)) in compared:
        return True  # being compared further up: equal unless something else differs
    inside = compared | {(id(a), id(b))}
    if is_container(a) or is_container(b):
        if not (is_container(a) and is_container(b)) or container_kind(a) != container_kind(b):
            return False
        if isinstance(a, (set, frozenset)):
            return bool(a == b)  # hashable items: no tensors
        if isinstance(a, dict) and (not isinstance(b, dict) or a.keys() != b.keys()):
            return False
        items_a, items_b = container_values(a), container_values(b)
        return len(items_a) == len(items_b) and all(plain_equal(x, y, inside) for x, y in zip(items_a, items_b,
                                                                                              strict=True))
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
