"""`tp.Result.from_json` reads back what `to_json()` wrote: a result of every check, PASS, FAIL and ERROR, reads
back to its own type with the same JSON and the same report; text `to_json()` did not write is refused, naming
what is wrong, and so is the schema of a newer trainparity."""

from __future__ import annotations

import json
import math
import pathlib
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import equivalent_recipes
import mode_recipes
import pytest
import training_recipes
from data_parallel_recipes import DDPRecipe
from resume_recipes import ResumeRecipe
from test_worker_randomness import ResetsEveryEpoch
from torch.utils.data import DataLoader
from worker_datasets import augment

import trainparity as tp
from trainparity._results._report import SCHEMA_VERSION
from trainparity._results._result import _TYPES
from trainparity.quickstarts import accumulation, mixed_precision, optimizer_coverage
from trainparity.quickstarts import coverage as coverage_quickstart

# What these tests judge is the reading back of each result: the same text twice, no float computed. The
# outcomes asserted only make sure that both PASS and FAIL are read; their recipes' verdicts are judged (and
# rerun under each instruction set) by the checks' own tests.
pytestmark = pytest.mark.exact

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "loop_shapes_train.py"
#: what round 3's `tp.check_data_parallel(DDPRecipe(fault="grads_summed"), steps=1, ...).to_json()` wrote (commit
#: 4ce55ed, before the check was renamed `tp.check_parallel`): its check is "data_parallel"
ROUND_3_DATA_PARALLEL = pathlib.Path(__file__).resolve().parent / "data" / "round3_data_parallel.json"
PARALLEL: dict[str, Any] = {"steps": 1, "comparison": tp.ToleranceComparison(rtol=1e-4, atol=1e-6), "timeout": 60}


