"""`python -m trainparity`: exit codes, reports, JSON, and one-line usage errors."""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import subprocess
import sys

import pytest
import torch

import trainparity as tp
from trainparity import _deprecated
from trainparity._cli import build_parser, main

HERE = pathlib.Path(__file__).parent


def run_cli(*args: str, cwd: pathlib.Path = HERE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainparity", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.exact
def test_exit_status_and_json_from_a_real_process(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "result.json"
    done = run_cli("resume", "resume_recipes:ForgetsScheduler", "--steps", "4", "--resume-at", "2",
                   "--json", str(target))
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("trainparity resume check: FAIL at scheduler.last_epoch (not_restored, step ")
    assert json.loads(target.read_text())["first_violation"]["path"] == "scheduler.last_epoch"


@pytest.mark.exact
def test_bad_spec_is_one_line_without_traceback() -> None:
    done = run_cli("resume", "resume_recipes:NoSuchRecipe")
    assert done.returncode == 4
    assert done.stderr == (
        "python -m trainparity resume: error: module 'resume_recipes' has no attribute 'NoSuchRecipe'\n"
    )
    assert done.stdout == ""


@pytest.mark.exact
@pytest.mark.parametrize(
    ("argv", "status", "headline"),
    [
        (["resume", "resume_recipes:ResumeRecipe", "--steps", "3"], 0, "trainparity resume check: PASS"),
        (["resume", "resume_recipes:Nondeterministic", "--steps", "3"], 2, "trainparity resume check: ABSTAIN"),
        (["resume", "resume_recipes:Raises", "--steps", "3"], 3, "trainparity resume check: ERROR"),
    ],
)
def test_exit_status_per_outcome(
    argv: list[str], status: int, headline: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == status
    assert capsys.readouterr().out.startswith(headline + "\n")


@pytest.mark.exact
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["resume", "resume_recipes:ResumeRecipe", "--resume-at", "9"], "resume_at= must be an int in 1..5"),
        (["resume", "resume_recipes.ResumeRecipe"], "looks like 'package.module:ClassName'"),
        (["resume", "resume_recipes:report_identity"], "is not a tp.Recipe subclass"),
        (["resume", "no_such_module:Recipe"], "cannot import module 'no_such_module'"),
        (["resume", "resume_recipes:ResumeRecipe", "--world-size", "0"], "world_size= must be an int >= 1"),
        (["resume", "resume_recipes:ResumeRecipe", "--world-size", "2", "--isolation", "inprocess"],
         "cannot run a world of ranks"),
        (["resume", "parallel_recipes:WideDDPRecipe", "--world-size", "2", "--resume-world-size", "1"],
         "needs WideDDPRecipe's own save() and load()"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.exact
def test_argument_errors_exit_4() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["resume"])
    assert caught.value.code == 4


@pytest.mark.exact
@pytest.mark.parametrize("target", ["missing/result.json", "."])
def test_unusable_json_path_is_refused_before_the_check_runs(
    target: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / target
    # The recipe raises: had the check run, the exit status would be 3 and the report printed.
    argv = ["resume", "resume_recipes:Raises", "--steps", "3", "--isolation", "inprocess", "--json", str(path)]
    assert main(argv) == 4
    out, err = capsys.readouterr()
    assert out == ""
    why = "No such file or directory" if target != "." else "Is a directory"
    assert err == (f"python -m trainparity resume: error: cannot write --json {path}: {why}; "
                   "pass a path in an existing, writable directory\n")


@pytest.mark.exact
def test_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    versions = f"torch {torch.__version__}, Python {platform.python_version()}"
    assert done.stdout == f"trainparity {tp.__version__} ({versions})\n"


@pytest.mark.exact
def test_help_lists_exit_codes_and_explains_every_option(cli_commands: dict[str, argparse.ArgumentParser]) -> None:
    assert set(cli_commands) == {"resume", "resume-script", "equivalent", "accumulation", "parallel",
                                 "coverage", "optimizer-coverage", "mixed-precision", "frozen", "train-mode",
                                 "worker-randomness", "training"}
    for name, command in [("python -m trainparity", build_parser()), *cli_commands.items()]:
        text = command.format_help()
        for status, outcome in [(0, "PASS"), (1, "FAIL"), (2, "ABSTAIN"), (3, "ERROR"), (4, "usage error")]:
            assert f"  {status}  {outcome}" in text, (name, text)
        undocumented = [a.dest for a in command._actions
                        if not a.help and not isinstance(a, argparse._SubParsersAction)]
        assert undocumented == [], name


@pytest.mark.exact
def test_spec_with_constructor_arguments_is_the_form_reports_print(capsys: pytest.CaptureFixture[str]) -> None:
    spec = "resume_recipes:ResumeRecipe(fault='ema', use_python_random=False)"
    assert main(["resume", spec, "--steps", "3", "--isolation", "inprocess"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("trainparity resume check: FAIL at ema (not_restored, step 1)\n")
    assert f"recipe={spec!r}" in out  # the report's form of the recipe is a spec the command line takes


@pytest.mark.exact
def test_file_path_spec_is_rebuilt_in_fresh_processes_from_another_directory(tmp_path: pathlib.Path) -> None:
    """Also the fault of test_resume.py's test_other_isolations_agree, found under spawn."""
    target = tmp_path / "result.json"
    done = run_cli("resume", f"{HERE / 'resume_recipes.py'}:ResumeRecipe(fault='scheduler')", "--steps", "4",
                   "--resume-at", "2", "--isolation", "spawn", "--json", str(target), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("trainparity resume check: FAIL at scheduler.last_epoch (not_restored, step 2)\n")
    assert "recipe=\"resume_recipes:ResumeRecipe(fault='scheduler')\"" in done.stdout
    first = tp.ResumeResult.from_json(target.read_text()).first_violation
    assert first is not None and first.path == "scheduler.last_epoch"


@pytest.mark.exact
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("resume_recipes:ResumeRecipe(fault=print('x'))", "argument print('x') in "),
        ("resume_recipes:ResumeRecipe(**kwargs)", "*args and **kwargs are not literals"),
        ("resume_recipes:ResumeRecipe(colour='red')", "could not be built: "),
        ("resume_recipes:ResumeRecipe(fault='no such fault')", "unknown fault 'no such fault'"),
        ("missing/recipes.py:Recipe", "no such file 'missing/recipes.py'"),
    ],
)
def test_bad_constructor_arguments_and_paths_are_usage_errors(
    spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["resume", spec]) == 4
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.exact
@pytest.mark.parametrize(
    ("source", "exc_type", "line"),
    [("value = (\n", "SyntaxError", "value = ("), ("raise RuntimeError('no config file')\n", "RuntimeError",
                                                    "raise RuntimeError('no config file')")],
)
def test_a_recipe_module_that_cannot_be_imported_is_an_error(
    source: str, exc_type: str, line: str, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "broken_recipes.py").write_text("import trainparity as tp\n" + source)
    for spec in ("broken_recipes:Recipe", "broken_recipes.py:Recipe"):
        done = run_cli("accumulation", spec, cwd=tmp_path)
        assert done.returncode == 3, done.stderr
        assert done.stderr == ""
        assert done.stdout.startswith(f"trainparity accumulation check: ERROR\nconfig: recipe='{spec}'\n"
                                      f"reason: import: the recipe raised {exc_type}: ")
        traceback = done.stdout.split("Traceback from the recipe:\n", 1)[1]
        assert 'File "broken_recipes.py", line 2' in traceback and line in traceback
        assert "importlib" not in traceback and "trainparity" not in traceback, traceback


@pytest.mark.exact
@pytest.mark.parametrize(
    ("function", "status", "headline"),
    [
        ("coverage_sources:two_ranks", 0, "trainparity coverage check: PASS"),
        ("coverage_sources:two_ranks(overlap=True)", 1,
         "trainparity coverage check: FAIL at coverage.cross_rank_duplicate (epoch 0, rank 1, sample 0)"),
        ("coverage_sources:records", 0, "trainparity coverage check: PASS"),
        ("coverage_sources:raises", 3, "trainparity coverage check: ERROR"),
    ],
)
def test_coverage_command(function: str, status: int, headline: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coverage", function]) == status
    out = capsys.readouterr().out
    assert out.startswith(headline + "\n"), out
    if status == 3:
        assert "reason: raises(): the recipe raised RuntimeError: the shards could not be listed" in out


@pytest.mark.exact
def test_coverage_command_writes_json_and_bounds_violations(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "coverage.json"
    done = run_cli("coverage", "coverage_sources:two_ranks(overlap=True)", "--max-violations", "1", "--json",
                   str(target))
    assert done.returncode == 1, done.stderr
    document = json.loads(target.read_text())
    assert (document["check"], len(document["violations"])) == ("coverage", 1)


@pytest.mark.exact
@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("coverage_sources:returns_a_list", "must return (ranks, policy) or (ranks, policy, sample_ids), got list"),
        ("coverage_sources:NOT_A_FUNCTION", "'coverage_sources:NOT_A_FUNCTION' is not a function (got int)"),
        ("coverage_sources:no_such_function", "module 'coverage_sources' has no attribute 'no_such_function'"),
        ("coverage_sources", "a spec looks like 'package.module:function'"),
    ],
)
def test_coverage_command_usage_errors(function: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coverage", function]) == 4
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.exact
def test_resume_command_on_a_world_of_ranks(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "result.json"
    status = main(["resume", "parallel_recipes:WideDDPRecipe", "--world-size", "2", "--steps", "4",
                   "--timeout", "120", "--json", str(target)])
    out = capsys.readouterr().out
    assert status == 0 and out.startswith("trainparity resume check: PASS"), out
    config = json.loads(target.read_text())["config"]
    assert (config["world_size"], config["resume_world_size"], config["backend"]) == (2, 2, "gloo"), config


@pytest.mark.numeric
def test_parallel_command(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "result.json"
    status = main(["parallel", "data_parallel_recipes:DDPRecipe(fault='no_ddp')", "--steps", "1",
                   "--timeout", "120", "--json", str(target)])
    printed = capsys.readouterr()
    assert status == 1, printed.out + printed.err
    assert printed.out.startswith("trainparity parallel check: FAIL at gradients.")
    assert printed.err == ""
    written = json.loads(target.read_text())
    assert written["check"] == "parallel" and written["first_violation"]["cause"] == "grads_not_synchronized"


@pytest.mark.exact
def test_the_old_data_parallel_command_runs_the_parallel_command_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Round 3's `data-parallel` is `parallel` (here refusing --world-size 1 before anything runs), with one line on
    stderr the first time in a process; it is in no help text."""
    monkeypatch.setattr(_deprecated, "_used", set())  # as if no old name had been used in this process
    argv = ["data-parallel", "data_parallel_recipes:DDPRecipe", "--world-size", "1"]
    refused = "python -m trainparity parallel: error: world_size= must be an int >= 2"
    assert main(argv) == 4
    first = capsys.readouterr().err.splitlines()
    assert first[0] == ("python -m trainparity data-parallel is deprecated: use python -m trainparity parallel "
                        "(same arguments)")
    assert [line.startswith(refused) for line in first] == [False, True], first
    assert main(argv) == 4
    again = capsys.readouterr().err.splitlines()
    assert [line.startswith(refused) for line in again] == [True], again
    assert "data-parallel" not in build_parser().format_help()


@pytest.mark.exact
def test_frozen_and_train_mode_commands_from_a_real_process(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "result.json"
    done = run_cli("frozen", "mode_recipes:BackboneInTrainMode", "--steps", "1", "--isolation", "spawn",
                   "--timeout", "120", "--json", str(target))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(
        "trainparity frozen check: FAIL at buffers.backbone.1.running_mean (frozen_module_in_train_mode, step 1)\n")
    assert json.loads(target.read_text())["first_violation"]["kind"] == "frozen_buffer_changed"
    done = run_cli("train-mode", "mode_recipes:FrozenBackbone", "--eval-modules", "backbone", "--json", str(target))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(target.read_text())["config"]["eval_modules"] == ["backbone"]


@pytest.mark.exact
def test_worker_randomness_command_from_a_real_process(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "workers.json"
    done = run_cli("worker-randomness", "worker_datasets:augmented(fault='generator_built_in_init')", "--epochs", "1",
                   "--batches", "4", "--timeout", "120", "--json", str(target))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("trainparity worker_randomness check: FAIL at dataset.augment.shift.rng "
                                  "(worker_rng_shared, epoch 0)\n")
    document = json.loads(target.read_text())
    assert document["config"] == {"batches": 4, "dataset": "AugmentedImages", "epochs": 1, "num_workers": 2,
                                  "persistent_workers": False}
    assert (document["first_violation"]["worker"], document["counts"]) == (1, {"worker_rng_shared": 2})


@pytest.mark.numeric
def test_mixed_precision_command_takes_the_autocast_options(tmp_path: pathlib.Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "amp.json"
    status = main(["mixed-precision", "autocast_recipes:Float32Head", "--steps", "1", "--allow-float32", "head",
                   "--json", str(target)])
    assert status == 0, capsys.readouterr().out
    assert json.loads(target.read_text())["config"]["allow_float32"] == ["head"]


@pytest.mark.numeric
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")  # the fault's order, on purpose
def test_training_command_prints_the_report_then_the_table(tmp_path: pathlib.Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "result.json"
    assert main(["training", "training_recipes:Fit('scheduler_before_optimizer')", "--steps", "3",
                 "--lr-schedule", "training_recipes:learning_rate", "--update-ratio", "default",
                 "--max-grad-norm", "50", "--json", str(target)]) == 1
    out = capsys.readouterr().out
    report, _, table = out.partition("\nstep  loss")
    assert report.startswith("trainparity training check: FAIL at optimizer.param_groups.0.lr (lr_mismatch, step 1)")
    assert len(table.strip().splitlines()) == 4  # the header's rest, then 3 steps
    document = json.loads(target.read_text())
    assert document["config"]["update_ratio"] == [1e-05, 0.1] and len(document["telemetry"]) == 3
    assert main(["training", "training_recipes:Fit", "--steps", "3", "--lr-schedule", "0.0033333333333333335,"
                 "0.006666666666666667,0.01", "--max-skipped-steps", "0"]) == 0
    assert main(["training", "training_recipes:Fit", "--steps", "12", "--min-decrease", "0.1", "--window", "2"]) == 0
    assert main(["training", "training_recipes:Fit('lr_zero')", "--steps", "10", "--overfit"]) == 1


@pytest.mark.exact
@pytest.mark.parametrize(("argv", "message"), [
    (["--update-ratio", "0.1"], "expected LOW,HIGH such as 1e-4,1e-2, or default"),
    (["--lr-schedule", "fast"], "--lr-schedule: expected comma-separated learning rates"),
    (["--lr-schedule", "training_recipes:LR"], "--lr-schedule 'training_recipes:LR' is not a function"),
    (["--window", "3"], "window= sizes the windows min_decrease= compares"),
])
def test_training_command_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    # in this process: test_bad_spec_is_one_line_without_traceback checks a real process's one-line error
    with pytest.raises(SystemExit) as caught:
        raise SystemExit(main(["training", "training_recipes:Fit", *argv]))
    err = capsys.readouterr().err
    assert caught.value.code == 4 and message in err and err.count("\n") == 1, err
