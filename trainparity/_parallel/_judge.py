"""The data-parallel verdict: per step the data, then the gradients, then the parameters, in observation order.

Ranks are compared with rank 0, and rank 0 with the reference: O(world size) comparisons, and the
first violation lands on the most specific cause.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from trainparity._parallel._differences import compared, scaled, shape_of, violation
from trainparity._parallel._megatron import HOW_TO_MARK, assembled
from trainparity._parallel._mesh import Mesh, dimension_of, is_data_dim, named, peer_groups
from trainparity._parallel._shards import peer_violations, reads_whole_batch, shard_violations
from trainparity._parallel._stages import stage_differences, stages_of
from trainparity._parallel._tensor_parallel import (
    RATIO_TOLERANCE,
    TP_PARTIAL,
    PartialOutput,
    partial_output,
    peer_partial_output,
    sharded_after,
    sums_to,
)
from trainparity._parallel._trace import RankStep, RankTrace
from trainparity._results._result import ParallelResult
from trainparity._results._violation import Outcome, Violation, format_number, listed
from trainparity._state._compare import (
    Comparison,
    ExactComparison,
    Leaf,
    ToleranceComparison,
    compare_leaves,
)

#: torch.testing.assert_close's defaults, used only to say that an exact FAIL is rounding-level
ROUNDING = {
    torch.float16: ToleranceComparison(rtol=1e-3, atol=1e-5),
    torch.bfloat16: ToleranceComparison(rtol=1.6e-2, atol=1e-5),
    torch.float32: ToleranceComparison(rtol=1.3e-6, atol=1e-5),
    torch.float64: ToleranceComparison(rtol=1e-7, atol=1e-7),
}


#: why a check of ranks that do not hold the reference's model judges nothing
NOT_REPLICAS = ("The check compares every rank's whole model (a DTensor's shards gathered, or a pipeline stage's "
                "parameters by their names in the whole model) with the one-process reference's, so ranks that "
                "hold slices of plain tensors it cannot place cannot be judged: a tensor-parallel slice must be a "
                "DTensor or carry Megatron-LM's marks.")


def _shapes(parameters: dict[str, Leaf]) -> dict[str, tuple[int, ...] | None]:
    return {path: shape_of(leaf) for path, leaf in parameters.items()}


def layout_difference(reference: RankTrace, ranks: Sequence[RankTrace]) -> str | None:
    """How the first rank whose parameters (by path and shape, after its first step) are not the reference's
    differs from it; None when every rank holds the reference's model."""
    if not reference.steps:
        return None
    expected = _shapes(reference.steps[0].parameters)
    for rank, trace in enumerate(ranks):
        actual = _shapes(trace.steps[0].parameters) if trace.steps else expected
        if actual == expected:
            continue
        missing, extra = sorted(expected.keys() - actual.keys()), sorted(actual.keys() - expected.keys())
        reshaped = sorted(path for path in expected.keys() & actual.keys() if expected[path] != actual[path])
        parts = ([f"it lacks {listed(missing, 3)}"] if missing else []) + (
            [f"it holds {listed(extra, 3)}, which the reference does not"] if extra else []) + (
            [f"{path} is {list(actual[path] or [])} there and {list(expected[path] or [])} in the reference (a "
             f"slice of a plain tensor? {HOW_TO_MARK})" for path in reshaped[:1]])
        return f"rank {rank} does not hold the model the reference trains: {'; '.join(parts)}. {NOT_REPLICAS}"
    return None


