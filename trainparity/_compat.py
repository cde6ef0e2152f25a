"""What differs between the torch versions trainparity supports (2.7 to the newest), kept in one place.

The checks import these names instead of testing `torch.__version__`:
- `GradScaler`: `torch.amp.GradScaler` in every supported version, but torch 2.7's stubs do not export it
  from `torch.amp`, so it is imported from its module.
- `state_dict(obj)`: `LRScheduler.state_dict` is untyped in torch 2.7's stubs.
- `dimension_names(tensor)`, `unnamed(tensor)`, `named(tensor, names)`: named tensors (`Tensor.names`,
  `rename`) are gone from torch 2.13 on; before, `torch.save` refuses them.
- `root_mesh(mesh)`: the mesh a `DeviceMesh` was sliced from (`mesh["tp"]` of a 2-D mesh): `DeviceMesh._get_root_mesh`
  from torch 2.8 on, the mesh registry's `get_root_mesh` in 2.7.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler

__all__ = ["GradScaler", "dimension_names", "named", "root_mesh", "state_dict", "unnamed"]


def state_dict(stateful: Any) -> dict[str, Any]:
    """`stateful.state_dict()`, typed alike under every supported torch's stubs."""
    found: dict[str, Any] = stateful.state_dict()
    return found


def dimension_names(tensor: torch.Tensor) -> list[str | None] | None:
    """The tensor's dimension names, or None where it has none (or this torch has no named tensors)."""
    names: Any = getattr(tensor, "names", ())
    return list(names) if any(name is not None for name in names) else None


def unnamed(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` without dimension names, where this torch still has them."""
    if dimension_names(tensor) is None:
        return tensor
    renamed: torch.Tensor = operator.methodcaller("rename", None)(tensor)  # not in every torch's stubs
    return renamed


def named(tensor: torch.Tensor, names: list[str | None]) -> torch.Tensor:
    """`tensor` with the dimension names `dimension_names` gave."""
    refined: torch.Tensor = operator.methodcaller("refine_names", *names)(tensor)
    return refined


def root_mesh(mesh: Any) -> Any:
    """The `DeviceMesh` that `mesh` was sliced from, or `mesh` itself."""
    method = getattr(mesh, "_get_root_mesh", None)
    if callable(method):
        return method()
    from torch.distributed.device_mesh import _mesh_resources

    return _mesh_resources.get_root_mesh(mesh)
