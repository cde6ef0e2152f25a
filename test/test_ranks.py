"""Merging the ranks of a run into one trace (trainparity._resume._ranks), and check_resume's world arguments."""

from __future__ import annotations

import pytest
import torch

import trainparity as tp
from trainparity._resume._ranks import align, merge_ranks, replicated_paths
from trainparity._resume._trace import Boundary, RunTrace, StepRecord

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]


def _rank(weight: float, position: int, ids: list[int | str], loss: float, rng: int,
          rank_local: tuple[str, ...] = ()) -> RunTrace:
    state = {"model.weight": torch.tensor([weight]), "counter": position, "loader.position": 4}
    step = StepRecord(1, {"rng.torch": torch.tensor([rng])}, ids, loss, state)
    boundary = Boundary(dict(state), {"rng.torch": torch.tensor([rng])})
    return RunTrace([step], None, boundary, [], list(rank_local))


def test_replicated_paths_are_what_every_rank_holds_alike_but_loaders() -> None:
    world = [_rank(1.0, 0, [0, 1], 2.0, 5, ("loader",)), _rank(1.0, 1, [2, 3], 4.0, 6, ("loader",))]
    assert replicated_paths([world]) == {"model.weight"}


def test_merge_names_rank_local_paths_and_rng_per_rank_and_keeps_the_global_batch() -> None:
    world = [_rank(1.0, 0, [3, 1], 2.0, 5), _rank(1.0, 1, [2, 0], 4.0, 6)]
    merged = merge_ranks(world, frozenset({"model.weight"}), unordered=False)
    step = merged.steps[0]
    assert sorted(step.state) == ["counter[rank 0]", "counter[rank 1]", "loader.position[rank 0]",
                                  "loader.position[rank 1]", "model.weight"]
    assert sorted(step.rng) == ["rng.torch[rank 0]", "rng.torch[rank 1]"]
    assert step.sample_ids == [3, 1, 2, 0] and step.loss == 3.0
    assert merge_ranks(world, frozenset(), unordered=True).steps[0].sample_ids == [0, 1, 2, 3]


def test_a_tensor_parallel_group_reading_one_batch_gives_it_once() -> None:
    world = [_rank(1.0, 0, [1, 2], 2.0, 5), _rank(1.0, 0, [1, 2], 2.0, 5)]
    assert merge_ranks(world, frozenset(), unordered=False).steps[0].sample_ids == [1, 2]


def test_a_rank_that_leaves_a_replicated_value_is_named_and_expected_to_hold_it() -> None:
    replicated = frozenset({"model.weight"})
    baseline = merge_ranks([_rank(1.0, 0, [0], 1.0, 5), _rank(1.0, 0, [1], 1.0, 5)], replicated, unordered=False)
    resumed = merge_ranks([_rank(1.0, 0, [0], 1.0, 5), _rank(9.0, 0, [1], 1.0, 5)], replicated, unordered=False)
    align([baseline, resumed], replicated, None)
    assert torch.equal(baseline.steps[0].state["model.weight[rank 1]"], torch.tensor([1.0]))
    assert torch.equal(resumed.steps[0].state["model.weight[rank 1]"], torch.tensor([9.0]))


def test_a_world_size_change_sets_rank_local_state_and_unmatched_rng_aside() -> None:
    replicated = frozenset({"model.weight"})
    two = merge_ranks([_rank(1.0, 0, [0], 1.0, 5), _rank(1.0, 1, [1], 1.0, 6)], replicated, unordered=True)
    one = merge_ranks([_rank(1.0, 0, [0, 1], 1.0, 5)], replicated, unordered=True)
    set_aside = align([two, one], replicated, 1)
    assert set_aside.state == ["counter", "loader.position"] and set_aside.rng_ranks == [1]
    for trace in (two, one):
        assert sorted(trace.steps[0].state) == ["model.weight"]
        assert sorted(trace.steps[0].rng) == ["rng.torch[rank 0]"]


@pytest.mark.parametrize(("arguments", "error", "words"), [
    ({"world_size": 0}, ValueError, "world_size= must be an int >= 1"),
    ({"world_size": True}, ValueError, "world_size= must be an int >= 1"),
    ({"world_size": 2, "resume_world_size": 0}, ValueError,
     r"resume_world_size= must be None \(the same as world_size\) or an int >= 1, got 0"),
    ({"world_size": 2, "backend": 3}, TypeError, "backend= must be a string"),
    ({"world_size": 2, "backend": "mpi-nonexistent"}, ValueError, "is not available"),
    ({"world_size": 2, "isolation": "inprocess"}, ValueError, "cannot run a world of ranks"),
    ({"world_size": 2, "precision": "float16"}, ValueError, "precision"),
])
def test_bad_world_arguments_are_refused_before_anything_runs(arguments: dict[str, object], error: type,
                                                               words: str) -> None:
    with pytest.raises(error, match=words):
        tp.check_resume("resume_recipes:ResumeRecipe", **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(("actual", "expected"), [
    ([1, 9], (None, 9, 1)),               # 1 is where it belongs, though step 1 read it too; 9 is unknown
    ([4, 5], ("data_skipped", 4, 0)),      # the next batch's samples
    ([2, 3], ("data_replayed", 2, 0)),     # the previous batch's
    ([3, 1], (None, 3, 0)),                # the right samples in another order: neither
])
def test_a_resumed_batch_is_blamed_on_a_sample_it_should_not_hold(actual: list[int | str],
                                                                   expected: tuple[object, ...]) -> None:
    from trainparity._resume._judge import _data_cause

    baseline = [StepRecord(step, {}, ids, None, {}) for step, ids in enumerate([[0, 1], [2, 3], [1, 3], [4, 5]], 1)]
    assert _data_cause(baseline, 2, actual) == expected


def test_a_single_rank_uninterrupted_world_replicates_everything_but_loaders() -> None:
    # resuming one rank on two: a resumed rank that restored another value is named, not set aside
    replicated = replicated_paths([[_rank(1.0, 0, [0], 1.0, 5, ("loader",))]])
    assert replicated == {"model.weight", "counter"}
    one = merge_ranks([_rank(1.0, 0, [0, 1], 1.0, 5, ("loader",))], replicated, unordered=True)
    two = merge_ranks([_rank(1.0, 0, [0], 1.0, 5, ("loader",)), _rank(1.0, 3, [1], 1.0, 5, ("loader",))],
                      replicated, unordered=True)
    set_aside = align([one, two], replicated, 1)
    assert set_aside.state == ["loader.position"]
    assert one.steps[0].state["counter[rank 1]"] == 0 and two.steps[0].state["counter[rank 1]"] == 3


def test_a_multi_rank_report_shows_the_values_of_tensors_compared_by_digest() -> None:
    # Two rounds of worlds (the runs, then the runs again for the values) each meet at their own store.
    result = tp.check_resume("parallel_recipes:WideDDPRecipe(fault='optimizer_not_loaded')", steps=4, resume_at=2,
                             world_size=2, timeout=120)
    assert result.outcome is tp.Outcome.FAIL, result.report()
    moment = next(v for v in result.violations if v.path == "optimizer.state.weight.exp_avg")
    assert (moment.step, moment.cause) == (2, "not_restored"), result.report()
    weight = next(v for v in result.violations if v.path == "model.weight")
    assert "Mismatched elements" in weight.message and "digest" not in weight.message, weight.message
    assert not any("digest" in note for note in result.notes), result.notes