def judge_parallel(
    reference: RankTrace, ranks: Sequence[RankTrace], comparison: Comparison, config: dict[str, Any]
) -> ParallelResult:
    ranks, unplaced = assembled(reference, ranks)
    stages = None if unplaced else stages_of(reference, ranks)
    difference = unplaced or (stages if isinstance(stages, str) else
                              None if stages is not None else layout_difference(reference, ranks))
    if difference is not None:
        return ParallelResult(Outcome.ABSTAIN, config=config, reason=difference)
    assert not isinstance(stages, str)
    meshes = [rank.mesh for rank in ranks]
    groups = stages.pipelines if stages is not None else peer_groups(meshes)
    # SyncBatchNorm normalizes over the whole batch across ranks: only the others depend on the shard.
    judging = _Judging(comparison, reference.layers, meshes, groups, ranks[0].parallelism if ranks else [],
                       sorted({module for trace in (reference, *ranks) for module in trace.batch_dependent
                               if not module.endswith("(SyncBatchNorm)")}))
    found: list[tuple[Violation, Leaf, Leaf]] = []
    data_checked = True
    for index, expected in enumerate(reference.steps):
        observed = [rank.steps[index] for rank in ranks]
        shards = [o.sample_ids for o in observed if o.sample_ids is not None]
        if expected.sample_ids is None or len(shards) < len(observed):
            data_checked = False
        else:
            peers = [] if groups is None else peer_violations(expected.step, groups, shards, meshes)
            found += [(v, None, None) for v in peers or shard_violations(expected.step, expected.sample_ids, shards)]
        # A tensor-parallel group computes one model on the same batch: partial sums over its ranks are telling.
        group = expected.sample_ids is not None and len(shards) == len(observed) and reads_whole_batch(
            expected.sample_ids, shards)
        found += stage_differences(expected, observed, stages, comparison) if stages is not None else \
            _state_differences(expected, observed, group, judging)
    violations = [violation for violation, _, _ in found]
    notes: list[str] = []
    if not data_checked:
        notes.append("data stream not checked: the recipe's sample_ids() returns None.")
    if reference.optimizers == 0:
        notes.append("gradients not compared: the State holds no torch.optim.Optimizer whose step could be observed.")
    if violations and all(_within_rounding(e, a, comparison) for _, e, a in found):
        notes.append(
            "every difference is within torch.testing's default tolerance for its dtype: ranks reduce the batch "
            "in another order than one process, which changes rounding. If that is acceptable, judge in float64 "
            "(precision='float64', the default) or declare comparison=tp.ToleranceComparison(rtol=..., atol=...)."
        )
    return ParallelResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes, config)


@dataclasses.dataclass(frozen=True)
class _Judging:
    """What each step of one parallel check is judged with."""

    comparison: Comparison
    #: parameter name -> the layer that owns it, as reports name it (the reference's)
    layers: dict[str, str]
    meshes: list[Mesh | None]
    #: the ranks that read the same samples, grouped (`peer_groups`); None: no model dimension
    groups: list[list[int]] | None
    #: what the State's modules use, as hints speak of it (rank 0's)
    uses: list[str]
    #: the modules whose output depends on the batch they see (not SyncBatchNorm)
    batch_dependent: list[str]


def _state_differences(expected: RankStep, observed: list[RankStep], group: bool,
                       judging: _Judging) -> list[tuple[Violation, Leaf, Leaf]]:
    """One step's gradients and parameters: each rank's against rank 0's, rank 0's against the reference's, with the
    step's cause (a partial sum over a tensor-parallel group, clipping by local norms) named first; each violation
    with the two values it compares (`group`: the ranks read the whole batch between them)."""
    step: int = expected.step
    comparison, meshes, groups = judging.comparison, judging.meshes, judging.groups
    partial = partial_output(expected, observed, comparison) if group else None
    if partial is None and groups is not None and not group:
        partial = peer_partial_output(expected, observed, groups[0], comparison)
    found: list[tuple[Violation, Leaf, Leaf]] = []
    first = observed[0]
    clipped = {rank: told for rank, step_of in enumerate(observed)
               if (told := local_clip(step_of, expected, named(rank, meshes))) is not None}
    step_cause = TP_PARTIAL if partial is not None else CLIP_LOCAL if clipped else None
    for rank, other in enumerate(observed[1:], start=1):
        for m in compared(first.gradients, other.gradients, "gradients", comparison):
            if step_cause == CLIP_LOCAL:
                reason, preface = CLIP_LOCAL, clipped.get(rank, clipped[min(clipped)])
            else:
                reason, preface = _unsynchronized(m.path, rank, expected, observed, judging.layers, partial,
                                                  group, meshes, judging.uses)
            step_cause = step_cause or reason
            found.append((violation("gradient_mismatch", "gradients", m, step, rank, reason, preface),
                          first.gradients.get(m.path), other.gradients.get(m.path)))
    for m in compared(expected.gradients, first.gradients, "gradients", comparison):
        e, a = expected.gradients.get(m.path), first.gradients.get(m.path)
        cause: str | None
        if step_cause == CLIP_LOCAL and 0 in clipped:
            cause, preface = CLIP_LOCAL, clipped[0]
        else:
            cause, preface = _reference_gradient_cause(e, a, len(observed), judging.batch_dependent, step_cause,
                                                       meshes[0])
        step_cause = cause
        found.append((violation("gradient_mismatch", "gradients", m, step, 0, cause, preface), e, a))
    for rank, other in enumerate(observed[1:], start=1):
        for m in compared(first.parameters, other.parameters, "parameters", comparison):
            found.append((violation("replica_mismatch", "replicas", m, step, rank,
                                     step_cause if step_cause in (TP_PARTIAL, CLIP_LOCAL) else "grads_not_synchronized",
                                     f"{named(rank, meshes).capitalize()}'s parameters after the step differ "
                                     f"from {named(0, meshes)}'s: the replicas drifted apart."),
                          first.parameters.get(m.path), other.parameters.get(m.path)))
    for m in compared(expected.parameters, first.parameters, "parameters", comparison):
        found.append((violation("parameter_mismatch", "parameters", m, step, 0, step_cause,
                                 "Rank 0's parameters after the step differ from the reference's."),
                      expected.parameters.get(m.path), first.parameters.get(m.path)))
    if found and partial is not None:
        # The module that summed partially comes first: the gradients and parameters follow from it.
        found.insert(0, (_partial_violation(step, partial, meshes), partial.expected.values, partial.actual.values))
    return found


