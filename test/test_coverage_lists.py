"""A list of ID tensors, the form tests and recorders collect, is read without the per-batch loop: the audit must
say exactly what it says of the same batches read one by one (from a generator, the loop's path)."""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import example, given, settings

import trainparity as tp

pytestmark = pytest.mark.exact


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


@pytest.mark.parametrize("batches", [
    [torch.tensor([0, 1]), torch.tensor([2, 3], dtype=torch.int32)],     # another dtype
    [torch.tensor([0, 1]), torch.tensor([[2], [3]])],                    # another shape
    [torch.tensor([0, 1, 2, 3])[::2], torch.tensor([3])],                # not contiguous
    [torch.tensor([0, 1]), [2, 3]],                                       # not a tensor
])
def test_lists_of_other_batches_take_the_loop_and_say_the_same(batches: list[object]) -> None:
    listed = tp.check_coverage({0: batches}, policy=tp.ExactlyOnce(range(4)))
    looped = tp.check_coverage({0: iter(batches)}, policy=tp.ExactlyOnce(range(4)))
    assert listed.report() == looped.report()


def test_int_tensors_after_string_ids_are_refused_as_the_loop_refuses_them() -> None:
    ranks = {0: [["a", "b"]], 1: [torch.tensor([0, 1])]}
    with pytest.raises(TypeError) as listed:
        tp.check_coverage(ranks, policy=tp.NoCrossRankOverlap())
    with pytest.raises(TypeError) as looped:
        tp.check_coverage({0: [["a", "b"]], 1: iter([torch.tensor([0, 1])])}, policy=tp.NoCrossRankOverlap())
    assert str(listed.value) == str(looped.value)
