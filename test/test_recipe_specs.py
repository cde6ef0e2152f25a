"""Recipe specs (`module:Class(k=1)`, `path/file.py:Class`) and how a fresh process finds a recipe's module."""

from __future__ import annotations

import pathlib
import pickle
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest

import trainparity as tp
from trainparity._recipe._modules import import_attribute
from trainparity._recipe._reference import RecipeRef, resolve_recipe
from trainparity._recipe._spec import Spec, SpecError, parse_spec

pytestmark = pytest.mark.exact

HERE = pathlib.Path(__file__).resolve().parent
RECIPE_SOURCE = '''
import trainparity as tp


class Counted(tp.Recipe):
    def __init__(self, start=0, label="x"):
        self.start, self.label = start, label
'''


@pytest.fixture
def restored_modules() -> Iterator[None]:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_literal_arguments_are_parsed_without_evaluating_code() -> None:
    assert parse_spec('pkg.mod:Outer.Inner(1, (2, 3), k={"a": [None]}, name="a:b", flag=True)') == Spec(
        'pkg.mod:Outer.Inner(1, (2, 3), k={"a": [None]}, name="a:b", flag=True)', "pkg.mod", "Outer.Inner",
        (1, (2, 3)), {"k": {"a": [None]}, "name": "a:b", "flag": True})
    assert parse_spec("dir/recipes.py:Recipe") == Spec("dir/recipes.py:Recipe", "dir/recipes.py", "Recipe")


@pytest.mark.parametrize("text", ["module", "module:", ":Recipe", "m:Recipe(", "m:1", "m:Recipe()()",
                                  "m:Recipe(x=__import__('os'))", "m:Recipe(**extra)", "m:Recipe(*extra)"])
def test_malformed_specs_are_refused(text: str) -> None:
    with pytest.raises(SpecError):
        parse_spec(text)


def test_the_name_a_report_prints_is_a_spec_that_builds_the_same_recipe() -> None:
    from resume_recipes import ResumeRecipe

    ref = resolve_recipe(ResumeRecipe(fault="ema", use_python_random=False))
    assert ref.name == "resume_recipes:ResumeRecipe(fault='ema', use_python_random=False)"
    assert resolve_recipe(ref.name) == ref
    built = resolve_recipe(ref.name).build()
    assert isinstance(built, ResumeRecipe) and (built.fault, built.use_python_random) == ("ema", False)


def test_a_file_spec_whose_name_imports_another_module_loads_the_file(tmp_path: pathlib.Path,
                                                                       restored_modules: None) -> None:
    (tmp_path / "json.py").write_text(RECIPE_SOURCE)  # `import json` is the standard library's
    ref = resolve_recipe(f"{tmp_path / 'json.py'}:Counted(start=3)")
    assert ref.name == "json:Counted(start=3)"
    assert ref.module.startswith("__trainparity_") and ref.file == str(tmp_path / "json.py")
    recipe = ref.build()
    assert type(recipe).__name__ == "Counted" and recipe.start == 3  # type: ignore[attr-defined]


def test_a_fresh_process_loads_a_module_it_cannot_import_by_name_from_its_file(tmp_path: pathlib.Path) -> None:
    # pytest's --import-mode=importlib imports test modules under names that are not importable
    (tmp_path / "recipes.py").write_text(RECIPE_SOURCE)
    ref = RecipeRef("project.tests.recipes", "Counted", str(tmp_path / "recipes.py"), pickle.dumps(((), {"start": 5})))
    probe = ("import pickle, sys; ref = pickle.loads(sys.stdin.buffer.read()); recipe = ref.build(); "
             "print(type(recipe).__module__, recipe.start)")
    done = subprocess.run([sys.executable, "-c", probe], input=pickle.dumps(ref), capture_output=True, timeout=120,
                          cwd=tmp_path.parent)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["project.tests.recipes", "5"]


def test_a_module_already_imported_is_found_even_when_its_package_does_not_import(restored_modules: None) -> None:
    module = types.ModuleType("tests_under_importlib.test_training")  # as pytest registers it, without parent
    module.split_in_two = len  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    assert import_attribute(module.__name__, "split_in_two") is len


def test_without_a_file_a_module_that_does_not_import_is_an_import_error() -> None:
    ref = RecipeRef("project.tests.recipes", "Counted", None, pickle.dumps(((), {})))
    with pytest.raises(ModuleNotFoundError):
        ref.build()


def test_a_module_importable_by_name_is_imported_not_executed_again() -> None:
    import resume_recipes

    ref = resolve_recipe("resume_recipes:ResumeRecipe")
    assert ref.file == str(pathlib.Path(resume_recipes.__file__).resolve())
    assert ref.recipe_class() is resume_recipes.ResumeRecipe


def test_a_recipe_spec_that_is_not_a_recipe_class_or_cannot_be_built() -> None:
    with pytest.raises(TypeError, match="is not a tp.Recipe subclass"):
        tp.check_resume("resume_recipes:Net")
    with pytest.raises(TypeError, match=r"could not be built: .*unexpected keyword argument 'colour'"):
        tp.check_resume("resume_recipes:ResumeRecipe(colour='red')")
    with pytest.raises(SpecError, match="no such file 'missing.py'"):
        tp.check_resume("missing.py:Recipe")


def test_a_typed_state_subclass_is_a_state() -> None:
    class CountedState(tp.State):
        step: int

    state = CountedState(step=1)
    assert list(state) == ["step"] and repr(state) == "CountedState(step=int)"
    assert tp.Recipe[CountedState] is not tp.Recipe  # generic over its State type at run time too


CONFIGURED_SCRIPT = '''
import dataclasses
import enum
import sys

import torch

import trainparity as tp


class Optimizer(enum.Enum):
    SGD = "sgd"


@dataclasses.dataclass
class Config:
    lr: float
    optimizer: Optimizer = Optimizer.SGD


class Configured(tp.Recipe):
    def __init__(self, config: Config) -> None:
        self.config = config

    def setup(self) -> tp.State:
        if self.config.optimizer is not Optimizer.SGD:  # the class's own enum, wherever it was rebuilt
            raise TypeError(f"not this module's Optimizer: {type(self.config.optimizer)}")
        model = torch.nn.Linear(2, 1)
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=self.config.lr), step=0)

    def batches(self, state):
        while True:
            yield torch.ones(4, 2) * state.step

    def step(self, state, batch):
        loss = state.model(batch).pow(2).mean()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.step += 1
        return loss.detach()


if __name__ == "__main__":
    for isolation in sys.argv[1:]:
        print(f"--- {isolation}")
        print(tp.check_resume(Configured(Config(lr=0.1)), isolation=isolation, timeout=120).report())
'''


@pytest.mark.parametrize("as_module", [False, True], ids=["python script.py", "python -m script"])
def test_a_script_s_recipe_built_from_the_script_s_own_objects_gets_them_wherever_it_is_rebuilt(
        tmp_path: pathlib.Path, as_module: bool) -> None:
    (tmp_path / "configured.py").write_text(CONFIGURED_SCRIPT)
    program = ["-m", "configured"] if as_module else ["configured.py"]
    isolations = ["process", "spawn", "inprocess"]  # one script checks in each: one interpreter, not three
    done = subprocess.run([sys.executable, *program, *isolations], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    reports = done.stdout.split("--- ")[1:]
    assert [report.split("\n", 1)[0] for report in reports] == isolations, done.stdout
    for report in reports:
        assert report.split("\n", 1)[1].startswith("trainparity resume check: PASS\n"), done.stdout
        assert "Config(lr=0.1, optimizer=<Optimizer.SGD: 'sgd'>)" in report, done.stdout
