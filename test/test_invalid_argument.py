"""Every misuse of a check's arguments raises tp.InvalidArgument (a TypeError and a ValueError) before anything
runs; the command line's exit status 4 means exactly that, and any other exception of ours is a bug, shown."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

import trainparity as tp
from trainparity import _cli

pytestmark = pytest.mark.exact


class NeverRuns(tp.Recipe):
    """A recipe no misused check may start: it would end in ERROR instead of raising."""

    def setup(self) -> tp.State:
        raise AssertionError("the check ran the recipe before refusing its arguments")

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        raise AssertionError("unreachable")


def _loader() -> torch.utils.data.DataLoader[Any]:
    return torch.utils.data.DataLoader(list(range(4)), batch_size=2)


#: (a misuse, the text its message must hold)
MISUSES: dict[str, tuple[Callable[[], object], str]] = {
    "resume steps as text": (lambda: tp.check_resume(NeverRuns, steps="6"), "steps= must be an int >= 2"),  # type: ignore[arg-type]
    "resume_at out of range": (lambda: tp.check_resume(NeverRuns, steps=4, resume_at=4), "resume_at= must be"),
    "isolation": (lambda: tp.check_resume(NeverRuns, isolation="thread"), "isolation= must be one of"),  # type: ignore[arg-type]
    "timeout": (lambda: tp.check_resume(NeverRuns, timeout=-1), "timeout= must be a positive number"),
    "seed": (lambda: tp.check_resume(NeverRuns, seed=-1), "seed= must be in"),
    "comparison": (lambda: tp.check_resume(NeverRuns, comparison=0.1), "comparison= must be"),  # type: ignore[arg-type]
    "recipe": (lambda: tp.check_resume(int), "is not a tp.Recipe subclass"),  # type: ignore[arg-type]
    "recipe spec": (lambda: tp.check_resume("no.such.module:Recipe"), "no.such.module"),
    "microbatches": (lambda: tp.check_accumulation(NeverRuns, microbatches=1), "microbatches="),
    "cycles": (lambda: tp.check_accumulation(NeverRuns, cycles=0), "cycles= must be an int >= 1"),
    "precision": (lambda: tp.check_accumulation(NeverRuns, precision="float16"), "precision= must be"),  # type: ignore[arg-type]
    "batch_dependent": (lambda: tp.check_accumulation(NeverRuns, batch_dependent="skip"), "batch_dependent="),  # type: ignore[arg-type]
    "split": (lambda: tp.check_accumulation(NeverRuns, split=3), "split= must be a function"),  # type: ignore[arg-type]
    "coverage ranks": (lambda: tp.check_coverage(5, policy=tp.NoCrossRankOverlap()), "ranks= must be a mapping"),  # type: ignore[arg-type]
    "coverage policy": (lambda: tp.check_coverage({0: [[1]]}, policy=[]), "policy= is an empty list"),
    "padding": (lambda: tp.ExpectedPadding(range(3), padding=-1), "padding=...) must be an int >= 0"),
    "world_size": (lambda: tp.check_parallel(NeverRuns, world_size=1), "world_size= must be an int >= 2"),
    "backend": (lambda: tp.check_parallel(NeverRuns, backend=2), "backend= must be a string"),  # type: ignore[arg-type]
    "optimizer coverage steps": (lambda: tp.check_optimizer_coverage(NeverRuns, steps=-1), "steps= must be an int"),
    "frozen globs": (lambda: tp.check_frozen(NeverRuns, frozen=3), "frozen= must be a glob"),  # type: ignore[arg-type]
    "eval_modules": (lambda: tp.check_train_mode(NeverRuns, eval_modules=[""]), "eval_modules= must hold"),
    "training min_decrease": (lambda: tp.check_training(NeverRuns, min_decrease=10), "min_decrease="),
    "training overfit": (lambda: tp.check_training(NeverRuns, overfit="yes"), "overfit= must be True or False"),  # type: ignore[arg-type]
    "worker loader": (lambda: tp.check_worker_randomness(3), "loader= must be a torch.utils.data.DataLoader"),  # type: ignore[arg-type]
    "worker epochs": (lambda: tp.check_worker_randomness(_loader(), epochs=0), "epochs= must be an int >= 1"),
    "script steps": (lambda: tp.check_resume_script("true", "true", steps=1), "steps= must be an int >= 2"),
    "runs steps": (lambda: tp.check_runs_equivalent("true", "true", steps=0), "steps= must be an int >= 1"),
    "abstain": (lambda: tp.assert_coverage({0: [[1]]}, policy=tp.NoCrossRankOverlap(), abstain="x"), "abstain="),  # type: ignore[arg-type]
    "tolerance": (lambda: tp.ToleranceComparison(rtol=-1, atol=0), "must be finite and >= 0"),
    "state entry": (lambda: tp.State(_hidden=1), "must not start with '_'"),
}


@pytest.mark.parametrize("misuse", sorted(MISUSES))
def test_every_misuse_raises_invalid_argument_before_anything_runs(misuse: str) -> None:
    call, text = MISUSES[misuse]
    with pytest.raises(tp.InvalidArgument) as raised:
        call()
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, ValueError)
    assert text in str(raised.value), str(raised.value)


def test_the_command_line_says_usage_error_for_misuse_and_shows_a_bug_of_ours(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "trainparity.quickstarts.resume:Regression"
    assert _cli.main(["resume", spec, "--steps", "1"]) == _cli.USAGE_ERROR
    usage = capsys.readouterr().err
    assert "steps= must be an int >= 2" in usage and "Traceback" not in usage and usage.count("\n") == 1

    def broken(*args: object, **kwargs: object) -> tp.ResumeResult:
        raise KeyError("an internal bug")  # no misuse: a bug of ours must not read as a typo

    monkeypatch.setattr("trainparity.check_resume", broken)  # the command runs the public function
    assert _cli.main(["resume", spec]) == _cli.INTERNAL_ERROR
    shown = capsys.readouterr().err
    assert "Traceback" in shown and "KeyError: 'an internal bug'" in shown
    assert "this is a bug in trainparity" in shown


def test_every_keyword_of_every_check_has_its_option_with_the_checks_default() -> None:
    """The command line's options come from the checks' signatures: a keyword added to a check without its
    option, or an option whose default drifted from the check's, fails here."""
    parser = _cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    checks = _cli.command_checks()
    assert sorted(commands) == sorted(checks)
    for name, functions in checks.items():
        options = {action.dest: action for action in commands[name]._actions}
        # a command of two checks (`equivalent`: recipes or commands) leaves a keyword both take at None: each
        # check keeps its own default
        shared = set.intersection(*(set(inspect.signature(f).parameters) for f in functions)) \
            if len(functions) > 1 else set()
        for check in functions:
            for keyword, parameter in inspect.signature(check).parameters.items():
                if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
                    continue
                if keyword in _cli.EXPRESSED_OTHERWISE:
                    assert keyword not in options, (name, keyword)
                    continue
                assert keyword in options, \
                    f"{name}: check keyword {keyword}= has no option --{keyword.replace('_', '-')}"
                if keyword in shared:
                    assert options[keyword].default is None, (name, keyword, options[keyword].default)
                elif parameter.default is inspect.Parameter.empty:
                    assert options[keyword].required, (name, keyword)
                else:
                    assert options[keyword].default == parameter.default, (name, keyword, options[keyword].default)
