"""Every Python snippet of docs/api.md's "Sample coverage" section runs, and its test cases pass."""

from __future__ import annotations

import io
import pathlib
import re
import unittest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md"


def coverage_snippets() -> list[str]:
    text = DOCS.read_text()
    section = text.split("\n## Sample coverage", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


class TestCoverageDocs(unittest.TestCase):
    def test_snippets_run(self) -> None:
        snippets = coverage_snippets()
        self.assertGreaterEqual(len(snippets), 6)
        for index, code in enumerate(snippets):
            with self.subTest(snippet=index):
                namespace: dict[str, object] = {"__name__": f"docs_snippet_{index}"}
                exec(compile(code, f"docs/api.md (coverage snippet {index})", "exec"), namespace)
                cases = [v for v in namespace.values() if isinstance(v, type) and issubclass(v, unittest.TestCase)]
                for case in cases:
                    outcome = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(
                        unittest.defaultTestLoader.loadTestsFromTestCase(case))
                    self.assertTrue(outcome.wasSuccessful(), outcome.failures + outcome.errors)
                    self.assertGreater(outcome.testsRun, 0)

    def test_every_public_coverage_name_is_documented_in_a_snippet(self) -> None:
        code = "\n".join(coverage_snippets())
        names = ["check_coverage", "ExactlyOnce", "AtLeastOnce", "NoCrossRankOverlap", "ExpectedPadding",
                 "DistinctEpochOrder", "CoverageRecorder", "WorkerBatch", "tag_workers", "assertCoverage",
                 "sampler_configs", "SamplerConfig", "distributed_samplers", "data_loaders", "epoch_windows",
                 "expected_policy", "torch_settings", "IndexDataset", "ORDER_MIN_SAMPLES"]
        self.assertEqual([name for name in names if name not in code], [])


if __name__ == "__main__":
    unittest.main()
