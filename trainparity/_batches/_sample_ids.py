"""Sample IDs: what a batch's `sample_ids` returned, as a flat int64 or str array, or a TypeError naming where.

Shared by the resume and parallel traces (`normalize_sample_ids`, a list per step) and the
coverage audit (`sample_id_array`, `batch_id_array`, and `plain_int_ids`, the fast path for the
common batch: a 1-d integer tensor or array). Needs numpy and torch only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

SampleIds = list[int | str]
IdArray = np.ndarray[Any, Any]

_INT64_MAX = np.iinfo(np.int64).max
#: integer dtypes whose every value fits int64 (uint64 needs a check)
_PLAIN_TORCH_INTS = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8})
_PLAIN_NUMPY_INTS = frozenset(np.dtype(kind) for kind in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                                          np.uint32))


def read_ids(ids: Any) -> Any:
    """`ids` with a lazy or one-shot iterable (a generator, `map`, a custom iterable) read into a list.

    Reading is the one step of the conversion that runs the user's code; the caller guards it, so
    that what it raises is told apart from the TypeError `sample_id_array` raises for IDs of the
    wrong type. Tensors, arrays, lists, tuples, strings, mappings and scalars are returned as they are.
    """
    if isinstance(ids, (torch.Tensor, np.ndarray, list, tuple, str, bytes, Mapping)) or not hasattr(ids, "__iter__"):
        return ids
    return list(ids)


def normalize_sample_ids(ids: Any, where: str) -> SampleIds | None:
    """Sample IDs as a list of ints or strings; anything else is a TypeError naming the place."""
    if ids is None:
        return None
    ids_list: SampleIds = sample_id_array(ids, where).tolist()
    return ids_list


def plain_int_ids(ids: Any) -> IdArray | None:
    """The fast path for one batch's IDs: a 1-d CPU tensor or numpy array of an integer dtype that fits int64, as
    a numpy array sharing its memory (not converted to int64); None for anything else (take `sample_id_array`).

    It costs a few attribute reads and, for a tensor, `.numpy()`: the per-batch floor of an audit.
    """
    kind = type(ids)
    if kind is torch.Tensor:
        if ids.dtype in _PLAIN_TORCH_INTS and ids.ndim == 1 and ids.is_cpu:
            array: IdArray = ids.numpy()  # integer tensors never require grad: no detach
            return array
    elif kind is np.ndarray and ids.ndim == 1 and ids.dtype in _PLAIN_NUMPY_INTS:
        return ids  # type: ignore[no-any-return]
    return None


def sample_id_array(ids: Any, where: str) -> IdArray:
    """Sample IDs as a flat int64 or str array; anything else is a TypeError naming `where` and the position.

    IDs are ints (Python, numpy, integer tensors) or strings, not both in one batch. Tensors,
    arrays and lists of plain ints or of plain strings are converted without a Python loop.
    """
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"{where}: sample IDs must be integers or strings, got a {ids.dtype} tensor")
        if ids.is_meta:
            raise TypeError(f"{where}: sample IDs must have values, got a tensor on the meta device (it holds none)")
        ids = (ids if ids.is_cpu else ids.cpu()).numpy()  # integer tensors never require grad: no detach
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind in "iu":
            if ids.dtype == np.uint64 and ids.size and int(ids.max()) > _INT64_MAX:
                raise TypeError(f"{where}: sample IDs must fit in int64, got {int(ids.max())}")
            return ids.reshape(-1).astype(np.int64, copy=False)
        if ids.dtype.kind == "U":
            return ids.reshape(-1)
        if ids.dtype.kind != "O":
            raise TypeError(f"{where}: sample IDs must be integers or strings, got an array of {ids.dtype}")
        ids = ids.reshape(-1).tolist()
    if isinstance(ids, Mapping):  # iterating it would take its keys (field names) for IDs
        keys = list(ids)
        example = f"lambda batch: batch[{keys[0]!r}]" if keys else "lambda batch: batch[...]"
        raise TypeError(f"{where}: sample IDs must be a sequence of ints or strings, got a {type(ids).__name__} with "
                        f"keys {keys[:8]}; extract the IDs from the batch with sample_ids, e.g. {example}")
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{where}: sample_ids() must return a sequence of IDs, got {type(ids).__name__}")
    values = ids if isinstance(ids, (list, tuple)) else list(ids)
    kinds = set(map(type, values))
    if kinds <= {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            raise TypeError(f"{where}: sample IDs must fit in int64") from None
    if kinds == {str}:
        return np.array(values, dtype=np.str_)
    return _checked_id_array(values, where)


def _checked_id_array(values: list[Any] | tuple[Any, ...], where: str) -> IdArray:
    """The slow path: numpy integers, 0-d integer tensors, and a precise error for anything else."""
    out: SampleIds = []
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.ndim == 0 and not (
            value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool
        ):
            value = int(value)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, str, np.integer)):
            fields = isinstance(value, (torch.Tensor, np.ndarray, list, tuple, dict))
            raise TypeError(
                f"{where}: sample ID at position {position} is {type(value).__name__} {_shown(value)}; "
                "IDs must be ints or strings"
                + ("; a batch of several fields? extract the IDs with sample_ids, e.g. lambda batch: batch[0]"
                   if fields else "")
            )
        if out and isinstance(value, str) != isinstance(out[0], str):
            raise TypeError(
                f"{where}: sample ID at position {position} is {type(value).__name__} {_shown(value)} but position 0 "
                f"is {type(out[0]).__name__} {out[0]!r}; IDs must be all ints or all strings"
            )
        out.append(value if isinstance(value, str) else int(value))
    return np.array(out, dtype=np.str_ if out and isinstance(out[0], str) else np.int64)


def _shown(value: object) -> str:
    """The value's repr for a message; a repr that raises (the user's class) does not hide the real problem."""
    try:
        return repr(value)
    except Exception:  # noqa: BLE001
        return f"<{type(value).__name__} object>"


def batch_id_array(ids: Any, where: str, *, copy: bool) -> IdArray:
    """One batch's IDs as an int64 or str array; a lone int or string is a batch of one.

    With `copy`, the array never shares memory with `ids`: a pipeline may refill the buffer of
    the batch it yielded before.
    """
    plain = plain_int_ids(ids)
    if plain is not None:
        return plain.astype(np.int64, copy=copy)
    if isinstance(ids, (int, np.integer, str)) and not isinstance(ids, (bool, np.bool_)):
        return np.array([ids], dtype=np.str_ if isinstance(ids, str) else np.int64)
    array = sample_id_array(ids, where)
    return array.copy() if copy and (array is ids or not array.flags.owndata) else array
