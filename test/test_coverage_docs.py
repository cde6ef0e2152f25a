"""docs/api.md's "Sample coverage" section shows every coverage name in a snippet.

test/test_docs.py runs every snippet of docs/api.md and checks that each name of `tp.__all__`
appears as `tp.<name>`; this adds the names reached otherwise: `trainparity.strategies`'
public names and the mixin's assertCoverage.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from trainparity import strategies

pytestmark = pytest.mark.exact

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_every_coverage_name_is_used_in_a_snippet_of_the_section() -> None:
    section = DOCS.read_text().split("\n## Sample coverage", 1)[1].split("\n## ", 1)[0]
    code = "\n".join(re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL))
    names = [*strategies.__all__, "check_coverage", "ExactlyOnce", "AtLeastOnce", "NoCrossRankOverlap",
             "ExpectedPadding", "DistinctEpochOrder", "CoverageRecorder", "WorkerBatch", "tag_workers",
             "assertCoverage", "CoverageResult"]
    assert [name for name in names if not re.search(rf"\b{name}\b", code)] == []
