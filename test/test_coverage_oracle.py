"""The vectorized audit against a brute-force pure-Python oracle, on generated observation streams.

The oracle walks each epoch's observations one by one in observation order (position, then
rank) with a dict of what each ID was seen by, exactly as the semantics are written in
docs/api.md; the generated streams mix every input form, universe form and ID range that
selects a different encoding path in the audit.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import trainparity as tp
from trainparity._coverage import _audit

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]

Row = tuple[str, int, int | None, int | None, Any, int | None]
#: for a duplicate, where the message says the ID was seen first: (rank, position)
Reference = tuple[int, int] | None
KIND_ORDER = ("unexpected_id", "same_rank_duplicate", "cross_rank_duplicate")


def oracle(epochs: list[Any], policies: list[Any],
           universe: list[Any] | None) -> tuple[tp.Outcome, list[Row], list[Reference]]:
    """Every violation, in observation order, by walking the streams one observation at a time.

    An epoch is `{rank: [(ids, worker), ...]}`, or a list of such windows observed one after the
    other; a rank's position counts on across the windows of its epoch.
    """
    epochs = [epoch if isinstance(epoch, list) else [epoch] for epoch in epochs]
    abstained = False
    unexpected = missing = universe_duplicates = cross = order = False
    paddings: set[int] = set()
    for policy in policies:
        if isinstance(policy, (tp.ExactlyOnce, tp.AtLeastOnce, tp.ExpectedPadding)):
            if universe is None:
                abstained = True
                continue
            unexpected = missing = True
            universe_duplicates |= isinstance(policy, tp.ExactlyOnce)
            if isinstance(policy, tp.ExpectedPadding):
                paddings.add(policy.padding)
        elif isinstance(policy, tp.NoCrossRankOverlap):
            cross = True
        elif len(epochs) < 2:
            abstained = True
        else:
            order = True
    members = set(universe or [])
    ranks = sorted({rank for epoch in epochs for window in epoch for rank in window})
    rows: list[Row] = []
    references: list[Reference] = []
    earlier: dict[int, list[list[Any]]] = {}
    for e, epoch in enumerate(epochs):
        streams: dict[int, list[tuple[Any, int | None]]] = {}  # each rank's stream over the epoch's windows
        seen_by: dict[Any, set[int]] = {}
        first_at: dict[tuple[Any, int | None], tuple[int, int]] = {}  # (ID, None or rank) -> first (rank, position)
        in_universe = 0
        for window in epoch:
            pieces = {r: [(i, w) for batch, w in batches for i in batch] for r, batches in window.items()}
            offsets = {r: len(streams.setdefault(r, [])) for r in window}
            for local in range(max((len(piece) for piece in pieces.values()), default=0)):
                for rank in ranks:
                    if rank not in pieces or local >= len(pieces[rank]):
                        continue
                    sample, worker = pieces[rank][local]
                    position = offsets[rank] + local
                    kinds = []
                    if unexpected and sample not in members:
                        kinds.append("unexpected_id")
                    if sample in seen_by:
                        new_to_rank = rank not in seen_by[sample]
                        if universe_duplicates and sample in members:
                            kinds.append("cross_rank_duplicate" if new_to_rank else "same_rank_duplicate")
                        elif cross and new_to_rank:
                            kinds.append("cross_rank_duplicate")
                    seen_by.setdefault(sample, set()).add(rank)
                    first_at.setdefault((sample, None), (rank, position))
                    first_at.setdefault((sample, rank), (rank, position))
                    in_universe += sample in members
                    for k in sorted(kinds, key=KIND_ORDER.index):
                        rows.append((k, e, rank, position, sample, worker))
                        references.append(first_at[(sample, rank if k == "same_rank_duplicate" else None)]
                                          if k.endswith("_duplicate") else None)
            for rank, piece in pieces.items():
                streams[rank] += piece
        if missing:
            rows += [("missing_id", e, None, None, u, None) for u in universe or [] if u not in seen_by]
        extra = in_universe - sum(1 for s in seen_by if s in members)
        rows += [("padding_count", e, None, None, None, None) for p in sorted(paddings) if p != extra]
        for rank in ranks:
            ids = [i for i, _ in streams.get(rank, [])]
            if order and rank in streams and len(ids) >= 2 and ids in earlier.get(rank, []):
                rows.append(("repeated_epoch_order", e, rank, None, None, None))
            if rank in streams:
                earlier.setdefault(rank, []).append(ids)
        references += [None] * (len(rows) - len(references))  # the end-of-epoch rows name no first sighting
    outcome = tp.Outcome.FAIL if rows else tp.Outcome.ABSTAIN if abstained else tp.Outcome.PASS
    return outcome, rows, references


def as_batch(ids: list[Any], form: int, kind: str) -> Any:
    """The same IDs in one of the forms a pipeline produces."""
    if form == 1 and len(ids) == 1:
        return ids[0]
    if form == 2:
        return np.array(ids, dtype=np.int64 if kind == "int" else np.str_)
    if form == 3 and kind == "int":
        return torch.tensor(ids, dtype=torch.int64)
    if form == 4:
        return tuple(ids)
    return list(ids)


# Built once: strategies made inside the composite would be validated again for every example.
POOL_INDEX = st.integers(0, 8)
#: per batch: IDs (indices into the pool), worker (-1: none), input form
BATCHES = st.lists(st.tuples(st.lists(POOL_INDEX, max_size=4), st.integers(-1, 1), st.integers(0, 4)), max_size=4)
UNIVERSE_FORMS = st.sampled_from(["list", "set", "array", "tensor", "range"])
RANKS = st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True)
POLICIES = st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True)
#: how many windows an epoch is observed in (2: a job preempted mid-epoch, then resumed)
WINDOWS = st.sampled_from([1, 1, 2])


@st.composite
def audits(draw: st.DrawFn) -> tuple[Any, list[Any], list[Any], list[Any] | None]:
    kind = draw(st.sampled_from(["int", "str"]))
    if kind == "int":
        base = draw(st.sampled_from([0, -3, 2**40, 2**63 - 8]))  # dense codes, negative IDs, huge IDs, int64's top
        # a far-away ID: no dense coding possible; int64's bottom makes spans of 2**63 and more
        pool: list[Any] = [base + v for v in range(8)] + [draw(st.sampled_from([-(2**50), -(2**63)]))]
    else:
        pool = [chr(ord("a") + i) * (1 + i % 2) for i in range(9)]
    size = draw(st.integers(1, len(pool)))  # how many of the pool's IDs the streams use
    universe: Any = None
    listed: list[Any] | None = None
    if draw(st.integers(0, 3)):
        listed = list(dict.fromkeys(pool[i % size] for i in draw(st.lists(POOL_INDEX, max_size=9))))
        form = draw(UNIVERSE_FORMS)
        if kind == "int" and form == "range":
            start, step = pool[draw(POOL_INDEX) % size], draw(st.sampled_from([1, 2, -1]))
            length = draw(st.integers(0, 5))
            while length and not -(2**63) <= start + step * (length - 1) < 2**63:  # IDs stay int64
                length -= 1
            universe = range(start, start + step * length, step)
            listed = list(universe)
        elif form == "set":
            universe, listed = set(listed), sorted(listed)
        elif form == "array":
            universe = np.array(listed, dtype=np.int64 if kind == "int" else np.str_)
        elif form == "tensor" and kind == "int":
            universe = torch.tensor(listed, dtype=torch.int64)
        else:
            universe = list(listed)
    ranks = draw(RANKS)
    #: per epoch, its windows: {rank: [(ids, worker, form), ...]}; most epochs are observed in one window
    epochs: list[list[dict[int, list[tuple[list[Any], int | None, int]]]]] = []
    for e in range(draw(st.integers(1, 3))):
        if e and not draw(st.integers(0, 4)):  # the whole epoch replayed, windows and all
            epochs.append(epochs[draw(st.integers(0, e - 1))])
            continue
        count = draw(WINDOWS)
        windows = []
        for w in range(count):  # a preemption: later windows may be read by other ranks
            present = ranks if w == 0 else [r for r in ranks if draw(st.booleans())] or ranks[-1:]
            window = {}
            for rank in present:
                replay = draw(st.integers(-2, e - 1)) if count == 1 else -1  # one rank repeats its order
                if replay >= 0 and len(epochs[replay]) == 1 and rank in epochs[replay][0]:
                    window[rank] = epochs[replay][0][rank]
                else:
                    window[rank] = [([pool[i % size] for i in ids], None if worker < 0 else worker, form)
                                    for ids, worker, form in draw(BATCHES)]
            windows.append(window)
        epochs.append(windows)

    def batches(window: dict[int, list[tuple[list[Any], int | None, int]]]) -> dict[int, list[Any]]:
        return {r: [tp.WorkerBatch(as_batch(ids, form, kind), w) if w is not None else as_batch(ids, form, kind)
                    for ids, w, form in window[r]] for r in window}

    if any(len(windows) > 1 for windows in epochs) or draw(st.booleans()):
        as_input: Any = [(e, batches(window)) for e, windows in enumerate(epochs) for window in windows]
    else:
        as_input = [batches(windows[0]) for windows in epochs]
    streams = [[{r: [(ids, w) for ids, w, _ in window[r]] for r in window} for window in windows]
               for windows in epochs]
    padding = draw(st.integers(0, 3))
    makers = [
        lambda: tp.ExactlyOnce(universe), lambda: tp.AtLeastOnce(universe), lambda: tp.NoCrossRankOverlap(),
        lambda: tp.ExpectedPadding(universe, padding=padding), lambda: tp.DistinctEpochOrder(),
    ]
    return as_input, streams, [makers[i]() for i in draw(POLICIES)], listed


@settings(max_examples=1500, deadline=None)  # torch code: a first call or a loaded machine takes past 200 ms
@given(case=audits())
@example(case=([{0: [[0, 0]]}], [{0: [([0, 0], None)]}], [tp.ExactlyOnce([0, 1])], [0, 1]))
@example(case=([{0: [[1]], 1: [[1]]}], [{0: [([1], None)], 1: [([1], None)]}],
               [tp.ExactlyOnce(None), tp.NoCrossRankOverlap()], None))
@example(case=([{0: [[-(2**63), 2**63 - 8]]}], [{0: [([-(2**63), 2**63 - 8], None)]}],  # a span of 2**64 - 8
               [tp.AtLeastOnce([-(2**63), 2**63 - 8])], [-(2**63), 2**63 - 8]))
def test_audit_matches_the_oracle(case: tuple[Any, list[Any], list[Any], list[Any] | None]) -> None:
    as_input, epochs, policies, universe = case
    result = tp.check_coverage(as_input, policy=policies)
    outcome, rows, references = oracle(epochs, policies, universe)
    assert [(v.kind, v.epoch, v.rank, v.position, v.sample_id, v.worker) for v in result.violations] == rows
    assert result.outcome is outcome
    assert sum(result.counts.values()) == len(rows)
    for violation, reference in zip(result.violations, references, strict=True):
        if reference is not None:
            rank, position = reference
            said = (f"rank {rank} first observed it at position {position} (" if violation.kind == "same_rank_duplicate"
                    else f"but rank {rank} at position {position} (")
            assert said in violation.message, (said, violation.message)
    if len(rows) > 1:  # listing only the first n violations lists the same ones, in the same order
        capped = tp.check_coverage(as_input, policy=policies, max_violations=len(rows) // 2)
        assert capped.violations == result.violations[: len(rows) // 2]
    # the sparse path (np.unique counts, missing IDs from the gaps) finds the same, with the same notes
    with mock.patch.object(_audit, "_dense_counts", lambda possible, observations: False):
        sparse = tp.check_coverage(as_input, policy=policies)
    assert (sparse.outcome, sparse.violations, sparse.notes) == (result.outcome, result.violations, result.notes)
