"""A list of ID tensors, the form tests and recorders collect, is read without the per-batch loop: the audit must
say exactly what it says of the same batches read one by one (from a generator, the loop's path)."""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings

import trainparity as tp
import trainparity._coverage._collect as collect

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]


def one_by_one(batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    yield from batches


batch_lists = st.lists(st.lists(st.integers(-2, 40), max_size=6).map(lambda ids: torch.tensor(ids, dtype=torch.int64)),
                       max_size=8)


@settings(deadline=None, max_examples=60)
@given(ranks=st.lists(batch_lists, min_size=1, max_size=3))
@example(ranks=[[torch.tensor([0, 1], dtype=torch.int64), torch.tensor([], dtype=torch.int64)],
                [torch.tensor([1, 2], dtype=torch.int64)]])
@example(ranks=[[torch.tensor([], dtype=torch.int64)]])
def test_a_list_of_tensors_is_judged_as_the_same_batches_one_by_one(ranks: list[list[torch.Tensor]]) -> None:
    policies = [tp.ExactlyOnce(range(30)), tp.NoCrossRankOverlap()]
    listed = tp.check_coverage(dict(enumerate(ranks)), policy=policies)
    looped = tp.check_coverage({rank: one_by_one(batches) for rank, batches in enumerate(ranks)}, policy=policies)
    assert listed.report() == looped.report()
    assert listed.violations == looped.violations


@st.composite
def runs_of_batches(draw: st.DrawFn) -> list[torch.Tensor]:
    """Batches in runs of one length, as samplers deal them (many of one size, a shorter last one), long enough
    runs for `_cat_ranges` to concatenate them alone."""
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    batches: list[torch.Tensor] = []
    for length, count in draw(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 40)), max_size=5)):
        batches += [torch.randint(-2, 150, (length,), generator=generator) for _ in range(count)]
    return batches


@settings(deadline=None, max_examples=40)
@given(ranks=st.lists(runs_of_batches(), min_size=1, max_size=3))
def test_lists_in_runs_of_equal_lengths_are_judged_as_the_same_batches_one_by_one(
        ranks: list[list[torch.Tensor]]) -> None:
    policies = [tp.ExactlyOnce(range(140)), tp.NoCrossRankOverlap()]
    listed = tp.check_coverage(dict(enumerate(ranks)), policy=policies)
    looped = tp.check_coverage({rank: one_by_one(batches) for rank, batches in enumerate(ranks)}, policy=policies)
    assert listed.report() == looped.report()
    assert listed.violations == looped.violations


def test_long_runs_of_equal_lengths_are_concatenated_alone_and_short_runs_together() -> None:
    lengths = np.array([64] * 20 + [16] + [3, 3, 5] + [8] * 16 + [2, 0], dtype=np.int64)
    assert collect._cat_ranges(lengths) == [(0, 20), (20, 24), (24, 40), (40, 42)]
    assert collect._cat_ranges(np.array([5, 6, 7], dtype=np.int64)) == [(0, 3)]


def test_a_list_torch_cat_refuses_part_way_is_read_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor that torch.cat refuses (on another device, of another layout) after a run it has copied: nothing of
    the list counts as read, and the loop reads it all (here the refusal is staged: CUDA is not needed)."""
    concatenate, calls = torch.cat, []

    def refusing_the_second(tensors: list[torch.Tensor], **kwargs: object) -> torch.Tensor:
        calls.append(len(tensors))
        if len(calls) == 2:
            raise RuntimeError("Expected all tensors to be on the same device")
        return concatenate(tensors, **kwargs)  # type: ignore[arg-type]

    batches = [torch.arange(i * 4, i * 4 + 4) for i in range(20)] + [torch.tensor([5, 200])]
    looped = tp.check_coverage({0: one_by_one(batches)}, policy=tp.ExactlyOnce(range(82)))
    monkeypatch.setattr(torch, "cat", refusing_the_second)
    listed = tp.check_coverage({0: batches}, policy=tp.ExactlyOnce(range(82)))
    assert calls == [20, 1]
    assert listed.report() == looped.report()
    assert listed.counts == {"same_rank_duplicate": 1, "unexpected_id": 1, "missing_id": 2}, listed.counts


@pytest.mark.parametrize("batches", [
    [torch.tensor([0, 1]), torch.tensor([2, 3], dtype=torch.int32)],     # another dtype
    [torch.tensor([0, 1]), torch.tensor([[2], [3]])],                    # another shape
    [torch.tensor([0, 1]), [2, 3]],                                       # not a tensor
])
def test_lists_of_other_batches_take_the_loop_and_say_the_same(batches: list[object]) -> None:
    listed = tp.check_coverage({0: batches}, policy=tp.ExactlyOnce(range(4)))
    looped = tp.check_coverage({0: iter(batches)}, policy=tp.ExactlyOnce(range(4)))
    assert listed.report() == looped.report()


@pytest.mark.parametrize("ranks", [
    {0: [["a", "b"]], 1: [torch.tensor([0, 1])]},                          # int tensors after string IDs
    {0: [torch.tensor([0, 1, 2]).to_sparse(), torch.tensor([3])]},        # a sparse tensor
    {0: [*torch.arange(40).split(2), torch.tensor([0, 1, 2]).to_sparse()]},  # after a run torch.cat copies
    {0: [torch.arange(2), torch.arange(2, 4, device="meta")]},             # a meta tensor: no values
])
def test_lists_the_loop_refuses_are_refused_alike(ranks: dict[int, list[object]]) -> None:
    with pytest.raises(TypeError) as listed:
        tp.check_coverage(ranks, policy=tp.NoCrossRankOverlap())
    with pytest.raises(TypeError) as looped:
        tp.check_coverage({rank: iter(batches) for rank, batches in ranks.items()}, policy=tp.NoCrossRankOverlap())
    assert str(listed.value) == str(looped.value)


def test_strided_tensors_are_read_as_their_values() -> None:
    """Tensors that are not contiguous (every other element, a broadcast) are read in the same one call."""
    batches = [torch.arange(8)[::2], torch.arange(1, 8, 2)[[0, 1]], torch.tensor([5]).expand(2)]
    listed = tp.check_coverage({0: batches}, policy=tp.ExactlyOnce(range(8)))
    looped = tp.check_coverage({0: one_by_one(batches)}, policy=tp.ExactlyOnce(range(8)))
    assert listed.report() == looped.report()
    assert listed.counts == {"same_rank_duplicate": 1, "missing_id": 1}, listed.counts


def test_ranks_of_equal_lists_fill_one_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first rank reserves room for the ranks of its window after it: one allocation, no copy as it grows
    (each fresh buffer costs the first touch of its pages)."""
    import trainparity._coverage._collect as collect

    sizes: list[int] = []
    allocate = collect._empty

    def counted(size: int, dtype: object) -> object:
        sizes.append(size)
        return allocate(size, dtype)  # type: ignore[arg-type]

    monkeypatch.setattr(collect, "_empty", counted)
    ranks = {rank: list(torch.arange(rank * 1000, (rank + 1) * 1000).split(64)) for rank in range(4)}
    assert tp.check_coverage(ranks, policy=tp.ExactlyOnce(range(4000))).passed
    assert sizes == [4000]


def test_the_buffer_is_on_the_cpu_whatever_the_default_device() -> None:
    batches = [torch.arange(4, device="cpu"), torch.arange(4, 8, device="cpu")]
    with torch.device("meta"):
        result = tp.check_coverage({0: batches}, policy=tp.ExactlyOnce(range(8)))
    assert result.passed, result.report()