def script(*arguments: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--out_dir", "{workdir}", *arguments]


def ranks_reading(rank_of: Callable[[int], int]) -> tp.CoverageResult:
    return tp.check_coverage(coverage_quickstart.epochs_read(rank_of), policy=coverage_quickstart.POLICY,
                             sample_ids=lambda batch: batch[0])


#: "<check function> <what it shows>" -> a cheap call of that check (in process where the check takes it)
CHECKS: dict[str, Callable[[], tp.Result]] = {
    "check_resume pass": lambda: tp.check_resume(ResumeRecipe(), steps=4, resume_at=2, isolation="inprocess"),
    "check_resume fail": lambda: tp.check_resume(ResumeRecipe(fault="scheduler"), steps=4, resume_at=2,
                                                 isolation="inprocess"),
    "check_resume abstain": lambda: tp.check_resume(ResumeRecipe(fault="nondeterministic"), steps=4, resume_at=2,
                                                    isolation="inprocess"),
    "check_resume error": lambda: tp.check_resume(ResumeRecipe(fault="raises"), steps=4, resume_at=2,
                                                  isolation="inprocess"),
    "check_accumulation pass": lambda: tp.check_accumulation(accumulation.Regression, microbatches=2, cycles=1,
                                                             isolation="inprocess"),
    "check_accumulation fail": lambda: tp.check_accumulation(accumulation.ForgetsToScale, microbatches=2,
                                                             cycles=1, isolation="inprocess"),
    "check_coverage pass": lambda: ranks_reading(lambda rank: rank),
    "check_coverage fail": lambda: ranks_reading(lambda rank: 0),
    "check_parallel pass": lambda: tp.check_parallel(DDPRecipe(), **PARALLEL),
    "check_parallel fail": lambda: tp.check_parallel(DDPRecipe(fault="grads_summed"), **PARALLEL),
    "check_optimizer_coverage pass": lambda: tp.check_optimizer_coverage(optimizer_coverage.FineTune),
    "check_optimizer_coverage fail": lambda: tp.check_optimizer_coverage(
        optimizer_coverage.HeadReplacedAfterOptimizer),
    "check_mixed_precision pass": lambda: tp.check_mixed_precision(mixed_precision.AmpRegression, steps=2),
    "check_mixed_precision fail": lambda: tp.check_mixed_precision(mixed_precision.ClipsScaledGradients, steps=2),
    "check_frozen pass": lambda: tp.check_frozen(mode_recipes.FrozenBackbone),
    "check_frozen fail": lambda: tp.check_frozen(mode_recipes.StaleGradient),
    "check_train_mode pass": lambda: tp.check_train_mode(mode_recipes.Training, steps=1),
    "check_train_mode fail": lambda: tp.check_train_mode(mode_recipes.EvalWithoutTrain),
    "check_train_mode error": lambda: tp.check_train_mode(mode_recipes.Raises),
    "check_worker_randomness pass": lambda: tp.check_worker_randomness(augment.loader(num_workers=0)),
    "check_worker_randomness fail": lambda: tp.check_worker_randomness(DataLoader(ResetsEveryEpoch(), batch_size=4)),
    "check_training pass": lambda: tp.check_training(training_recipes.Fit(), steps=3),
    # a NaN loss and gradient norms: telemetry whose JSON holds "nan" strings where floats were
    "check_training fail": lambda: tp.check_training(training_recipes.Fit("nan_batch"), steps=3, update_ratio=True),
    # the scripts' checks start processes that import torch: the fewest that give a PASS and a FAIL
    "check_runs_equivalent pass": lambda: tp.check_runs_equivalent(script(), script(), steps=3, timeout=120),
    "check_runs_equivalent fail": lambda: tp.check_runs_equivalent(script(), script("--shape", "top"), steps=3,
                                                                   timeout=120),
    # check_equivalent's results are RunsResults too: a FAIL whose violations carry a cause and whose config a list
    "check_equivalent fail": lambda: tp.check_equivalent(equivalent_recipes.CheckpointedLM,
                                                         equivalent_recipes.CheckpointedLM(scale=2.0), steps=1),
    # check_resume_script's results are ResumeResults, whose PASS and FAIL check_resume gives above
    "check_resume_script error": lambda: tp.check_resume_script(
        [sys.executable, "-c", "raise SystemExit('no checkpoint here')"],
        [sys.executable, "-c", "pass"], steps=2, resume_at=1, timeout=60),
}


@pytest.fixture(scope="module")
def results() -> dict[str, tp.Result]:
    return {name: make() for name, make in CHECKS.items()}


def test_a_result_of_every_check_reads_back_to_its_type_json_and_report(results: dict[str, tp.Result]) -> None:
    # One test over all of them: with xdist, a second test of this fixture could build it again in another worker.
    checks = {name for name in tp.__all__ if name.startswith("check_")}
    assert {name.split()[0] for name in results} == checks, "add a call of the new check to CHECKS"
    shown = {(type(result), result.outcome) for result in results.values()}
    assert sorted(t.__name__ for t in _TYPES.values() if not {(t, tp.Outcome.PASS), (t, tp.Outcome.FAIL)} <= shown
                  ) == [], "add a PASS and a FAIL of the new result type to CHECKS"
    assert {tp.Outcome.ABSTAIN, tp.Outcome.ERROR} <= {outcome for _, outcome in shown}
    differences = []
    for name, result in results.items():
        text = result.to_json()
        read = tp.Result.from_json(text)
        own = type(result).from_json(text)  # on its own type too
        if type(read) is not type(result) or type(own) is not type(result):
            differences.append(f"{name}: read a {type(read).__name__}, a {type(own).__name__}")
        for what, original, again in [
            ("to_json()", text, read.to_json()),
            ("to_json() of bytes", text, tp.Result.from_json(text.encode()).to_json()),
            ("report()", result.report(), read.report()),
            ("repr()", repr(result), repr(read)),
            ("to_json() read with include_environment", text,
             tp.Result.from_json(result.to_json(include_environment=True)).to_json()),
        ]:
            if original != again:
                differences.append(f"{name}: {what} differs")
        environment = result.to_json(include_environment=True)
        if tp.Result.from_json(environment).to_json(include_environment=True) != environment:
            differences.append(f"{name}: to_json(include_environment=True) differs")
        if read.exception is not None:
            differences.append(f"{name}: the live exception was kept")
        for index, violation in enumerate(result.violations):
            if json.dumps(tp.Violation.from_dict(violation.to_dict()).to_dict()) != json.dumps(violation.to_dict()):
                differences.append(f"{name}: violation {index} differs through from_dict")
        if result.error is not None and tp.ChildError.from_dict(result.error.to_dict()) != result.error:
            differences.append(f"{name}: the error differs through from_dict")
        if isinstance(result, tp.TrainingResult):
            assert isinstance(read, tp.TrainingResult)
            if read.table() != result.table() or json.dumps(read.losses) != json.dumps(result.losses):
                differences.append(f"{name}: the training table or losses differ")
    assert differences == []
    # the live exception (in process) stays behind; the error that describes it reads back
    errored = results["check_resume error"]
    read = tp.Result.from_json(errored.to_json())
    assert isinstance(errored.exception, ValueError) and read.exception is None
    # (its traceback's paths as the JSON has them: relative to the working directory)
    assert read.error is not None and errored.error is not None and read.error.headline() == errored.error.headline()
    # the telemetry's NaN (JSON's string "nan") is a float again
    training = tp.TrainingResult.from_json(results["check_training fail"].to_json())
    assert any(isinstance(loss, float) and math.isnan(loss) for loss in training.losses), training.losses


@pytest.fixture(scope="module")
def coverage() -> tp.CoverageResult:
    return tp.check_coverage({0: [[0, 1]], 1: [[1, 2]]}, policy=tp.ExactlyOnce(range(4)))


def test_a_result_type_refuses_another_check_s_json(coverage: tp.CoverageResult) -> None:
    assert type(tp.CoverageResult.from_json(coverage.to_json())) is tp.CoverageResult
    with pytest.raises(ValueError, match=r"^the JSON is a coverage check's result \(CoverageResult\), not a "
                                         r"ResumeResult: read it with tp.Result.from_json"):
        tp.ResumeResult.from_json(coverage.to_json())


def test_a_newer_schema_is_refused_with_what_to_do(coverage: tp.CoverageResult) -> None:
    document = json.loads(coverage.to_json())
    document.update(schema_version=SCHEMA_VERSION + 1, trainparity_version="99.0")
    with pytest.raises(ValueError, match=rf"schema_version {SCHEMA_VERSION + 1} \(written by trainparity 99.0\), "
                                         rf"newer than trainparity {tp.__version__} reads .*upgrade trainparity"):
        tp.Result.from_json(json.dumps(document))


def test_round_3_json_of_the_renamed_data_parallel_check_reads_to_a_parallel_result() -> None:
    text = ROUND_3_DATA_PARALLEL.read_text().removesuffix("\n")
    assert json.loads(text)["check"] == "data_parallel"
    for reader in (tp.Result, tp.ParallelResult):
        read = reader.from_json(text)
        assert type(read) is tp.ParallelResult, reader
        # everything as round 3 wrote it (its version included) but the check's name, now the new one
        assert read.to_json() == text.replace('"check": "data_parallel"', '"check": "parallel"')
        assert read.report().startswith(
            "trainparity parallel check: FAIL at gradients.fc1.weight (loss_not_averaged, step 1, rank 0)\n")
        assert read.recorded is not None and read.recorded.trainparity_version == "0.1.0"
    with pytest.raises(ValueError, match=r"^the JSON is a parallel check's result \(ParallelResult\), not a "
                                         r"ResumeResult"):
        tp.ResumeResult.from_json(text)
    # the old name is read, not known as a check of its own
    assert "data_parallel" not in _TYPES


def test_the_version_and_environment_read_are_written_again(coverage: tp.CoverageResult) -> None:
    """A result read from JSON says where it was made, not where it was read: an older trainparity's version, and
    the environment of the check's run (null where the JSON did not record one)."""
    document = json.loads(coverage.to_json(include_environment=True))
    document.update(trainparity_version="0.0.1", environment={"python": "3.11.0", "torch": "2.5.0", "cwd": "/x",
                                                               "pid": 7})
    text = json.dumps(document, sort_keys=True, indent=2)
    read = tp.Result.from_json(text)
    assert read.to_json(include_environment=True) == text
    assert json.loads(read.to_json())["trainparity_version"] == "0.0.1" and "environment" not in read.to_json()
    assert read.recorded is not None and read.recorded.environment == document["environment"]
    assert json.loads(tp.Result.from_json(coverage.to_json()).to_json(include_environment=True))["environment"] is None
    assert coverage.recorded is None  # a result a check returned


def _edited(text: str, edit: Callable[[dict[str, Any]], object]) -> str:
    document = json.loads(text)
    edit(document)
    return json.dumps(document)


MALFORMED: list[tuple[Callable[[dict[str, Any]], object], str]] = [
    (lambda d: d.pop("schema_version"), r"it lacks 'schema_version'"),
    (lambda d: d.update(schema_version="1"), r"'schema_version' must be an integer, got '1'"),
    (lambda d: d.update(schema_version=0), r"schema_version 0 \(versions start at 1\)"),
    (lambda d: (d.pop("counts"), d.pop("notes")), r"it lacks 'counts', 'notes'"),
    (lambda d: d.update(check="unheard_of"), r"unknown check 'unheard_of' \(this trainparity knows .*resume"),
    (lambda d: d.update(outcome="MAYBE"), r"'outcome' must be one of PASS, FAIL, ABSTAIN, ERROR, got 'MAYBE'"),
    (lambda d: d.update(config=[]), r"'config' must be an object, got \[\]"),
    (lambda d: d.update(notes=[1]), r"'notes' must be a list of strings"),
    (lambda d: d["violations"][1].pop("path"), r"violations\[1\] \(Violation\) lacks 'path'"),
    (lambda d: d["violations"][0].update(colour="red"), r"violations\[0\] \(Violation\) has unknown fields 'colour'"),
    (lambda d: d["violations"][0].update(step="3"), r"violations\[0\] \(Violation\): step must be int \| None"),
    (lambda d: d["violations"].pop(), r"'counts' disagrees with 'violations'"),
    (lambda d: d.update(first_violation=None), r"'first_violation' disagrees with 'violations'"),
    (lambda d: d.update(error={"kind": "raised"}), r"'error' \(ChildError\) lacks 'phase', 'message'"),
    (lambda d: d.update(telemetry=[]), r"a CoverageResult has no field 'telemetry'"),
]


@pytest.mark.parametrize(("edit", "message"), MALFORMED)
def test_text_to_json_did_not_write_is_refused_naming_what_is_wrong(
        coverage: tp.CoverageResult, edit: Callable[[dict[str, Any]], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tp.Result.from_json(_edited(coverage.to_json(), edit))


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", b"\xff"])
def test_what_is_not_a_json_object_is_refused(text: str | bytes) -> None:
    with pytest.raises(ValueError, match="^not a trainparity result's JSON: "):
        tp.Result.from_json(text)


def test_a_training_result_s_telemetry_is_required_and_checked() -> None:
    text = tp.check_training(training_recipes.Fit(), steps=2).to_json()
    with pytest.raises(ValueError, match=r"a TrainingResult lacks 'telemetry'"):
        tp.Result.from_json(_edited(text, lambda d: d.pop("telemetry")))
    with pytest.raises(ValueError, match=r"telemetry\[1\] \(TrainingStep\) lacks 'loss'"):
        tp.Result.from_json(_edited(text, lambda d: d["telemetry"][1].pop("loss")))
    with pytest.raises(ValueError,
                       match=r"telemetry\[0\] \(TrainingStep\): updates\[0\] \(Update\) has unknown fields 'colour'"):
        tp.Result.from_json(_edited(text, lambda d: d["telemetry"][0]["updates"][0].update(colour="red")))


def test_two_result_types_cannot_name_the_same_check() -> None:
    with pytest.raises(TypeError, match="both name the check 'resume'"):
        class Another(tp.Result):
            check: ClassVar[str] = "resume"
    assert _TYPES["resume"] is tp.ResumeResult


def test_an_error_naming_absolute_paths_reads_back_the_same_here_and_elsewhere(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JSON holds the error's paths relative to the working directory where it was written (the reason, like
    the violations, as it was); the report, which shows all of them relative, reads the same back, and the JSON
    reads back the same in another working directory, where nothing is made relative again."""
    here, elsewhere = pathlib.Path.cwd() / "x.pt", tmp_path / "sub" / "x.pt"
    error = tp.ChildError("raised", "baseline", f"no file {here} nor {elsewhere}", "FileNotFoundError",
                          f'  File "{here.parent / "train.py"}", line 3, in <module>\n')
    result = tp.ResumeResult.errored(error, {"steps": 2})
    text = result.to_json()
    message = json.loads(text)["error"]["message"]
    assert str(here) not in message and str(elsewhere) in message
    assert tp.Result.from_json(text).report() == result.report()
    monkeypatch.chdir(tmp_path)
    assert tp.Result.from_json(text).to_json() == text


def test_a_violation_and_an_error_read_alone() -> None:
    """Fields with a default may be left out (None: it does not apply); anything else is refused by name."""
    assert tp.Violation.from_dict({"kind": "k", "path": "p", "message": "m"}) == tp.Violation("k", "p", "m")
    died = tp.ChildError("died", "rank 1", "signal 9", exitcode=-9, signal="SIGKILL", rank=1)
    assert tp.ChildError.from_dict(died.to_dict()) == died
    with pytest.raises(ValueError, match=r"^violation \(Violation\) lacks 'message'$"):
        tp.Violation.from_dict({"kind": "k", "path": "p"})
    with pytest.raises(ValueError, match=r"^error \(ChildError\): rank must be int \| None, got True$"):
        tp.ChildError.from_dict({**died.to_dict(), "rank": True})
    with pytest.raises(ValueError, match=r"^violation: expected a JSON object, got list$"):
        tp.Violation.from_dict([])  # type: ignore[arg-type]
