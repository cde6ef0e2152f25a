"""The public namespace: thin, explicit, and covering the contract."""

from __future__ import annotations

import types

import pytest

import trainparity as tp

pytestmark = pytest.mark.exact

#: public names fixed by the contract (../shared/CONTRACT.md)
CONTRACT_NAMES = {
    "AccumulationResult", "AtLeastOnce", "CoverageRecorder", "CoverageResult", "DataParallelResult",
    "DistinctEpochOrder", "ExactComparison", "ExactlyOnce", "ExpectedPadding", "LossAccounting",
    "NoCrossRankOverlap", "Outcome", "Recipe", "ResumeResult", "State", "TestCase", "ToleranceComparison",
    "TrainParityMixin", "Violation", "check_accumulation", "check_coverage", "check_data_parallel",
    "check_resume", "load_state", "save_state", "split_batch", "strategies",
    "assert_resume_equivalent", "assert_accumulation_equivalent", "assert_coverage", "assert_data_parallel_equivalent",
    "check_optimizer_coverage", "check_mixed_precision", "assert_optimizer_coverage", "assert_mixed_precision_safe",
    "check_frozen", "assert_frozen", "FrozenResult", "check_train_mode", "assert_train_mode", "TrainModeResult",
    "check_worker_randomness", "assert_worker_randomness", "WorkerRandomnessResult",
    "check_training", "TrainingResult", "assert_overfits_one_batch", "assert_loss_decreases", "assert_training_healthy",
}


def test_all_is_explicit_sorted_and_resolvable() -> None:
    assert tp.__all__ == sorted(tp.__all__)
    assert len(set(tp.__all__)) == len(tp.__all__)
    for name in tp.__all__:
        assert hasattr(tp, name), name


def test_contract_names_are_public() -> None:
    assert CONTRACT_NAMES - set(tp.__all__) == set()


def test_nothing_public_beyond_all() -> None:
    # pytest rewrites the asserts of a plugin's whole distribution, trainparity's modules among them, and leaves
    # names such as '@py_builtins' in them: not identifiers, so nothing a user could import.
    public = {name for name in vars(tp) if name.isidentifier() and not name.startswith("_")} | {"__version__"}
    modules = {name for name in public if isinstance(getattr(tp, name), types.ModuleType)}
    assert public - modules == set(tp.__all__) - modules
    assert modules <= set(tp.__all__) | {"quickstarts"}


def test_outcomes_and_mixin() -> None:
    assert [o.value for o in tp.Outcome] == ["PASS", "FAIL", "ABSTAIN", "ERROR"]
    assert issubclass(tp.TestCase, tp.TrainParityMixin)
    assert callable(tp.TrainParityMixin.assertFrozen) and callable(tp.TrainParityMixin.assertTrainMode)
    assert issubclass(tp.FrozenResult, tp.Result) and issubclass(tp.TrainModeResult, tp.Result)
    assert callable(tp.TrainParityMixin.assertWorkerRandomness)
    assert issubclass(tp.WorkerRandomnessResult, tp.Result) and tp.WorkerRandomnessResult.check == "worker_randomness"
    assert tp.Recipe.autocast_dtype is None  # a recipe declares the dtype it means to train in
    for method in ("assertOverfitsOneBatch", "assertLossDecreases", "assertTrainingHealthy"):
        assert callable(getattr(tp.TrainParityMixin, method)), method
    assert issubclass(tp.TrainingResult, tp.Result) and callable(tp.TrainingResult.table)
    assert tp.Violation("k", "p", "m").worker is None
