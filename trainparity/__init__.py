"""trainparity: test the semantics of PyTorch training code in unittest and pytest suites.

A thin public namespace over private modules; importing it starts no process.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from trainparity import probe
from trainparity._accumulation import check_accumulation
from trainparity._assertions import (
    RecipeError,
    assert_accumulation_equivalent,
    assert_coverage,
    assert_equivalent,
    assert_frozen,
    assert_loss_decreases,
    assert_mixed_precision_safe,
    assert_optimizer_coverage,
    assert_overfits_one_batch,
    assert_parallel_equivalent,
    assert_resume_equivalent,
    assert_resume_script_equivalent,
    assert_runs_equivalent,
    assert_train_mode,
    assert_training_healthy,
    assert_worker_randomness,
)
from trainparity._batches._split import split_batch
from trainparity._coverage import (
    AtLeastOnce,
    CoverageRecorder,
    DistinctEpochOrder,
    ExactlyOnce,
    ExpectedPadding,
    NoCrossRankOverlap,
    WorkerBatch,
    check_coverage,
    tag_workers,
)
from trainparity._deprecated import RENAMED as _RENAMED
from trainparity._deprecated import warn_once as _warn_once
from trainparity._equivalent import check_equivalent
from trainparity._parallel import check_parallel
from trainparity._preflight import (
    check_frozen,
    check_mixed_precision,
    check_optimizer_coverage,
    check_train_mode,
    check_training,
)
from trainparity._recipe._recipe import LossAccounting, Recipe
from trainparity._results._result import (
    AccumulationResult,
    CoverageResult,
    FrozenResult,
    MixedPrecisionResult,
    OptimizerCoverageResult,
    ParallelResult,
    Result,
    ResumeResult,
    RunsResult,
    TrainingResult,
    TrainModeResult,
    WorkerRandomnessResult,
)
from trainparity._results._violation import ChildError, Outcome, Violation
from trainparity._resume import check_resume
from trainparity._script import check_resume_script, check_runs_equivalent
from trainparity._state._checkpoint import load_state, save_state
from trainparity._state._compare import ExactComparison, ToleranceComparison
from trainparity._state._entries import State
from trainparity._testing import TestCase, TrainParityMixin
from trainparity._validation import InvalidArgument
from trainparity._version import __version__
from trainparity._workers import check_worker_randomness

__all__ = [
    "AccumulationResult",
    "AtLeastOnce",
    "ChildError",
    "CoverageRecorder",
    "CoverageResult",
    "DistinctEpochOrder",
    "ExactComparison",
    "ExactlyOnce",
    "ExpectedPadding",
    "FrozenResult",
    "InvalidArgument",
    "LossAccounting",
    "MixedPrecisionResult",
    "NoCrossRankOverlap",
    "OptimizerCoverageResult",
    "Outcome",
    "ParallelResult",
    "Recipe",
    "RecipeError",
    "Result",
    "ResumeResult",
    "RunsResult",
    "State",
    "TestCase",
    "ToleranceComparison",
    "TrainModeResult",
    "TrainParityMixin",
    "TrainingResult",
    "Violation",
    "WorkerBatch",
    "WorkerRandomnessResult",
    "__version__",
    "assert_accumulation_equivalent",
    "assert_coverage",
    "assert_equivalent",
    "assert_frozen",
    "assert_loss_decreases",
    "assert_mixed_precision_safe",
    "assert_optimizer_coverage",
    "assert_overfits_one_batch",
    "assert_parallel_equivalent",
    "assert_resume_equivalent",
    "assert_resume_script_equivalent",
    "assert_runs_equivalent",
    "assert_train_mode",
    "assert_training_healthy",
    "assert_worker_randomness",
    "check_accumulation",
    "check_coverage",
    "check_equivalent",
    "check_frozen",
    "check_mixed_precision",
    "check_optimizer_coverage",
    "check_parallel",
    "check_resume",
    "check_resume_script",
    "check_runs_equivalent",
    "check_train_mode",
    "check_training",
    "check_worker_randomness",
    "load_state",
    "probe",
    "save_state",
    "split_batch",
    "strategies",
    "tag_workers",
]

if _TYPE_CHECKING:  # type checkers see the module; at run time it is imported on first use
    from trainparity import strategies

    # The names of round 3, renamed (`__getattr__` below serves them at run time, with a DeprecationWarning):
    # type checkers see the same objects under the old names, outside `__all__`.
    check_data_parallel = check_parallel
    assert_data_parallel_equivalent = assert_parallel_equivalent
    DataParallelResult = ParallelResult


def __getattr__(name: str) -> object:
    # `tp.strategies` imports hypothesis (a tenth of a second) only when a test asks for it.
    if name == "strategies":
        import importlib

        return importlib.import_module("trainparity.strategies")
    # A renamed name (`tp.check_data_parallel`): the new object itself, with a DeprecationWarning the first time
    # (at the user's line: warnings skips the import machinery's frames of `from trainparity import ...`).
    new = _RENAMED.get(name)
    if new is not None:
        _warn_once(f"tp.{name}", f"tp.{new}", same="the same class" if name[0].isupper() else "same arguments",
                   stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'trainparity' has no attribute {name!r}")
