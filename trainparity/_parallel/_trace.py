"""What one process of the data-parallel check observed: per step its batch's sample IDs, the gradients at its
optimizer step, the parameters after it, and a bounded sample of its modules' outputs."""

from __future__ import annotations

import dataclasses

import torch

from trainparity._batches._sample_ids import SampleIds
from trainparity._observe._records import Clip
from trainparity._parallel._mesh import Mesh
from trainparity._results._violation import ChildError
from trainparity._state._compare import Snapshot


@dataclasses.dataclass(frozen=True)
class ModuleOutput:
    """A floating tensor a module returned in one step, as the tensor-parallel diagnosis keeps it."""

    #: the module's path, `.i`/`.key` for an item of a tuple or dict output, `#n` for its n-th call in the step
    key: str
    #: the module's path and class, as reports name it: "model.down (Linear)"
    module: str
    #: the whole (gathered) output's shape
    shape: list[int]
    #: every `stride`-th element of the whole output in float64, shaped like the output when stride is 1
    stride: int
    values: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Reduction:
    """The recipe's own `dist.all_reduce` of a parameter's gradient: which parameter, over which global ranks."""

    parameter: str
    ranks: list[int]


@dataclasses.dataclass(frozen=True)
class RankStep:
    """One step of one process: its batch's sample IDs, the gradients at the optimizer step, the parameters after,
    and the module outputs recorded in the step (see `OutputRecorder`)."""

    step: int
    sample_ids: SampleIds | None
    gradients: Snapshot
    parameters: Snapshot
    outputs: list[ModuleOutput]
    #: the clipping calls of the step, with the norm each scaled by and the norm of the whole gradients it clipped
    clips: list[Clip] = dataclasses.field(default_factory=list)
    #: the recipe's own all-reduces of gradients in the step
    reductions: list[Reduction] = dataclasses.field(default_factory=list)
    #: the most micro-batches one of the rank's pipeline stages ran forward in the step (0 without pipelining)
    forwards: int = 0


@dataclasses.dataclass(frozen=True)
class RankTrace:
    """What one process of the check observed."""

    steps: list[RankStep]
    #: how many optimizers the State holds
    optimizers: int
    #: batch-dependent modules that ran in training mode
    batch_dependent: list[str]
    #: parameter name -> the layer that owns it, as reports name it ("model.embed (Linear)")
    layers: dict[str, str]
    #: the rank's place on the mesh its DTensors live on, when its dimensions are named
    mesh: Mesh | None = None
    #: what the State's modules use, as hints speak of it ("ddp", "fsdp", "tensor parallel")
    parallelism: list[str] = dataclasses.field(default_factory=list)
    #: parameter name -> the dimension a plain tensor marked as Megatron's tensor-parallel slice is split along
    #: (-1: interleaved, `partition_stride` > 1)
    slices: dict[str, int] = dataclasses.field(default_factory=dict)
    #: another name of a parameter -> the name it is recorded under (a weight tied to another: `head.weight` ->
    #: `embed.weight`)
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class WorldTrace:
    """What a threaded world (`backend="threads"`: every rank a thread of one process) observed: each rank's trace
    in rank order, or the failure of the first rank that raised."""

    ranks: list[RankTrace]
    failure: ChildError | None
