"""The Python snippets of docs/api.md and README.md run for real, and every public name has one.

Each ```python block becomes a module in a temporary directory (importable, because the checks
rebuild recipes in fresh processes by module name). One child process per document, under a
timeout, imports the blocks in order; each block starts with the names the earlier blocks of the
document defined, as a reader carries them from one block to the next, and a script's
`if __name__ == "__main__":` block runs too. Both happen in that runner only: a check's fresh
process that imports a block to rebuild its recipe gets the block alone, as a user who copied it
would. Every test function (as pytest would collect it) and unittest test case a block defines is run.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = ("docs/api.md", "README.md")
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
MAIN_GUARD = re.compile(r"^if __name__ == ['\"]__main__['\"]:", re.MULTILINE)
FUTURE = re.compile(r"^from __future__ import .*$", re.MULTILINE)
TIMEOUT = 600
#: what replaces a main guard: true while the runner imports this block, false in the checks' processes
MAIN_BLOCK = 'if __import__("builtins").__dict__.get("RUNNING_DOC_SNIPPET") == __name__:'
#: the first line of every block: the earlier blocks' names, in the runner only
EARLIER_NAMES = 'globals().update(__import__("builtins").__dict__.get("DOC_SNIPPET_NAMES", {}))'

RUNNER = textwrap.dedent('''
    import builtins
    import importlib
    import inspect
    import io
    import sys
    import traceback
    import unittest

    builtins.DOC_SNIPPET_NAMES = {{}}
    for module_name, where in {blocks!r}:
        print(f"--- {{where}}", flush=True)
        builtins.RUNNING_DOC_SNIPPET = module_name
        try:
            module = importlib.import_module(module_name)
        except BaseException:
            traceback.print_exc()
            print(f"FAILED: {{where}} raised", flush=True)
            sys.exit(1)
        builtins.DOC_SNIPPET_NAMES.update({{k: v for k, v in vars(module).items() if not k.startswith("_")}})
        functions = [value for name, value in vars(module).items()
                     if name.startswith("test") and inspect.isfunction(value) and value.__module__ == module_name]
        for function in functions:  # as pytest runs them
            try:
                function()
            except BaseException:
                traceback.print_exc()
                print(f"FAILED: {{where}}: {{function.__name__}}", flush=True)
                sys.exit(1)
            print(f"{{function.__name__}} ... ok", flush=True)
        cases = [value for value in vars(module).values()
                 if isinstance(value, type) and issubclass(value, unittest.TestCase)
                 and value.__module__ == module_name]
        for case in cases:
            stream = io.StringIO()
            outcome = unittest.TextTestRunner(stream=stream, verbosity=2).run(
                unittest.defaultTestLoader.loadTestsFromTestCase(case))
            print(stream.getvalue(), flush=True)
            if not outcome.wasSuccessful() or outcome.testsRun == 0:
                print(f"FAILED: {{where}}: test case {{case.__name__}}", flush=True)
                sys.exit(1)
    print("ALL SNIPPETS RAN", flush=True)
''')


def snippets(document: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) of every ```python block."""
    text = (ROOT / document).read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in FENCE.finditer(text)]


def module_source(code: str) -> str:
    """The block as a module that starts with the earlier blocks' names and runs its main block."""
    code = MAIN_GUARD.sub(MAIN_BLOCK, code)
    futures = list(FUTURE.finditer(code))
    end = futures[-1].end() + 1 if futures else 0
    return code[:end] + EARLIER_NAMES + "\n" + code[end:]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_snippets_run(document: str, tmp_path: pathlib.Path) -> None:
    blocks = snippets(document)
    assert blocks, f"{document} has no python snippet"
    stem = re.sub(r"\W", "_", document.lower())
    names = []
    for index, (line, code) in enumerate(blocks):
        name = f"snippet_{stem}_{index:02d}"
        (tmp_path / f"{name}.py").write_text(module_source(code))
        names.append((name, f"{document} line {line}"))
    (tmp_path / "run_snippets.py").write_text(RUNNER.format(blocks=names))
    # Tiny models train faster on one thread; the checks' processes inherit the environment.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "run_snippets.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "ALL SNIPPETS RAN" in done.stdout, output[-6000:]


def test_module_source_starts_with_earlier_names_and_runs_main_blocks() -> None:
    source = module_source('from __future__ import annotations\nx = 1\nif __name__ == "__main__":\n    y = 2\n')
    assert source.splitlines() == [
        "from __future__ import annotations",
        EARLIER_NAMES,
        "x = 1",
        MAIN_BLOCK,
        "    y = 2",
    ]


def test_every_public_name_has_a_snippet_in_the_api_reference() -> None:
    code = "\n".join(block for _, block in snippets("docs/api.md"))
    undocumented = [name for name in tp.__all__ if not re.search(
        rf"\b(?:tp|trainparity)\.{re.escape(name)}\b|\bfrom trainparity import {re.escape(name)}\b", code)]
    assert undocumented == [], f"docs/api.md has no python snippet using tp.<name> for: {undocumented}"
