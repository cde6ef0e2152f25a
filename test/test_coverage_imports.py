"""The coverage package and the sample-ID module stand on their own: they do not pull in the recipe, trace or
snapshot machinery (what `import trainparity` loads anyway is not the question, so the package is imported
below a bare `trainparity` namespace, in a fresh interpreter)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import trainparity

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]

ROOT = pathlib.Path(trainparity.__file__).resolve().parent
PROBE = """
import json, sys, types
package = types.ModuleType("trainparity")
package.__path__ = [sys.argv[1]]
sys.modules["trainparity"] = package
__import__(sys.argv[2])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("trainparity"))))
"""
#: what coverage may not import: the recipe, its traces and snapshots, and what they stand on
FORBIDDEN = {"trainparity._recipe._recipe", "trainparity._resume._trace", "trainparity._state._snapshot",
             "trainparity._state._entries", "trainparity._state._compare", "trainparity._process._engine"}


def imported_by(module: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(ROOT), module], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_coverage_imports_neither_recipe_nor_trace_nor_snapshot() -> None:
    modules = imported_by("trainparity._coverage")
    assert modules & FORBIDDEN == set(), sorted(modules)
    assert {"trainparity._coverage._check", "trainparity._coverage._audit", "trainparity._coverage._policy",
            "trainparity._coverage._record", "trainparity._batches._sample_ids"} <= modules


def test_sample_ids_import_no_other_trainparity_module() -> None:
    assert imported_by("trainparity._batches._sample_ids") == {"trainparity", "trainparity._batches",
                                                              "trainparity._batches._sample_ids"}


def test_the_resume_and_parallel_runs_share_the_sample_id_normalisation() -> None:
    from trainparity._batches import _sample_ids
    from trainparity._parallel import _rank
    from trainparity._resume import _trace

    assert _trace.normalize_sample_ids is _sample_ids.normalize_sample_ids
    assert _rank.normalize_sample_ids is _sample_ids.normalize_sample_ids
    assert not hasattr(_trace, "sample_id_array")  # one definition, in trainparity._batches._sample_ids
