"""Values for the report: large tensors travel as digests, so where they differ the check trains those runs again,
keeping just the tensors the report shows whole."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from trainparity._results._result import ResumeResult
from trainparity._results._violation import ChildError
from trainparity._resume._trace import RunTrace, Whole
from trainparity._state._compare import Snapshot
from trainparity._state._digest import Digest, digest


@dataclasses.dataclass(frozen=True)
class Wanted:
    """The large tensors whose values the report shows, known so far by their digests only."""

    #: differing at the load (the save/load comparison)
    boundary: frozenset[str]
    #: the first step at which training diverged, and its differing tensors
    step: int
    at_step: frozenset[str]


def values_wanted(result: ResumeResult, baseline: RunTrace, resumed: RunTrace, resume_at: int) -> Wanted | None:
    """Which digested tensors the report needs the values of: the save/load mismatches and the first divergence."""
    assert resumed.loaded is not None
    boundary = frozenset(v.path for v in result.violations if v.step == resume_at and v.cause == "not_restored"
                         and isinstance(resumed.loaded.state.get(v.path), Digest))
    diverged = [v for v in result.violations if v.kind == "state_mismatch" and v.step is not None
                and v.step > resume_at]
    step = min((v.step for v in diverged if v.step is not None), default=resume_at)
    # a step's snapshot keeps small tensors whole up to a budget: either run may hold a digest where the other does not
    digested = (baseline.steps[step - 1].state, resumed.steps[step - resume_at - 1].state) if diverged else ()
    at_step = frozenset(v.path for v in diverged if v.step == step
                        and any(isinstance(state.get(v.path), Digest) for state in digested))
    return Wanted(boundary, step, at_step) if boundary or at_step else None


def fetch_values(wanted: Wanted, traces: tuple[RunTrace, RunTrace, RunTrace], resume_at: int,
                 rerun: Callable[[int, Whole], tuple[list[RunTrace], ChildError | None]]) -> list[str]:
    """Train again the runs the wanted values come from, keeping those tensors whole; put them in the traces.

    `rerun(last, whole)` runs the baseline to step `last`, the interrupted run and the resumed run to
    `last` again, shipping `whole` whole. The runs were reproducible (the baseline ran twice alike), so
    training them again gives the same values: each fetched tensor replaces its digest only if it has
    that digest. Returns notes.
    """
    baseline, interrupted, resumed = traces
    # A script's restored State is held against the baseline's at the start of the next step: fetched there too.
    start = baseline.steps[resume_at].start if wanted.boundary and len(baseline.steps) > resume_at else None
    last = wanted.step if wanted.at_step else resume_at if start is None else resume_at + 1
    again, error = rerun(last, ((0, wanted.boundary), (wanted.step, wanted.at_step)))
    if error is not None:
        return [f"the values of the differing tensors could not be fetched ({error.headline()}): "
                "their violations say only that their digests differ."]
    again_baseline, again_interrupted, again_resumed = again
    pairs = []
    if wanted.at_step:
        pairs += [(baseline.steps[wanted.step - 1].state, again_baseline.steps[-1].state, wanted.at_step),
                  (resumed.steps[wanted.step - resume_at - 1].state, again_resumed.steps[-1].state, wanted.at_step)]
    if wanted.boundary:
        assert interrupted.saved is not None and resumed.loaded is not None
        assert again_interrupted.saved is not None and again_resumed.loaded is not None
        pairs += [(interrupted.saved.state, again_interrupted.saved.state, wanted.boundary),
                  (resumed.loaded.state, again_resumed.loaded.state, wanted.boundary)]
        again_start = again_baseline.steps[resume_at].start if len(again_baseline.steps) > resume_at else None
        if start is not None:
            pairs.append((start, again_start or {}, wanted.boundary))
    if all([_replace(known, fetched, paths) for known, fetched, paths in pairs]):
        return []
    return ["training again to fetch the values of the differing tensors gave other values than the first "
            "time, so some violations say only that their digests differ."]


def _replace(known: Snapshot, fetched: Snapshot, paths: frozenset[str]) -> bool:
    """Put the fetched values of `paths` in place of their digests; False if one does not match its digest."""
    matched = True
    for path in paths:
        value, known_digest = fetched.get(path), known.get(path)
        if not isinstance(known_digest, Digest):
            continue
        if isinstance(value, torch.Tensor) and digest(value) == known_digest:
            known[path] = value
        else:
            matched = False
    return matched
