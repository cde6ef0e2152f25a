"""`split_batch`: cut a full batch into micro-batches along dim 0, through nested containers.

A batch is walked through tuples (named tuples included), lists, dicts, `UserDict`s (transformers'
`BatchEncoding`), read-only mapping proxies and dataclass instances. Every torch tensor and numpy array
with at least one dimension is a per-sample leaf and is cut along dim 0 (a nested tensor by its
components, a sparse COO tensor by its rows); all of them must share the same dim-0 size (the
batch size).
Other leaves (0-dim tensors, numbers, strings, None, arbitrary objects) are batch-level
values and are passed unchanged to every micro-batch. A list or tuple of plain Python
scalars as long as the batch is ambiguous (one value per sample, or a batch-level list?),
so it is refused rather than guessed: pass `split=` for such batches.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import UserDict
from collections.abc import Callable, Iterator, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from trainparity._validation import InvalidArgument, check_argument

Microbatches = int | Sequence[int]
_SCALARS = (bool, int, float, complex, str, bytes)


#: the mappings a batch is walked through: those `_rebuild` makes anew without touching the batch (a UserDict's copy
#: has its own items: transformers' BatchEncoding); any other mapping is a leaf, passed on as it is
_MAPPINGS = (dict, UserDict, MappingProxyType)


def _is_container(value: Any) -> bool:
    return isinstance(value, (tuple, list, *_MAPPINGS)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


def _children(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, _MAPPINGS):
        for key, item in value.items():
            yield f"{path}[{key!r}]", item
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield f"{path}[{index}]", item
    else:
        for field in dataclasses.fields(value):
            if field.init:
                yield f"{path}.{field.name}", getattr(value, field.name)


def _rebuild(value: Any, items: list[Any]) -> Any:
    """`value` with its children (in `_children` order) replaced by `items`."""
    if isinstance(value, MappingProxyType):
        return MappingProxyType(dict(zip(value.keys(), items, strict=True)))
    if isinstance(value, (dict, UserDict)):
        keys = list(value.keys())
        out = copy.copy(value)  # keeps dict subclasses (OrderedDict, defaultdict), UserDicts and their extras
        out.clear()
        out.update(zip(keys, items, strict=True))
        return out
    if isinstance(value, tuple):
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list):
        return type(value)(items)
    names = [f.name for f in dataclasses.fields(value) if f.init]
    return dataclasses.replace(value, **dict(zip(names, items, strict=True)))


def leaves(batch: Any, path: str = "batch") -> Iterator[tuple[str, Any]]:
    """Every leaf of `batch` with its accessor path, e.g. `batch['input_ids']`, `batch[0].mask`."""
    if _is_container(batch):
        for child_path, child in _children(batch, path):
            yield from leaves(child, child_path)
    else:
        yield path, batch


def map_leaves(batch: Any, function: Callable[[Any], Any]) -> Any:
    """`batch` rebuilt with `function` applied to every leaf (containers keep their type)."""
    if _is_container(batch):
        return _rebuild(batch, [map_leaves(child, function) for _, child in _children(batch, "")])
    return function(batch)


def _is_per_sample(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 1


#: tensor layouts `split_batch` cuts along dim 0 (strided ones, nested ones too, by `torch.split`)
_CUT_LAYOUTS = (torch.strided, torch.jagged, torch.sparse_coo)


def _cut(tensor: torch.Tensor, sizes: list[int], offsets: list[int]) -> list[torch.Tensor]:
    """`tensor` cut along dim 0 into parts of `sizes` (views where torch makes them)."""
    if tensor.is_nested:  # torch.split refuses dim 0 of a nested tensor: its components, regrouped
        components = tensor.unbind()
        return [torch.nested.as_nested_tensor(list(components[start:start + size]), layout=tensor.layout)
                for start, size in zip([0, *offsets], sizes, strict=True)]
    if tensor.layout == torch.sparse_coo:
        return [tensor.narrow_copy(0, start, size) for start, size in zip([0, *offsets], sizes, strict=True)]
    return list(torch.split(tensor, sizes, dim=0))


def batch_size(batch: Any) -> int:
    """The dim-0 size shared by every tensor and array in `batch`; ValueError when there is none."""
    found: tuple[str, int] | None = None
    for path, leaf in leaves(batch):
        if not _is_per_sample(leaf):
            continue
        if isinstance(leaf, torch.Tensor) and leaf.layout not in _CUT_LAYOUTS:
            raise ValueError(f"cannot split the batch: {path} is a {leaf.layout} tensor, which torch cannot cut "
                             "along dim 0; pass split= to cut it yourself")
        rows = int(leaf.size(0) if isinstance(leaf, torch.Tensor) else leaf.shape[0])  # a nested tensor has no shape
        if found is None:
            found = (path, rows)
        elif rows != found[1]:
            raise ValueError(
                f"cannot split the batch: {found[0]} has {found[1]} rows along dim 0 but {path} has "
                f"{rows}; pass split= to cut it yourself"
            )
    if found is None:
        raise ValueError(
            f"cannot split the batch ({type(batch).__name__}): it holds no tensor or array with a batch "
            "dimension; pass split= to cut it yourself"
        )
    return found[1]


def _check_ambiguous(batch: Any, size: int, path: str = "batch") -> None:
    if not _is_container(batch):
        return
    if (
        isinstance(batch, (list, tuple))
        and len(batch) == size
        and batch
        and all(isinstance(item, _SCALARS) for item in batch)
    ):
        raise ValueError(
            f"cannot split the batch: {path} is a {type(batch).__name__} of {size} plain values, as many as "
            "the batch has samples; make it a tensor or pass split= (split_batch never guesses whether a "
            "list holds one value per sample)"
        )
    for child_path, child in _children(batch, path):
        _check_ambiguous(child, size, child_path)


def microbatch_sizes(total: int, microbatches: Microbatches) -> list[int]:
    """The micro-batch sizes for a batch of `total` samples: k equal parts, or the declared sizes."""
    if isinstance(microbatches, int):
        if total < microbatches:
            raise ValueError(
                f"a batch of {total} samples cannot be cut into {microbatches} micro-batches; use a larger batch "
                "or fewer micro-batches"
            )
        if total % microbatches:
            raise ValueError(
                f"a batch of {total} samples does not split into {microbatches} equal micro-batches; "
                f"declare the sizes, e.g. microbatches={_suggest(total, microbatches)}, or use a batch size "
                f"divisible by {microbatches}"
            )
        return [total // microbatches] * microbatches
    sizes = list(microbatches)
    if sum(sizes) != total:
        raise ValueError(
            f"microbatches={tuple(sizes)} adds up to {sum(sizes)} samples but the batch has {total}; "
            "the declared sizes must add up to the batch size"
        )
    return sizes


def _suggest(total: int, k: int) -> tuple[int, ...]:
    base, extra = divmod(total, k)
    return tuple(base + 1 if index < extra else base for index in range(k))


def validate_microbatches(microbatches: object) -> Microbatches:
    """An int k >= 2, or a sequence of at least two positive sizes (returned as a tuple)."""
    if isinstance(microbatches, bool):
        raise InvalidArgument("microbatches= must be an int or a sequence of micro-batch sizes, got a bool")
    if isinstance(microbatches, int):
        check_argument(microbatches >= 2, f"microbatches= must be at least 2, got {microbatches}: with one "
                       "micro-batch the candidate is the reference itself")
        return microbatches
    if isinstance(microbatches, (str, bytes)) or not isinstance(microbatches, Sequence):
        raise InvalidArgument(
            "microbatches= must be an int (equal split) or a sequence of sizes such as (3, 3, 2), "
            f"got {type(microbatches).__name__}"
        )
    sizes = tuple(microbatches)
    check_argument(len(sizes) >= 2, f"microbatches= must declare at least 2 micro-batch sizes, got {sizes}")
    check_argument(all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in sizes),
                   f"micro-batch sizes must be ints >= 1, got {sizes}")
    return sizes


def split_batch(batch: Any, microbatches: Microbatches) -> list[Any]:
    """Cut `batch` into micro-batches along dim 0 of every tensor and array it holds.

    `microbatches` is an int k (k equal parts; the batch size must be divisible by k) or a
    sequence of sizes such as (3, 3, 2) that must add up to the batch size. Containers
    (tuples, named tuples, lists, dicts, UserDicts, mapping proxies, dataclasses) keep their type; batch-level
    leaves (0-dim tensors, numbers, strings, None) are shared by every micro-batch. Tensor parts
    are views of the batch, as with `torch.split` (copies for nested and sparse COO tensors). Raises
    ValueError when the batch cannot be cut as declared (a sparse CSR tensor: pass split=).
    """
    microbatches = validate_microbatches(microbatches)
    total = batch_size(batch)
    _check_ambiguous(batch, total)
    sizes = microbatch_sizes(total, microbatches)
    offsets = np.cumsum(sizes)[:-1].tolist()
    k = len(sizes)

    def parts(value: Any) -> list[Any]:
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            return _cut(value, sizes, offsets)
        if isinstance(value, np.ndarray) and value.ndim >= 1:
            return list(np.split(value, offsets, axis=0))
        if _is_container(value):
            columns = [parts(child) for _, child in _children(value, "")]
            return [_rebuild(value, [column[j] for column in columns]) for j in range(k)]
        return [value] * k

    return parts(batch)
