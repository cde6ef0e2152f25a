"""The package's layout: one subpackage per concept, imports that run one way, files a reader can hold.

Read from the source with `ast` (every import counts: at module level, inside functions, and under
`if TYPE_CHECKING:`), so that a circle hidden in a lazy import is caught too.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import trainparity

pytestmark = pytest.mark.exact

PACKAGE = pathlib.Path(trainparity.__file__).resolve().parent
#: the public faces and the one-concept modules that stand at the top of the package
TOP_LEVEL = {"__init__", "__main__", "probe", "strategies", "_version", "_assertions", "_testing", "_cli",
             "_pytest_plugin", "_compat", "_validation", "_records", "_deprecated"}
#: no file longer than this many lines
MOST_LINES = 600


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_modules() -> dict[str, pathlib.Path]:
    """`trainparity._x._y` -> file, for every private module (the public faces import everything by design)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if any(part.startswith("_") and not part.startswith("__") for part in name.split(".")[1:]):
            found[name] = path
    return found


def imports_of(path: pathlib.Path, known: set[str]) -> set[str]:
    """The private trainparity modules `path` imports, however and wherever it imports them."""
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            # `from trainparity._process import _session` imports the module `_session`
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for target in targets:
            if target in known:
                edges.add(target)
    return edges


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    modules = private_modules()
    graph = {name: imports_of(path, set(modules)) - {name} for name, path in modules.items()}
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_top_of_the_package_holds_only_the_public_faces_and_one_concept_modules() -> None:
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top - TOP_LEVEL == set(), "a module at the top of trainparity/: give it a subpackage of its concept"


def test_every_subpackage_says_what_it_offers() -> None:
    for init in PACKAGE.glob("_*/__init__.py"):
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.parent.name}/__init__.py has no docstring"


def test_no_file_is_longer_than_a_reader_can_hold() -> None:
    long = {str(path.relative_to(PACKAGE)): length for path in PACKAGE.rglob("*.py")
            if (length := len(path.read_text().splitlines())) > MOST_LINES}
    assert long == {}


def test_every_test_says_whether_its_verdict_depends_on_rounding(request: pytest.FixtureRequest) -> None:
    # CI runs the `numeric` tests again under every forced instruction set: a test that says neither would
    # never run there, however much its verdict depends on the kernels.
    undeclared = [item.nodeid for item in request.session.items
                  if (item.get_closest_marker("numeric") is None) == (item.get_closest_marker("exact") is None)]
    assert not undeclared, f"mark each of these (or its module) pytest.mark.numeric or pytest.mark.exact: {undeclared}"


#: test files whose tests need not run on every torch of the matrix, and why: what they test reads no torch
#: that changes between versions, or is tested there by the marked files
TORCH_INDEPENDENT = {
    "test_ci_script.py": ".ci/run's text",
    "test_cli.py": "the command line's parsing, exit codes and output (the checks it runs: their own files)",
    "test_coverage_docs.py": "the docs' coverage examples, through the checks test_coverage.py runs",
    "test_docs_reference.py": "the docs against the public names",
    "test_engine.py": "the process engine: forks, pipes, deadlines",
    "test_invalid_argument.py": "argument validation, before anything runs",
    "test_layout.py": "the package's source",
    "test_public_api.py": "the public namespace",
    "test_pytest_plugin.py": "the plugin's options, listener and summary, in pytest subprocesses",
    "test_recipe_specs.py": "recipe references and specs",
    "test_reliability.py": "hangs, kills, leaks and escapes of the process engine",
    "test_result_json.py": "results' JSON",
    "test_strategies.py": "hypothesis strategies over sampler configurations",
    "test_timeouts.py": "the process engine's deadlines",
    "test_frameworks.py": "each framework's passing controls are marked one by one; its faults test our diagnoses",
}


def test_every_test_that_reads_torch_internals_runs_in_the_torch_matrix(request: pytest.FixtureRequest) -> None:
    # The torch matrix runs `-m torch_internals` on the newest torch: a new test file is in it unless it says why not.
    here = pathlib.Path(__file__).parent
    assert sorted(name for name in TORCH_INDEPENDENT if not (here / name).exists()) == []
    unmarked = sorted({item.path.name for item in request.session.items
                       if item.get_closest_marker("torch_internals") is None} - TORCH_INDEPENDENT.keys())
    assert not unmarked, f"mark these files pytest.mark.torch_internals or say in TORCH_INDEPENDENT why not: {unmarked}"
    frameworks = [item for item in request.session.items if item.path.name == "test_frameworks.py"]
    assert not frameworks or any(item.get_closest_marker("torch_internals") for item in frameworks), (
        "no framework's passing control runs on the other torches")
