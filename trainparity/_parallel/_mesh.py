"""The mesh a rank trains on, and what it says about the ranks: which read the same data, and how to name them.

A recipe builds its own `DeviceMesh` (`init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))`); its
DTensor parameters carry it. The dimensions whose names say data parallelism (`dp`, `dp_shard`, `dp_replicate`,
`fsdp`, `ddp`, `hsdp`, `data`, ...) split the batch; the others (`tp`, `sp`, `cp`, `ep`, ...) split the model, and
the ranks that differ only along them (peers) compute one replica on the same samples. Without names, or without
a model dimension, the ranks are judged as plain data-parallel replicas.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import nn

from trainparity._compat import root_mesh

#: the words that mark a mesh dimension as data parallel (a name is one of them, or starts with one and "_")
DATA_WORDS = ("dp", "ddp", "fsdp", "hsdp", "data", "replicate", "shard", "batch")


@dataclasses.dataclass(frozen=True)
class Mesh:
    """A rank's place on the mesh its parameters live on: the dimensions' names and sizes, and its coordinate."""

    names: list[str]
    shape: list[int]
    coordinate: list[int]

    def describe(self) -> str:
        """`dp=0, tp=1`."""
        return ", ".join(f"{name}={index}" for name, index in zip(self.names, self.coordinate, strict=True))

    @property
    def model_dims(self) -> list[str]:
        return [name for name in self.names if not is_data_dim(name)]

    def data_coordinate(self) -> tuple[int, ...]:
        return tuple(index for name, index in zip(self.names, self.coordinate, strict=True) if is_data_dim(name))


def is_data_dim(name: str) -> bool:
    return any(name == word or name.startswith(f"{word}_") for word in DATA_WORDS)


def _meshes(modules: Mapping[str, nn.Module]) -> Iterator[Any]:
    for module in modules.values():
        for tensor in (*module.parameters(), *module.buffers()):
            mesh = getattr(tensor, "device_mesh", None)  # a DTensor's
            if mesh is not None:
                yield root_mesh(mesh)


def find_mesh(modules: Mapping[str, nn.Module]) -> Mesh | None:
    """The mesh with the most dimensions among those the State's DTensors live on, when its dimensions are named;
    None for a model without DTensors or a mesh without names."""
    best = max(_meshes(modules), key=lambda mesh: mesh.ndim, default=None)
    names = None if best is None else best.mesh_dim_names
    coordinate = None if best is None else best.get_coordinate()
    if best is None or not names or coordinate is None:
        return None
    return Mesh(list(names), [int(size) for size in best.shape], [int(index) for index in coordinate])


def parallelism(modules: Mapping[str, nn.Module], mesh: Mesh | None) -> list[str]:
    """What the State's modules use, as hints speak of it: "ddp", "fsdp", "tensor parallel"."""
    found = []
    if any(isinstance(module, nn.parallel.DistributedDataParallel) for module in modules.values()):
        found.append("ddp")
    if any(type(sub).__name__.startswith("FSDP") for module in modules.values() for sub in module.modules()):
        found.append("fsdp")
    if mesh is not None and mesh.model_dims:
        found.append("tensor parallel")
    return found


def peer_groups(meshes: Sequence[Mesh | None]) -> list[list[int]] | None:
    """The ranks grouped by their coordinate along the data dimensions (each group one replica, its ranks peers
    that read the same samples), in rank order; None unless every rank has the same named mesh with a model
    dimension (`tp`, ...) and a size that is the world's."""
    first = meshes[0] if meshes else None
    if first is None or not first.model_dims or any(
            mesh is None or (mesh.names, mesh.shape) != (first.names, first.shape) for mesh in meshes):
        return None
    if math.prod(first.shape) != len(meshes):
        return None
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, mesh in enumerate(meshes):
        assert mesh is not None
        groups.setdefault(mesh.data_coordinate(), []).append(rank)
    return list(groups.values())


def named(rank: int, meshes: Sequence[Mesh | None]) -> str:
    """`rank 5 (dp=1, tp=1)` on a mesh, `rank 5` otherwise."""
    mesh = meshes[rank] if rank < len(meshes) else None
    return f"rank {rank}" if mesh is None else f"rank {rank} ({mesh.describe()})"


def dimension_of(ranks: Sequence[int], meshes: Sequence[Mesh | None], around: int) -> str | None:
    """The mesh dimension whose ranks through `around` (those that differ from it along that dimension alone) are
    `ranks`; None when no dimension's are."""
    center = meshes[around]
    if center is None:
        return None
    for axis, name in enumerate(center.names):
        line = [rank for rank, mesh in enumerate(meshes) if mesh is not None and all(
            index == other for position, (index, other) in enumerate(zip(mesh.coordinate, center.coordinate,
                                                                          strict=True)) if position != axis)]
        if sorted(line) == sorted(ranks):
            return name
    return None
