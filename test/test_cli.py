"""`python -m trainparity`: exit codes, reports, JSON, and one-line usage errors."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from trainparity._cli import main

HERE = pathlib.Path(__file__).parent


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainparity", *args], cwd=HERE, capture_output=True, text=True, timeout=300
    )


def test_exit_status_and_json_from_a_real_process(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "result.json"
    done = run_cli("resume", "resume_recipes:ForgetsScheduler", "--steps", "4", "--resume-at", "2",
                   "--json", str(target))
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("trainparity resume check: FAIL\n")
    assert json.loads(target.read_text())["first_violation"]["path"] == "scheduler.last_epoch"


def test_bad_spec_is_one_line_without_traceback() -> None:
    done = run_cli("resume", "resume_recipes:NoSuchRecipe")
    assert done.returncode == 4
    assert done.stderr == (
        "python -m trainparity resume: error: module 'resume_recipes' has no attribute 'NoSuchRecipe'\n"
    )
    assert done.stdout == ""


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["resume", "resume_recipes:ResumeRecipe", "--resume-at", "9"], "resume_at= must be an int in 1..5"),
        (["resume", "resume_recipes.ResumeRecipe"], "looks like 'package.module:ClassName'"),
        (["resume", "resume_recipes:report_identity"], "is not a tp.Recipe subclass"),
        (["resume", "no_such_module:Recipe"], "cannot import module 'no_such_module'"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_argument_errors_exit_4() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["resume"])
    assert caught.value.code == 4


def test_unwritable_json_path_is_a_usage_error(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "result.json"
    argv = ["resume", "resume_recipes:ResumeRecipe", "--steps", "3", "--isolation", "inprocess", "--json", str(target)]
    assert main(argv) == 4
    out, err = capsys.readouterr()
    assert out.startswith("trainparity resume check: PASS\n")
    assert err == (f"python -m trainparity resume: error: cannot write --json {target}: No such file or directory; "
                   "pass a path in an existing, writable directory\n")
