"""The format in which children hand their output to the parent: JSON plus raw tensor bytes.

It cannot execute code when read (no pickle at all), and it is several times faster than
`torch.load(weights_only=True)` on traces of many small tensors, which matters because a
check reads one trace per process it starts.

Layout: an 8-byte little-endian header length, the JSON header, then the bytes of every tensor
and array, each starting at a multiple of 64 bytes from the file's start.

Supported values: None, bool, int, float, str, lists, tuples and frozensets
(read back as lists), dicts (any int/str keys), CPU tensors, numpy arrays of plain dtypes,
numpy scalars (read back as Python scalars) and dataclasses (read back as the dicts of their
fields, which `trainparity._records.read` turns into the record again).
"""

from __future__ import annotations

import json
import pathlib
import struct
from typing import Any

import numpy as np
import torch

from trainparity._records import fields_of, is_record

_TENSOR = "\x00tensor"
_ARRAY = "\x00ndarray"
_DICT = "\x00dict"  # a dict whose keys are not all strings, as [[key, value], ...]
_HEADER = struct.Struct("<Q")
#: every tensor's bytes start at a multiple of this: vectorized kernels (complex128's) fault on misaligned data
_ALIGNMENT = 64


def dump(value: Any, path: str | pathlib.Path) -> None:
    chunks: list[bytes] = []
    offset = 0

    def encode(item: Any) -> Any:
        nonlocal offset
        if isinstance(item, torch.Tensor):
            tensor = item.detach().to("cpu").contiguous()
            data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
            record = {_TENSOR: [offset, len(data), str(tensor.dtype).removeprefix("torch."), list(tensor.shape)]}
        elif isinstance(item, np.ndarray):
            if item.dtype.hasobject:
                raise TypeError("numpy arrays of Python objects cannot be sent between processes")
            data = np.ascontiguousarray(item).tobytes()
            record = {_ARRAY: [offset, len(data), item.dtype.str, list(item.shape)]}
        elif isinstance(item, np.generic):
            return item.item()
        elif item is None or isinstance(item, (bool, int, float, str)):
            return item
        elif isinstance(item, (list, tuple, frozenset)):
            return [encode(v) for v in item]
        elif isinstance(item, dict):
            if all(isinstance(k, str) for k in item):
                return {k: encode(v) for k, v in item.items()}
            if not all(isinstance(k, (str, int)) for k in item):
                raise TypeError(f"dict keys must be str or int to be sent between processes, got {list(item)[:3]}")
            return {_DICT: [[k, encode(v)] for k, v in item.items()]}
        elif is_record(item):
            return {k: encode(v) for k, v in fields_of(item).items()}
        else:
            raise TypeError(f"{type(item).__name__} cannot be sent between processes")
        chunks.append(data)
        padding = -len(data) % _ALIGNMENT
        chunks.append(bytes(padding))
        offset += len(data) + padding
        return record

    header = json.dumps(encode(value)).encode()
    header += b" " * (-(_HEADER.size + len(header)) % _ALIGNMENT)  # JSON ignores trailing whitespace
    with open(path, "wb") as file:
        file.write(_HEADER.pack(len(header)))
        file.write(header)
        for chunk in chunks:
            file.write(chunk)


def load(path: str | pathlib.Path) -> Any:
    data = bytearray(pathlib.Path(path).read_bytes())
    (length,) = _HEADER.unpack_from(data)
    base = _HEADER.size + length
    buffer = memoryview(data)

    def decode(item: Any) -> Any:
        if isinstance(item, list):
            return [decode(v) for v in item]
        if not isinstance(item, dict):
            return item
        if _TENSOR in item:
            start, size, dtype_name, shape = item[_TENSOR]
            dtype = getattr(torch, dtype_name)
            if size == 0:
                return torch.empty(shape, dtype=dtype)
            raw = torch.frombuffer(buffer, dtype=torch.uint8, count=size, offset=base + start)
            if raw.data_ptr() % dtype.itemsize:  # kernels need elements at their natural alignment
                raw = raw.clone()
            return raw.view(dtype).reshape(shape)
        if _ARRAY in item:
            start, size, dtype_str, shape = item[_ARRAY]
            return np.frombuffer(buffer, dtype=np.dtype(dtype_str), count=size // np.dtype(dtype_str).itemsize,
                                 offset=base + start).reshape(shape)
        if _DICT in item:
            return {key: decode(value) for key, value in item[_DICT]}
        return {key: decode(value) for key, value in item.items()}

    return decode(json.loads(bytes(buffer[_HEADER.size:base])))
