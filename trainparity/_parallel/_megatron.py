"""Tensor parallelism by hand, as Megatron-LM writes it: plain tensors, each rank holding a slice of a parameter.

Megatron marks such a parameter with attributes (`tensor_model_parallel = True`, `partition_dim`,
`partition_stride`); each rank records its slice and the marks, and the judgement assembles the whole parameter
(and its gradient) from the slices of the ranks that share it before comparing anything, as a DTensor would be
gathered. The ranks that share a parameter are Megatron's tensor-parallel group: consecutive ranks, as many as the
reference's size along `partition_dim` over the slice's (`tp`), the slices concatenated in rank order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from trainparity._parallel._trace import RankStep, RankTrace
from trainparity._state._compare import Leaf, Snapshot

#: how to mark a slice so that the check can place it
HOW_TO_MARK = ("mark each slice as Megatron-LM does (parameter.tensor_model_parallel = True, parameter.partition_dim "
               "= the dimension it is split along, parameter.partition_stride = 1), or make it a DTensor")


def marked_slices(parameters: Iterable[tuple[str, nn.Parameter]]) -> dict[str, int]:
    """Parameter name -> partition_dim, for the plain tensors marked as Megatron's tensor-parallel slices (a
    `partition_stride` other than 1 is recorded as -1: interleaved slices, which cannot be placed)."""
    slices = {}
    for name, parameter in parameters:
        if getattr(parameter, "tensor_model_parallel", False) and not hasattr(parameter, "device_mesh"):
            stride = int(getattr(parameter, "partition_stride", 1))
            slices[name] = int(getattr(parameter, "partition_dim", 0)) if stride == 1 else -1
    return slices


def assembled(reference: RankTrace, ranks: Sequence[RankTrace]) -> tuple[list[RankTrace], str | None]:
    """The ranks' traces with every marked slice replaced by the whole parameter (and gradient) of its group, or the
    ranks as they are and why a slice cannot be placed."""
    marked = ranks[0].slices if ranks else {}
    if not marked:
        return list(ranks), None
    if any(rank.slices != marked for rank in ranks):
        return list(ranks), f"the ranks mark other parameters as tensor-parallel slices: {HOW_TO_MARK}"
    sizes: dict[str, int] = {}
    for name, dim in marked.items():
        whole = _shape(reference.steps[0].parameters.get(name)) if reference.steps else None
        part = _shape(ranks[0].steps[0].parameters.get(name)) if ranks[0].steps else None
        if dim < 0:
            return list(ranks), f"{name} is split with a partition_stride other than 1, which the check cannot place"
        if whole is None or part is None or dim >= len(part) or part[dim] == 0 or whole[dim] % part[dim]:
            return list(ranks), (f"{name}'s slice of shape {part} cannot be placed in the reference's {whole} along "
                                 f"dimension {dim}: {HOW_TO_MARK}")
        sizes[name] = whole[dim] // part[dim]
    tp = next(iter(sizes.values()))
    if len(set(sizes.values())) != 1 or len(ranks) % tp:
        return list(ranks), (f"the slices imply tensor-parallel groups of {sorted(set(sizes.values()))} ranks, which "
                             f"do not divide the world of {len(ranks)}: {HOW_TO_MARK}")
    whole_ranks = []
    for rank, trace in enumerate(ranks):
        group = [ranks[peer] for peer in range(rank - rank % tp, rank - rank % tp + tp)]
        steps = [_whole_step(step, [peer.steps[index] for peer in group], marked)
                 for index, step in enumerate(trace.steps)]
        whole_ranks.append(dataclasses.replace(trace, steps=steps))
    return whole_ranks, None


def _shape(leaf: Leaf) -> list[int] | None:
    return list(leaf.shape) if isinstance(leaf, torch.Tensor) else None


def _whole_step(step: RankStep, peers: Sequence[RankStep], marked: Mapping[str, int]) -> RankStep:
    """The rank's step with each marked slice, parameter and gradient, replaced by its group's slices concatenated in
    rank order; the rest is the rank's own."""
    return dataclasses.replace(step, parameters=_joined(step.parameters, [p.parameters for p in peers], marked),
                               gradients=_joined(step.gradients, [p.gradients for p in peers], marked))


def _joined(own: Snapshot, group: Sequence[Snapshot], marked: Mapping[str, int]) -> Snapshot:
    joined = dict(own)
    for name, dim in marked.items():
        parts = [snapshot.get(name) for snapshot in group]
        tensors = [part for part in parts if isinstance(part, torch.Tensor)]
        if len(tensors) == len(parts) and tensors:
            joined[name] = torch.cat(tensors, dim)
    return joined
