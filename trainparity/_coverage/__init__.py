"""Sample coverage: which sample IDs each rank observed, audited against declared policies.

- `_policy`: the policies (`tp.ExactlyOnce`, ...), which only state rules;
- `_universe`: a declared universe as arrays, encoding observed IDs as positions in it;
- `_record`: where observations come from inside training (`tp.CoverageRecorder`, `tp.tag_workers`);
- `_check`: `tp.check_coverage`: collects the observations and turns the findings into a result;
- `_audit`: judges every policy over the observations as numpy arrays.

The package needs numpy, torch, the sample-ID normalisation (`trainparity._batches._sample_ids`) and the
result types; it does not import the recipe, trace or snapshot machinery.
"""

from trainparity._coverage._check import check_coverage
from trainparity._coverage._policy import (
    AtLeastOnce,
    CoveragePolicy,
    DistinctEpochOrder,
    ExactlyOnce,
    ExpectedPadding,
    NoCrossRankOverlap,
)
from trainparity._coverage._record import CoverageRecorder, WorkerBatch, tag_workers

__all__ = [
    "AtLeastOnce",
    "CoveragePolicy",
    "CoverageRecorder",
    "DistinctEpochOrder",
    "ExactlyOnce",
    "ExpectedPadding",
    "NoCrossRankOverlap",
    "WorkerBatch",
    "check_coverage",
    "tag_workers",
]
