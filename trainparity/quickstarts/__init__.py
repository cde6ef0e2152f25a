"""Runnable quickstarts, `python -m trainparity.quickstarts.<check>`: each runs its check on a clean recipe and on
one with the bug the check exists for, prints both reports, and exits 0 when the clean one PASSes and the bug is
caught as itself (`shown`)."""

from __future__ import annotations

from trainparity._results._result import Result
from trainparity._results._violation import Outcome


def shown(clean: Result, broken: Result, caught: str | None = None) -> int:
    """Print both reports; 0 when `clean` PASSed and `broken` FAILed first with `caught` (a cause or a kind; None:
    any), else 1."""
    print(clean.report(), end="\n\n")
    print(broken.report())
    first = broken.first_violation
    named = caught is None or (first is not None and caught in (first.cause, first.kind))
    return 0 if clean.passed and broken.outcome is Outcome.FAIL and named else 1
