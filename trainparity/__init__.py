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
    assert_data_parallel_equivalent,
    assert_equivalent,
    assert_frozen,
    assert_loss_decreases,
    assert_mixed_precision_safe,
    assert_optimizer_coverage,
    assert_overfits_one_batch,
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
from trainparity._equivalent import check_equivalent
from trainparity._parallel import check_data_parallel
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
    DataParallelResult,
    FrozenResult,
    MixedPrecisionResult,
    OptimizerCoverageResult,
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
    "DataParallelResult",
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
    "assert_data_parallel_equivalent",
    "assert_equivalent",
    "assert_frozen",
    "assert_loss_decreases",
    "assert_mixed_precision_safe",
    "assert_optimizer_coverage",
    "assert_overfits_one_batch",
    "assert_resume_equivalent",
    "assert_resume_script_equivalent",
    "assert_runs_equivalent",
    "assert_train_mode",
    "assert_training_healthy",
    "assert_worker_randomness",
    "check_accumulation",
    "check_coverage",
    "check_data_parallel",
    "check_equivalent",
    "check_frozen",
    "check_mixed_precision",
    "check_optimizer_coverage",
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


def __getattr__(name: str) -> object:
    # `tp.strategies` imports hypothesis (a tenth of a second) only when a test asks for it.
    if name == "strategies":
        import importlib

        return importlib.import_module("trainparity.strategies")
    raise AttributeError(f"module 'trainparity' has no attribute {name!r}")