#: the norm for gradient clipping computed over each rank's local shards
CLIP_LOCAL = "clip_norm_local"


def _close(expected: float, actual: float) -> bool:
    """Two norms equal within the diagnoses' `RATIO_TOLERANCE`."""
    return math.isclose(actual, expected, rel_tol=RATIO_TOLERANCE.rtol, abs_tol=RATIO_TOLERANCE.atol)


def local_clip(step: RankStep, reference: RankStep, who: str) -> str | None:
    """The preface of a rank whose clipping scaled by another norm than its gradients' whole norm, while that norm is
    the reference's (the gradients it clipped were right): its norm covered only its shards. None otherwise."""
    for index, clip in enumerate(step.clips):
        expected = reference.clips[index] if index < len(reference.clips) else None
        if clip.applied is None or expected is None or _close(clip.applied, clip.norm) \
                or not _close(expected.norm, clip.norm):
            continue
        return (f"{who.capitalize()} clipped its gradients ({clip.function}) by a norm of "
                f"{format_number(clip.applied)}, where the norm of the whole gradients it clipped is "
                f"{format_number(clip.norm)}, as in the reference: the norm for clipping was computed over this "
                "rank's local shards (DTensor.to_local(), or each rank's part of a gradient) instead of the whole "
                "gradients (combine each DTensor gradient's norm through full_tensor(), or all-reduce the squared "
                "local norms over the mesh).")
    return None


def _reference_gradient_cause(expected: Leaf, actual: Leaf, world_size: int, batch_dependent: list[str],
                              step_cause: str | None, mesh: Mesh | None) -> tuple[str | None, str]:
    """Why rank 0's gradient differs from the reference's: the step's cause where one is known, else a gradient
    scaled by the size of the world or of a mesh dimension (`_scaled_by`), else a layer that normalizes by its
    shard's statistics."""
    times = None if step_cause is not None else _scaled_by(expected, actual, world_size, mesh)
    if times is not None:
        return "loss_not_averaged", times
    if step_cause is None and batch_dependent:
        return "batch_dependent_layer", (
            f"Rank 0's gradients at its optimizer step differ from the reference's: {', '.join(batch_dependent)} "
            "normalize by the statistics of the batch each process sees in training mode, and a rank's shard has "
            "other statistics than the full batch. To normalize over the whole batch across ranks, convert them "
            "with nn.SyncBatchNorm.convert_sync_batchnorm(model).")
    return step_cause, ("Rank 0's gradients at its optimizer step differ from the reference's (the same recipe in a "
                        "world of size 1).")


def _scaled_by(expected: Leaf, actual: Leaf, world_size: int, mesh: Mesh | None) -> str | None:
    """The preface of gradients that are the reference's times the size of the world or of a mesh dimension, or
    divided by it: a loss summed, or averaged once too often, over that group; None otherwise."""
    dims = [] if mesh is None else [(name, size) for name, size in zip(mesh.names, mesh.shape, strict=True)
                                     if 1 < size < world_size]
    for name, size in [("", world_size), *dims]:
        group = f"world_size ({size})" if not name else f"the size of the mesh dimension {name} ({size})"
        if scaled(expected, actual, size):
            where = f"over {name}" if name else "across ranks"
            return (f"Rank 0's gradients are {group} times the reference's: the loss (or the gradients) was summed "
                    f"{where} where the full batch takes a mean.")
        if scaled(actual, expected, size):
            over = f"the ranks of {name}" if name else "every rank"
            return (f"Rank 0's gradients are 1/{size} of the reference's, one over {group}: the loss was averaged "
                    f"over {over} once too often (divided by their number while the gradient reduction averages "
                    "over them too, or averaged over ranks that read the same samples).")
    return None








