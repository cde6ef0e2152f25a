"""The accumulation check's trace: what one run (reference or candidate) observed, window by window.

Typed records: a child hands them to the parent in the `_wire` format, which `trainparity._records` writes and
reads back by their annotations; a run in this process hands over the trace itself.
"""

from __future__ import annotations

import dataclasses

from trainparity._observe._records import CallRecord, Dropout, StepEvent
from trainparity._state._compare import Snapshot


@dataclasses.dataclass
class Window:
    """One full batch: the reference's one call, or the candidate's k calls on its micro-batches."""

    #: the full batch's leaves, by accessor path (`batch[0]`, `batch['input_ids']`)
    batch: Snapshot
    #: the micro-batch sizes (None when the batch has no dim-0 size to read)
    sizes: list[int] | None
    calls: list[CallRecord]
    #: per optimizer entry, its steps in this window
    steps: dict[str, list[StepEvent]]
    #: after the window: `parameters.<name>`, the optimizers' and the schedulers' state by State path
    parameters: Snapshot
    optimizers: Snapshot
    schedulers: Snapshot

    def step_events(self) -> list[tuple[str, StepEvent]]:
        """Every optimizer's steps of this window in the order they were taken."""
        return sorted(((e, event) for e, events in self.steps.items() for event in events), key=lambda i: i[1].order)


@dataclasses.dataclass
class AccumulationTrace:
    """One run of the accumulation check."""

    #: the State right after setup() (dropout already disabled)
    initial: Snapshot
    #: the RNG streams right after setup(), apart from the State so that no entry name can collide
    initial_rng: Snapshot
    #: the batch could not be cut as declared (the check's input is wrong, not the recipe)
    input_error: str | None
    windows: list[Window]
    #: the optimizer entries of the State, by path
    optimizers: list[str]
    dropout: Dropout
    #: batch-dependent modules that ran in training mode (or, with batch_dependent="eval", in eval mode)
    batch_dependent: list[str]
    #: the stride of the observer's diagnosis samples (contributions, gradients before a clip)
    stride: int
    #: each call's gradient contribution was sampled (`CallRecord.contribution`): not in the first run of a candidate
    #: in this process, and never in the reference
    contributions_sampled: bool
