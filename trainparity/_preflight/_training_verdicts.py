"""What `check_training` judges, as declared: its arguments validated (`tp.InvalidArgument` naming the fix,
before anything runs) into `Verdicts`, with the bounds `assert_training_healthy` adds by default."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from trainparity._results._violation import JsonValue, json_safe
from trainparity._validation import (
    InvalidArgument,
    check_argument,
    check_bool,
    check_number,
    check_optional_int,
)

#: (low, high) bounds of ||update|| / ||parameters||; None leaves a side open
Band: TypeAlias = tuple[float | None, float | None]
#: the learning rate at each optimizer step, indexed from 0: a function of the index or a list, each value a float
#: or one per parameter group
Schedule: TypeAlias = Callable[[int], Any] | Sequence[Any]
#: `update_ratio=True`: two decades either side of the classic 1e-3
DEFAULT_BAND: Band = (1e-5, 1e-1)
#: the loss's start counts as at least this in size when judging its growth (a loss that starts at about 0)
LOSS_FLOOR = 1e-2
#: how close a learning rate must be to the schedule's (schedulers compute theirs in other orders)
LR_RTOL, LR_ATOL = 1e-6, 1e-12


def _band(value: object) -> Band | None:
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_BAND
    check_argument(isinstance(value, (tuple, list)) and len(value) == 2, f"update_ratio= must be (low, high), True "
                   f"for the default band {DEFAULT_BAND}, or None, got {value!r}")
    assert isinstance(value, (tuple, list))
    low, high = (None if side is None else check_number("update_ratio", side, "(1e-4, 1e-2)") for side in value)
    check_argument((low is not None or high is not None) and all(side is None or side >= 0 for side in (low, high))
                   and (low is None or high is None or low < high),
                   f"update_ratio= must be (low, high) with 0 <= low < high (None leaves a side open), got {value!r}")
    return low, high


def scheduled(schedule: Callable[[int], object], index: int, where: str) -> object:
    """The schedule's value for an optimizer step; what it raises is the caller's argument failing, a ValueError."""
    try:
        return schedule(index)
    except Exception as error:  # noqa: BLE001 - any exception of the user's function, named
        raise InvalidArgument(f"{where} raised {type(error).__name__}: {error}; lr_schedule= must give the learning "
                              f"rate of every optimizer step the check observes (from 0)") from error


def rates_of(value: object, where: str) -> list[float] | float:
    """A schedule's value: one learning rate, or one per parameter group."""
    if isinstance(value, (list, tuple)) and value:
        return [_rate(rate, where) for rate in value]
    return _rate(value, where)


def _rate(value: object, where: str) -> float:
    check_argument(not isinstance(value, bool) and isinstance(value, numbers.Real) and float(value) >= 0,
                   f"{where} must be a learning rate (a float >= 0) or a list of one per parameter group, "
                   f"got {value!r}")
    assert isinstance(value, numbers.Real)
    return float(value)


def _schedule(value: object, argument: str) -> Schedule:
    if callable(value):
        return value
    if isinstance(value, (list, tuple)) and value:
        for index, rate in enumerate(value):
            rates_of(rate, f"{argument}[{index}]")
        return value
    raise InvalidArgument(f"{argument} must be a function of the optimizer step's index (from 0) returning its "
                          f"learning rate, a non-empty list of learning rates, or a mapping from optimizer entries to "
                          f"either, got {value!r}")


def _described(schedule: Schedule) -> JsonValue:
    return json_safe(schedule) if isinstance(schedule, (list, tuple)) else getattr(
        schedule, "__qualname__", type(schedule).__name__)


