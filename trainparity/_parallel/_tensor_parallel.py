"""Tensor parallelism: which layer's partial sums were never all-reduced.

A missing all-reduce shows in the gradients of every layer, so gradients alone cannot say which
layer lost it; the layer's output can. In a tensor-parallel group (every rank read the
reference's batch), the first module output, in forward order, that differs from the reference's
and sums over the ranks to it names the layer; on the backward side, a replicated parameter's
gradients that sum to the reference's name the layer holding it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from trainparity._parallel._trace import ModuleOutput, RankStep
from trainparity._state._compare import Comparison, Leaf, Mismatch, ToleranceComparison, compare_leaves

#: a diagnosis names a likely cause, never the verdict: "world_size times the reference" allows for the
#: rounding of a different reduction order whatever comparison was declared
RATIO_TOLERANCE = ToleranceComparison(rtol=1e-4, atol=1e-7)


TP_PARTIAL = "tp_partial_not_reduced"


def sharded_after(layer: str, expected: RankStep, first: RankStep) -> str | None:
    """The first module to finish after `layer` whose output on rank 0 is a shard (another shape than the
    reference's): in forward order the tensor-parallel layer that `layer`'s output feeds."""
    shapes = {output.key: output.shape for output in first.outputs}
    modules = [output.module for output in expected.outputs]
    if layer not in modules:
        return None
    for output in expected.outputs[modules.index(layer) + 1:]:
        if output.key in shapes and shapes[output.key] != output.shape:
            return output.module
    return None


def sums_to(expected: Leaf, ranks: Sequence[Leaf]) -> bool:
    """Whether the ranks' tensors add up to a nonzero `expected` (each a partial sum of it)."""
    if not isinstance(expected, torch.Tensor) or not expected.is_floating_point() or not bool(expected.any()):
        return False
    if not all(isinstance(r, torch.Tensor) and r.shape == expected.shape for r in ranks):
        return False
    total = torch.stack([r for r in ranks if isinstance(r, torch.Tensor)]).sum(0)
    return compare_leaves(expected, total.to(expected.dtype), RATIO_TOLERANCE) is None


@dataclasses.dataclass(frozen=True)
class PartialOutput:
    """A module output that differs from the reference's on `rank` (the first such rank), while the ranks'
    outputs sum to the reference's."""

    expected: ModuleOutput
    actual: ModuleOutput
    rank: int
    mismatch: Mismatch
    #: found among the peers of one replica on a mesh (the reference's output for their samples), not among
    #: ranks that all read the reference's batch
    peers: bool = False


def partial_output(reference: RankStep, ranks: Sequence[RankStep], comparison: Comparison) -> PartialOutput | None:
    """The first module output, in the order the modules finished, that differs from the reference's on some
    rank, when the ranks' outputs sum to the reference's. None when the first differing output is something
    else. Outputs of another shape than the reference's are a rank's shard of
    a sharded layer and are passed over; outputs not recorded by every process end the search."""
    recorded = [{output.key: output for output in step.outputs} for step in ranks]
    for expected in reference.outputs:
        outputs = [by_key.get(expected.key) for by_key in recorded]
        found = [output for output in outputs if output is not None]
        if len(found) < len(outputs):
            return None
        if any(output.shape != expected.shape for output in found):
            continue
        mismatches = [compare_leaves(expected.values, output.values, comparison) for output in found]
        rank = next((rank for rank, mismatch in enumerate(mismatches) if mismatch is not None), None)
        if rank is None:
            continue
        mismatch = mismatches[rank]
        if mismatch is None or not sums_to(expected.values, [output.values for output in found]):
            return None
        return PartialOutput(expected, found[rank], rank, dataclasses.replace(mismatch, path=expected.key))
    return None


def peer_partial_output(reference: RankStep, ranks: Sequence[RankStep], peers: Sequence[int],
                        comparison: Comparison) -> PartialOutput | None:
    """On a mesh, the first module output of the replica of `peers` (ranks that read the same samples) that differs
    from the reference's rows for those samples on some peer, when the peers' outputs sum to those rows. Outputs
    whose first dimension is not the batch, sampled ones and shards (another shape) are passed over."""
    batch, ids = reference.sample_ids, ranks[peers[0]].sample_ids
    if batch is None or ids is None or len(set(map(str, batch))) != len(batch):
        return None
    where = {str(sample): index for index, sample in enumerate(batch)}
    if any(str(sample) not in where for sample in ids):
        return None
    rows = torch.tensor([where[str(sample)] for sample in ids])
    recorded = [{output.key: output for output in ranks[rank].outputs} for rank in peers]
    for expected in reference.outputs:
        if expected.stride != 1 or not expected.shape or expected.shape[0] != len(batch):
            continue
        wanted = expected.values[rows]
        outputs = [by_key.get(expected.key) for by_key in recorded]
        found = [output for output in outputs if output is not None]
        if len(found) < len(outputs):
            return None
        if any(output.stride != 1 or list(output.values.shape) != list(wanted.shape) for output in found):
            continue
        mismatches = [compare_leaves(wanted, output.values, comparison) for output in found]
        index = next((index for index, mismatch in enumerate(mismatches) if mismatch is not None), None)
        if index is None:
            continue
        mismatch = mismatches[index]
        if mismatch is None or not sums_to(wanted, [output.values for output in found]):
            return None
        shown = dataclasses.replace(expected, shape=list(wanted.shape), values=wanted)
        return PartialOutput(shown, found[index], peers[index], dataclasses.replace(mismatch, path=expected.key),
                             peers=True)
    return None
