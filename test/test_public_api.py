"""The public namespace: thin, explicit, and covering the contract."""

from __future__ import annotations

import inspect
import pathlib
import types
import unittest
import warnings

import pytest
from test_invalid_argument import NeverRuns

import trainparity as tp
from trainparity import _deprecated

pytestmark = pytest.mark.exact

#: public names fixed by the contract (../shared/CONTRACT.md)
CONTRACT_NAMES = {
    "AccumulationResult", "AtLeastOnce", "CoverageRecorder", "CoverageResult", "ParallelResult",
    "DistinctEpochOrder", "ExactComparison", "ExactlyOnce", "ExpectedPadding", "LossAccounting",
    "NoCrossRankOverlap", "Outcome", "Recipe", "ResumeResult", "State", "TestCase", "ToleranceComparison",
    "TrainParityMixin", "Violation", "check_accumulation", "check_coverage", "check_parallel",
    "check_resume", "load_state", "save_state", "split_batch", "strategies",
    "assert_resume_equivalent", "assert_accumulation_equivalent", "assert_coverage", "assert_parallel_equivalent",
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
    assert isinstance(tp.strategies, types.ModuleType)  # imported on first use: whichever test of this worker ran
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


#: round 3's names, renamed in round 4: old -> new (CONTRACT.md section 9)
RENAMED = {"check_data_parallel": "check_parallel", "assert_data_parallel_equivalent": "assert_parallel_equivalent",
           "DataParallelResult": "ParallelResult"}


@pytest.fixture
def unwarned(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if no renamed name had been used yet in this process (another test of this worker may have used one)."""
    monkeypatch.setattr(_deprecated, "_used", set())


def deprecations(caught: list[warnings.WarningMessage]) -> list[tuple[str, str, int]]:
    return [(str(w.message), pathlib.Path(w.filename).name, w.lineno) for w in caught
            if issubclass(w.category, DeprecationWarning)]


def test_the_renamed_names_are_the_new_objects_outside_all_and_dir() -> None:
    assert _deprecated.RENAMED == RENAMED
    for old, new in RENAMED.items():
        assert new in tp.__all__ and old not in tp.__all__ and old not in dir(tp) and old not in vars(tp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for old, new in RENAMED.items():
            assert getattr(tp, old) is getattr(tp, new), old
    with pytest.raises(AttributeError, match="has no attribute 'check_data_paralel'"):
        tp.check_data_paralel  # type: ignore[attr-defined]  # noqa: B018 - a misspelling is no alias


@pytest.mark.usefixtures("unwarned")
def test_each_renamed_name_warns_once_at_the_line_that_uses_it() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # Python's own once-per-line filter must not hide a second warning
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        used = [(tp.check_data_parallel, tp.assert_data_parallel_equivalent, tp.DataParallelResult) for _ in range(3)]
    assert all(names == (tp.check_parallel, tp.assert_parallel_equivalent, tp.ParallelResult) for names in used)
    assert deprecations(caught) == [
        ("tp.check_data_parallel is deprecated: use tp.check_parallel (same arguments)", "test_public_api.py", line),
        ("tp.assert_data_parallel_equivalent is deprecated: use tp.assert_parallel_equivalent (same arguments)",
         "test_public_api.py", line),
        ("tp.DataParallelResult is deprecated: use tp.ParallelResult (the same class)", "test_public_api.py", line),
    ]


@pytest.mark.usefixtures("unwarned")
def test_importing_a_renamed_name_works_and_warns_once_at_the_import() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        from trainparity import DataParallelResult, check_data_parallel
        from trainparity import check_data_parallel as again
    assert check_data_parallel is again is tp.check_parallel and DataParallelResult is tp.ParallelResult
    assert deprecations(caught) == [
        ("tp.DataParallelResult is deprecated: use tp.ParallelResult (the same class)", "test_public_api.py", line),
        ("tp.check_data_parallel is deprecated: use tp.check_parallel (same arguments)", "test_public_api.py", line),
    ]


@pytest.mark.usefixtures("unwarned")
def test_the_old_functions_and_mixin_method_run_the_parallel_check_and_warn_once() -> None:
    """Each old name reaches the parallel check (which refuses world_size=1 before anything runs), and warns once:
    the functions where the name is used, the mixin's method where it is first called."""
    class OldMixinUser(tp.TestCase):  # defined here, so that pytest does not collect it
        def test_old_name(self) -> None:
            for _ in range(2):
                with self.assertRaisesRegex(tp.InvalidArgument, r"world_size= must be an int >= 2"):
                    self.assertDataParallelEquivalent(NeverRuns, world_size=1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for old in ("check_data_parallel", "assert_data_parallel_equivalent"):
            for _ in range(2):
                with pytest.raises(tp.InvalidArgument, match=r"world_size= must be an int >= 2"):
                    getattr(tp, old)(NeverRuns, world_size=1)
        outcome = unittest.TestResult()
        OldMixinUser("test_old_name").run(outcome)
    assert outcome.wasSuccessful(), outcome.errors + outcome.failures
    assert [(message, file) for message, file, _ in deprecations(caught)] == [
        ("tp.check_data_parallel is deprecated: use tp.check_parallel (same arguments)", "test_public_api.py"),
        ("tp.assert_data_parallel_equivalent is deprecated: use tp.assert_parallel_equivalent (same arguments)",
         "test_public_api.py"),
        ("self.assertDataParallelEquivalent is deprecated: use self.assertParallelEquivalent (same arguments)",
         "test_public_api.py"),
    ]
    method = tp.TrainParityMixin.assertDataParallelEquivalent
    assert inspect.signature(method) == inspect.signature(tp.TrainParityMixin.assertParallelEquivalent)
    assert method.__name__ == "assertDataParallelEquivalent" and "deprecated" in (method.__doc__ or "")