@dataclasses.dataclass(frozen=True)
class Verdicts:
    """What `check_training` judges beyond non-finite values, validated."""

    min_decrease: float | None
    window: int | None
    overfit: bool
    overfit_fraction: float
    max_grad_norm: float | None
    update_ratio: Band | None
    lr_schedule: Schedule | dict[str, Schedule] | None
    max_skipped_steps: int | None
    max_loss_growth: float | None = None

    @classmethod
    def validate(cls, *, steps: int, min_decrease: object, window: object, overfit: object, overfit_fraction: object,
                 max_grad_norm: object, update_ratio: object, lr_schedule: object,
                 max_skipped_steps: object, max_loss_growth: object = None) -> Verdicts:
        """Misuse raises TypeError/ValueError naming the fix, before anything runs."""
        decrease = None if min_decrease is None else check_number("min_decrease", min_decrease, "0.1")
        check_argument(decrease is None or 0 <= decrease < 1, f"min_decrease= is a fraction of the first window's "
                       f"median loss in [0, 1) (0.1: 10% lower), got {min_decrease!r}")
        window = check_optional_int("window", window, 1, "steps // 4 calls of step() per window")
        check_argument(window is None or decrease is not None,
                       "window= sizes the windows min_decrease= compares: set min_decrease= too (e.g. 0.1)")
        windows = (window or max(1, steps // 4)) if decrease is not None else None
        if windows is not None:
            check_argument(2 * windows <= steps, f"min_decrease= compares the first and the last window={windows} "
                           f"calls of step(), which must not overlap: steps= must be at least {2 * windows}, "
                           f"got {steps}")
        overfit = check_bool("overfit", overfit)
        check_argument(not overfit or steps >= 2, f"overfit=True judges the loss of the later steps against step 1's: "
                       f"steps= must be at least 2, got {steps}")
        fraction = check_number("overfit_fraction", overfit_fraction, "0.1")
        check_argument(0 < fraction < 1, f"overfit_fraction= must be in (0, 1): the loss must fall below that fraction "
                       f"of its value at step 1, got {overfit_fraction!r}")
        bound = None if max_grad_norm is None else check_number("max_grad_norm", max_grad_norm, "10.0")
        check_argument(bound is None or bound > 0, f"max_grad_norm= must be > 0, got {max_grad_norm!r}")
        schedule: Schedule | dict[str, Schedule] | None = None
        if isinstance(lr_schedule, Mapping):
            check_argument(lr_schedule and all(isinstance(key, str) for key in lr_schedule), f"lr_schedule= as a "
                           f"mapping must map optimizer entries (strings) to schedules, got {lr_schedule!r}")
            schedule = {key: _schedule(value, f"lr_schedule[{key!r}]") for key, value in lr_schedule.items()}
        elif lr_schedule is not None:
            schedule = _schedule(lr_schedule, "lr_schedule=")
        skipped = check_optional_int("max_skipped_steps", max_skipped_steps, 0, "not judged")
        growth = None if max_loss_growth is None else check_number("max_loss_growth", max_loss_growth, "100.0")
        check_argument(growth is None or growth > 1, f"max_loss_growth= is how many times its start the loss may "
                       f"reach, > 1 (100.0: two orders of magnitude), or None (not judged), got {max_loss_growth!r}")
        return cls(decrease, windows, overfit, fraction, bound, _band(update_ratio), schedule, skipped, growth)

    @property
    def optimizer_verdicts(self) -> bool:
        """Whether a verdict asked for reads the optimizers' steps."""
        return (self.max_grad_norm is not None or self.update_ratio is not None or self.lr_schedule is not None
                or self.max_skipped_steps is not None)

    def config(self) -> dict[str, JsonValue]:
        schedule = self.lr_schedule
        return {"min_decrease": self.min_decrease, "window": self.window, "overfit": self.overfit,
                "overfit_fraction": self.overfit_fraction, "max_grad_norm": self.max_grad_norm,
                "update_ratio": None if self.update_ratio is None else list(self.update_ratio),
                "lr_schedule": None if schedule is None else {k: _described(v) for k, v in schedule.items()}
                if isinstance(schedule, dict) else _described(schedule),
                "max_skipped_steps": self.max_skipped_steps, "max_loss_growth": self.max_loss_growth}
