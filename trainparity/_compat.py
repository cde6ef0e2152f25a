"""What differs between the torch versions trainparity supports (2.7 to the newest), kept in one place.

The checks import these names instead of testing `torch.__version__`:
- `GradScaler`: `torch.amp.GradScaler` in every supported version, but torch 2.7's stubs do not export it
  from `torch.amp`, so it is imported from its module.
- `state_dict(obj)`: `LRScheduler.state_dict` is untyped in torch 2.7's stubs.
- `unnamed(tensor)`: a tensor without dimension names; named tensors (`Tensor.names`, `rename`) are gone
  from torch 2.13 on.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler

__all__ = ["GradScaler", "state_dict", "unnamed"]


def state_dict(stateful: Any) -> dict[str, Any]:
    """`stateful.state_dict()`, typed alike under every supported torch's stubs."""
    found: dict[str, Any] = stateful.state_dict()
    return found


def unnamed(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` without dimension names, where this torch still has them."""
    names: Any = getattr(tensor, "names", ())
    if any(name is not None for name in names):
        renamed: torch.Tensor = operator.methodcaller("rename", None)(tensor)  # not in every torch's stubs
        return renamed
    return tensor
