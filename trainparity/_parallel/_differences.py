"""What the parallel check's judges share: snapshots compared by name, violations built, gradients scaled, shapes
read."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from trainparity._parallel._tensor_parallel import RATIO_TOLERANCE
from trainparity._results._violation import Violation
from trainparity._state._compare import (
    Comparison,
    Leaf,
    Mismatch,
    Snapshot,
    compare_leaves,
    compare_snapshots,
    ignored,
    ignoring,
)
from trainparity._state._digest import Digest


def compared(expected: Snapshot, actual: Snapshot, root: str, comparison: Comparison) -> Iterator[Mismatch]:
    """`compare_snapshots` of snapshots keyed by name under `root` (`gradients`, `parameters`), passing over the
    paths (`<root>.<name>`) the comparison ignores."""
    for mismatch in compare_snapshots(expected, actual, ignoring(comparison, ())):
        if not ignored(f"{root}.{mismatch.path}", comparison.ignore):
            yield mismatch


def violation(
    kind: str, root: str, mismatch: Mismatch, step: int, rank: int, cause: str | None, preface: str
) -> Violation:
    return Violation(
        kind=kind,
        path=f"{root}.{mismatch.path}",
        message=f"{preface}\n{mismatch.message}",
        step=step,
        expected=mismatch.expected,
        actual=mismatch.actual,
        cause=cause,
        rank=rank,
    )


def scaled(expected: Leaf, actual: Leaf, world_size: int) -> bool:
    """Whether `actual` is `world_size` times a nonzero `expected`."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return False
    if not expected.is_floating_point() or expected.shape != actual.shape or not bool(expected.any()):
        return False
    return compare_leaves(expected * world_size, actual, RATIO_TOLERANCE) is None


def shape_of(leaf: Leaf) -> tuple[int, ...] | None:
    """A recorded tensor's shape (a digest's, for a tensor too large to keep); None for anything else."""
    return tuple(leaf.shape) if isinstance(leaf, (torch.Tensor, Digest)) else None