def _unsynchronized(
    path: str, rank: int, expected: RankStep, observed: Sequence[RankStep], layers: dict[str, str],
    partial: PartialOutput | None, group: bool, meshes: Sequence[Mesh | None], uses: Sequence[str],
) -> tuple[str, str]:
    """The cause and preface of gradients that differ between rank 0 and `rank`, the hint in the terms of the
    parallelism the ranks use."""
    who = named(rank, meshes).capitalize()
    if partial is not None:
        return TP_PARTIAL, f"{who} holds other gradients than {named(0, meshes)} at its optimizer step."
    if group and sums_to(expected.gradients.get(path), [o.gradients.get(path) for o in observed]):
        layer = layers.get(path, path)
        after = sharded_after(layer, expected, observed[0])
        culprit = "a tensor-parallel layer after it" if after is None else f"{after}, the first sharded layer after it,"
        return TP_PARTIAL, (
            f"{who} holds other gradients than rank 0 at its optimizer step, and the ranks' gradients sum to "
            f"the reference's: the gradients of {layer} on each rank are a partial sum that was never all-reduced "
            f"({culprit} whose input gradient is not all-reduced in backward?).")
    wrong = _reduced_over_model_dim(path, observed[0], meshes)
    if wrong is not None:
        return REDUCED_OVER_WRONG_DIM, (
            f"{who} holds other gradients than {named(0, meshes)} at its optimizer step: {wrong}")
    hints = [hint for use, hint in UNSYNCHRONIZED_HINTS.items() if use in uses] or [UNSYNCHRONIZED_HINTS["ddp"]]
    return "grads_not_synchronized", (
        f"{who} holds other gradients than {named(0, meshes)} at its optimizer step: they were not all-reduced "
        f"({'; or '.join(hints)}?).")


#: gradients all-reduced over a mesh dimension that splits the model, never over the one that splits the data
REDUCED_OVER_WRONG_DIM = "reduced_over_wrong_dim"


def _reduced_over_model_dim(path: str, first: RankStep, meshes: Sequence[Mesh | None]) -> str | None:
    """What rank 0's own all-reduces of the parameter's gradient were over, when they were all over model dimensions
    (`tp`, ...) of a mesh that has a data dimension of more than one rank; None otherwise."""
    mesh = meshes[0] if meshes else None
    if mesh is None:
        return None
    data = [name for name, size in zip(mesh.names, mesh.shape, strict=True) if is_data_dim(name) and size > 1]
    groups = [reduction.ranks for reduction in first.reductions if reduction.parameter == path]
    dims = [dimension_of(ranks, meshes, 0) for ranks in groups]
    if not data or not dims or any(dim is None or is_data_dim(dim) for dim in dims):
        return None
    over = ", ".join(dict.fromkeys(dim for dim in dims if dim is not None))
    ranks = listed([str(rank) for rank in groups[0]], 8)
    return (f"the recipe all-reduced the gradient of {path} over {over} (ranks {ranks}), a dimension "
            f"that splits the model and whose ranks read the same samples, and never over {', '.join(data)}, the "
            f"dimension that splits the data (dist.all_reduce(grad, group=mesh[{data[0]!r}].get_group())?).")


#: where gradients that were never reduced come from, by the parallelism in use
UNSYNCHRONIZED_HINTS = {
    "ddp": "a model used without its DDP wrapper, or no_sync() at the step",
    "fsdp": "parameters left outside fully_shard, or set_requires_gradient_sync(False) at the step",
    "tensor parallel": "a tensor-parallel layer whose output or input gradient is not all-reduced over its group "
                       "(a plan entry such as RowwiseParallel(output_layouts=Partial()), or a manual collective "
                       "left out)",
}


def _partial_violation(step: int, partial: PartialOutput, meshes: Sequence[Mesh | None]) -> Violation:
    expected = partial.expected
    sampled = "" if expected.stride == 1 else f" (every {expected.stride}th element of the flattened output)"
    who = named(partial.rank, meshes)
    if partial.peers:
        mesh = meshes[partial.rank]
        dims = ", ".join(mesh.model_dims) if mesh is not None else "the model dimensions"
        told = (f"{expected.module} returned other values on {who} than in the reference for the same samples"
                f"{sampled}, and the outputs of its peers along {dims} (the ranks that read the same samples) sum to "
                f"the reference's: its output on each rank is a partial sum that was never all-reduced over {dims}")
    else:
        told = (f"{expected.module} returned other values on {who} than in the reference{sampled}, and the "
                "ranks' outputs sum to the reference's: its output on each rank is a partial sum that was never "
                "all-reduced")
    return violation(
        "output_mismatch", "outputs", partial.mismatch, step, partial.rank, TP_PARTIAL,
        f"{told} (a row-parallel layer without the all-reduce of its output, such as RowwiseParallel(output_layouts="
        "Partial()) or a missing dist.all_reduce?).")


def _within_rounding(expected: Leaf, actual: Leaf, comparison: Comparison) -> bool:
    if not isinstance(comparison, ExactComparison) or not isinstance(expected, torch.Tensor):
        return False
    tolerance = ROUNDING.get(expected.dtype)
    return tolerance is not None and isinstance(actual, torch.Tensor) and (
        compare_leaves(expected, actual, tolerance) is None
    )
