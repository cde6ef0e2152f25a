"""What `mypy --strict` says about code written against trainparity: the examples and a user's test module
type-check cleanly, and the mistakes precise types exist to catch are reported."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]

ROOT = pathlib.Path(__file__).resolve().parent.parent

MISTAKES = '''
import trainparity as tp


class Regression(tp.Recipe):
    pass


class MyState(tp.State):
    step: int


class Narrowed(tp.Recipe):  # narrowing step() needs tp.Recipe[MyState]
    def step(self, state: MyState, batch: object) -> float:
        return 0.0


class TestRegression(tp.TestCase):
    def test_resume(self) -> None:
        self.assertResumeEquivalent(Regression, stepz=3)


tp.assert_resume_equivalent(Regression, stepz=3)
tp.assert_coverage({0: [0]}, policy=tp.ExactlyOnce(range(1)), isolation="spawn")
tp.check_accumulation(Regression, precision="float32")
tp.check_resume(42)
reveal_type(tp.strategies.sampler_configs)
reveal_type(tp.assert_parallel_equivalent(Regression))
reveal_type(tp.assert_data_parallel_equivalent(Regression))  # round 3's name: the same function, to type checkers too
old: tp.DataParallelResult = tp.check_data_parallel(Regression)
'''


def mypy(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *paths], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_a_users_test_module_type_checks() -> None:
    done = mypy("test/typed_user_code.py")
    assert done.returncode == 0, done.stdout + done.stderr


#: torch 2.7's stubs (the tested floor) neither export torch.amp.GradScaler and custom_fwd nor annotate
#: enable_grad, which the examples use as 2.13's stubs type them: there they would need ignores of their own
@pytest.mark.skipif(torch.__version__ < "2.13", reason="the examples type-check against torch 2.13's stubs or later")
def test_the_examples_type_check() -> None:
    done = mypy("examples")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mistakes_are_reported(tmp_path: pathlib.Path) -> None:
    (tmp_path / "mistakes.py").write_text(MISTAKES)
    done = mypy(str(tmp_path / "mistakes.py"))
    lines = [line.split(": ", 1)[1] for line in done.stdout.splitlines()]
    expected = [
        'error: Argument 1 of "step" is incompatible with supertype "trainparity._recipe._recipe.Recipe"; supertype '
        'defines the argument type as "State"  [override]',
        'error: Unexpected keyword argument "stepz"; did you mean "steps"?  [call-arg]',
        'error: Unexpected keyword argument "stepz" for "assert_resume_equivalent"; did you mean "steps"?  '
        '[call-arg]',
        'error: Unexpected keyword argument "isolation" for "assert_coverage"  [call-arg]',
        'error: Argument "precision" to "check_accumulation" has incompatible type "Literal[\'float32\']"; '
        'expected "Literal[\'float64\', \'native\'] | None"  [arg-type]',
        'error: Argument 1 to "check_resume" has incompatible type "int"; expected '
        '"type[Recipe[Any]] | Recipe[Any] | str"  [arg-type]',
        "note: Revealed type is \"def (*, min_dataset_size: int =, max_dataset_size: int =, max_world_size: int =, "
        "min_epochs: int =, max_epochs: int =, max_workers: int =, drop_last: bool | None =, shuffle: bool | None "
        "=) -> hypothesis.strategies._internal.strategies.SearchStrategy[trainparity.strategies.SamplerConfig]\"",
        'note: Revealed type is "trainparity._results._result.ParallelResult"',
    ]
    for line in expected:
        assert line in lines, done.stdout
    assert lines.count('note: Revealed type is "trainparity._results._result.ParallelResult"') == 2, done.stdout
    assert not any("data_parallel" in line or "DataParallel" in line for line in lines), done.stdout

