"""What a training run recorded per call of `step()`, as `check_training` traces it and its result carries it:
typed records (written and read by `trainparity._records`), and the table `TrainingResult.table()` renders."""

from __future__ import annotations

import dataclasses

from trainparity._results._report import ascii_text
from trainparity._results._violation import format_number, format_scale


@dataclasses.dataclass
class Update:
    """One optimizer step (or one the GradScaler skipped) of an optimizer of the State."""

    #: the optimizer's State entry
    optimizer: str
    #: `scaler.step()` skipped it: its gradients held an inf or a NaN (no update)
    skipped: bool
    #: the loss scale at `scaler.step()`; None without an enabled GradScaler
    scale: float | None
    #: the L2 norm of the optimizer's gradients at the step (unscaled, after any clipping); None: no gradient at all,
    #: or a skipped step
    grad_norm: float | None
    #: the norm a clipping function saw before it clipped these gradients, in the same call; None: no clipping
    clip_norm: float | None
    #: the parameters whose gradient held an inf or a NaN at the step
    nonfinite_grads: list[str]
    #: per parameter group: the learning rate at the step, and ||update|| / ||parameters|| (None: parameters of norm
    #: 0, or a skipped step)
    lr: list[float]
    update_ratio: list[float | None]
    #: per parameter group: how many parameters it holds, how many had no gradient at the step, how many have
    #: requires_grad=False
    parameters: list[int]
    without_grad: list[int]
    frozen: list[int]
    #: the parameter of the largest gradient norm at the step (a non-finite one first)
    largest_grad: str | None = None

    @property
    def judged_norm(self) -> float | None:
        """The gradient norm before clipping: what the loss's backward produced."""
        return self.clip_norm if self.clip_norm is not None else self.grad_norm


@dataclasses.dataclass
class TrainingStep:
    """What one call of `step()` did: its loss, its optimizer steps, and the parameters left non-finite."""

    step: int
    loss: float | None
    updates: list[Update]
    nonfinite_params: list[str]


#: significant digits of the table's numbers and the training check's messages: stable across CPUs at float32
TABLE_DIGITS = 4


def number(value: float | None) -> str:
    """A number of the table and of the training check's messages ('-' for None)."""
    return format_number(value, TABLE_DIGITS, missing="-")


def _numbers(values: list[float] | list[float | None]) -> str:
    return ", ".join(number(value) for value in values)


def _gradient(update: Update) -> str:
    if update.skipped:
        return "-"
    if update.clip_norm is not None and update.grad_norm is not None and abs(update.clip_norm - update.grad_norm) > (
            1e-6 * update.clip_norm):
        return f"{number(update.clip_norm)} -> {number(update.grad_norm)}"
    return number(update.grad_norm)


def _note(update: Update) -> str:
    notes = []
    if update.skipped:
        notes.append(f"skipped by the GradScaler (scale {format_scale(update.scale, missing='-')})")
    if update.nonfinite_grads:
        shown = ", ".join(update.nonfinite_grads[:3]) + (", ..." if len(update.nonfinite_grads) > 3 else "")
        notes.append(f"non-finite gradients: {shown}")
    return "; ".join(notes)


def render_table(steps: list[TrainingStep]) -> str:
    """One row per optimizer step (a call without one: its loss alone): the loss, the gradient norm (before ->
    after clipping), ||update|| / ||parameters|| and the learning rate per parameter group, and what went wrong."""
    several = len({update.optimizer for step in steps for update in step.updates}) > 1
    header = ["step", "loss", *(["optimizer"] if several else []), "grad norm", "update/param", "lr", "note"]
    rows = []
    for step in steps:
        loss = number(step.loss)
        for index, update in enumerate(step.updates or [None]):
            first = index == 0
            cells = [str(step.step) if first else "", loss if first else ""]
            if several:
                cells.append(update.optimizer if update is not None else "")
            if update is None:
                cells += ["-", "-", "-", "no optimizer step"]
            else:
                ratios = "-" if update.skipped else _numbers(update.update_ratio)
                cells += [_gradient(update), ratios, _numbers(update.lr) or "-", _note(update)]
            rows.append(cells)
        if step.nonfinite_params:
            rows[-1][-1] = "; ".join(filter(None, [rows[-1][-1], f"non-finite parameters: {step.nonfinite_params[0]}"
                                                   + (", ..." if len(step.nonfinite_params) > 1 else "")]))
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    return ascii_text("\n".join(lines))
