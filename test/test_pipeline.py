# ruff: noqa: E501
"""The parallel check on pipelines (torch.distributed.pipelining on gloo ranks): stages matched to the whole model by
their names, correct schedules passing, each micro-batch and stage bug named at its stage and step, and layouts
the check cannot match told apart from FAILs."""

from __future__ import annotations

import expecttest
import pytest
import torch
from pipeline_recipes import Pipeline

import trainparity as tp
from trainparity._parallel._stages import stages_of
from trainparity._parallel._trace import RankStep, RankTrace

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

#: measured: on torch 2.7.1 the 1F1B and interleaved schedules hang in their first step on gloo (CPU), and a stage
#: with no input gradient to send raises in torch itself; GPipe runs
OLD_PIPELINING = torch.torch_version.TorchVersion(torch.__version__) < (2, 8)


def runnable(schedule: str, fault: str | None = None) -> None:
    if OLD_PIPELINING and (schedule != "gpipe" or fault == "detached"):
        pytest.skip(f"torch {torch.__version__}'s pipelining: {schedule} schedules hang on gloo, a detached stage raises")


#: (schedule, micro-batches, tied, dp, how the dp replicas of a stage sync): micro-batches equal to, twice, and not a
#: multiple of the stages; dp x pp with the recipe's own all-reduce, DDP and FSDP2 per stage
CORRECT = [
    ("gpipe", 2, False, 1, "all_reduce"),
    ("1f1b", 4, True, 1, "all_reduce"),
    ("gpipe", 3, True, 1, "all_reduce"),
    ("interleaved", 4, True, 1, "all_reduce"),
    ("interleaved", 3, False, 1, "all_reduce"),
    ("1f1b", 3, True, 2, "all_reduce"),
    ("1f1b", 3, True, 2, "ddp"),
    ("interleaved", 3, True, 2, "fsdp"),
]


@pytest.mark.parametrize(("schedule", "microbatches", "tied", "dp", "replicas"), CORRECT,
                         ids=[f"{s}-{m}mb{'-tied' if t else ''}-dp{d}-{r}" for s, m, t, d, r in CORRECT])
def test_a_correct_pipeline_trains_like_the_whole_model_in_one_process(schedule: str, microbatches: int, tied: bool,
                                                                      dp: int, replicas: str) -> None:
    runnable(schedule)
    recipe = Pipeline(schedule=schedule, microbatches=microbatches, tied=tied, dp=dp, replicas=replicas)
    result = tp.check_parallel(recipe, world_size=2 * dp, steps=2, timeout=60)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.violations == [] and result.notes == []


#: fault -> (recipe, world size, the first violation's path, rank and cause)
FAULTS: dict[str, tuple[Pipeline, int, str, int, str | None]] = {
    "not_scaled": (Pipeline("interleaved", 3, "not_scaled"), 2, "gradients.embed.weight", 0, "loss_not_scaled"),
    "scaled_twice": (Pipeline("1f1b", 4, "scaled_twice"), 2, "gradients.embed.weight", 0, "loss_scaled_twice"),
    "tied_unsynced": (Pipeline("gpipe", 2, "tied_unsynced", tied=True), 2, "gradients.embed.weight", 1,
                      "tied_weights_not_synchronized"),
    "detached": (Pipeline("gpipe", 2, "detached"), 2, "gradients.embed.weight", 0, "param_without_grad"),
    "global_rank_sampler": (Pipeline("1f1b", 3, "global_rank_sampler", dp=2), 4, "data.sample_ids", 1,
                            "peers_read_different_samples"),
    "replicas_unsynced": (Pipeline("1f1b", 3, "replicas_unsynced", dp=2), 4, "gradients.embed.weight", 2,
                          "grads_not_synchronized"),
    "dp_summed": (Pipeline("gpipe", 2, "dp_summed", dp=4), 8, "gradients.embed.weight", 0, "loss_not_averaged"),
    # the forward diverges in the second of three micro-batches on the first stage (see the report's snapshot)
    "row_positions": (Pipeline("1f1b", 3, "row_positions"), 2, "outputs.model.embed", 0, None),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_pipeline_bugs_are_named_at_their_stage_and_step(fault: str) -> None:
    recipe, world_size, path, rank, cause = FAULTS[fault]
    runnable(recipe.schedule_name, recipe.fault)
    result = tp.check_parallel(recipe, world_size=world_size, steps=2, timeout=60)
    assert result.outcome is tp.Outcome.FAIL, result.report()
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.rank, first.cause) == (path, 1, rank, cause), \
        result.report()


@pytest.mark.parametrize("fault", ["not_scaled", "tied_unsynced"])
def test_pipelines_on_threads_are_judged_as_on_gloo(fault: str) -> None:
    """The threads backend's point-to-point messages (torch's threaded group has none) carry a pipeline's activations
    and gradients as gloo does: the same violations, with the same values."""
    recipe, world_size, *_ = FAULTS[fault]
    runnable(recipe.schedule_name, recipe.fault)
    on = {backend: tp.check_parallel(recipe, world_size=world_size, backend=backend, steps=2, timeout=60)
          for backend in ("gloo", "threads")}
    assert on["gloo"].outcome is tp.Outcome.FAIL, on["gloo"].report()
    assert [(v.path, v.step, v.rank, v.cause, v.expected, v.actual) for v in on["threads"].violations] == \
        [(v.path, v.step, v.rank, v.cause, v.expected, v.actual) for v in on["gloo"].violations]


def test_a_dp_x_pp_world_of_64_ranks_as_threads_trains_like_one_process() -> None:
    """16 pipelines of 4 stages, one layer each, under 1F1B, each layer fully sharded over its 16 replicas; and at 16
    ranks, a sampler sharded by the global rank is named at the first stage whose samples differ from its
    pipeline's first."""
    result = tp.check_parallel(Pipeline("1f1b", 6, dp=16, replicas="fsdp"), world_size=64, backend="threads", steps=2,
                               timeout=300)
    assert result.outcome is tp.Outcome.PASS, result.report()
    result = tp.check_parallel(Pipeline("gpipe", 3, "global_rank_sampler", dp=8), world_size=16, backend="threads",
                               steps=1, timeout=300)
    first = result.first_violation
    assert first is not None and (first.path, first.rank, first.cause) == (
        "data.sample_ids", 1, "peers_read_different_samples"), result.report()


def test_pipelines_of_tensor_parallel_stages_train_like_one_process() -> None:
    """dp x pp x tp at 8 ranks as threads: each stage's pair of layers column- then row-parallel over `tp` (DTensors,
    gathered before they are compared), a weight tied across the first and last stage of each pipeline."""
    result = tp.check_parallel(Pipeline("gpipe", 2, tied=True, dp=2, tp=2), world_size=8, backend="threads", steps=2,
                               timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()
    result = tp.check_parallel(Pipeline("gpipe", 2, "not_scaled", dp=2, tp=2), world_size=8, backend="threads",
                               steps=1, timeout=120)
    first = result.first_violation
    assert first is not None and (first.path, first.rank, first.cause) == (
        "gradients.embed.weight", 0, "loss_not_scaled"), result.report()


def test_stages_that_do_not_hold_a_scaled_gradient_are_not_blamed_for_it() -> None:
    """Every stage of a pipeline without scaling holds n_microbatches times the reference's gradients: each is named
    with the same cause, the later stage's parameters included."""
    result = tp.check_parallel(Pipeline("gpipe", 2, "not_scaled"), world_size=2, steps=1, timeout=60)
    at_step_1 = {(v.path, v.rank): v.cause for v in result.violations if v.path.startswith("gradients.")}
    assert at_step_1[("gradients.layers.3.weight", 1)] == "loss_not_scaled"
    assert at_step_1[("gradients.head.weight", 1)] == "loss_not_scaled"
    assert set(at_step_1.values()) == {"loss_not_scaled"}


def test_stages_under_their_own_names_are_not_judged() -> None:
    """A State that holds each stage's own module (its layers numbered from 0 on every stage) cannot be matched with
    the whole model: the check abstains and says how to lay the stages out, rather than compare layer 2 with 0."""
    result = tp.check_parallel(Pipeline(fault="stage_names"), world_size=2, steps=1, timeout=60)
    assert result.outcome is tp.Outcome.ABSTAIN and result.violations == [], result.report()
    assert result.reason is not None and result.reason.startswith(
        "The ranks hold parts of the model the reference trains (pipeline stages?), but no rank holds layers.2.bias, "
        "layers.2.weight, layers.3.bias, ... (4 in all): to be matched with the reference, build the whole model"), \
        result.reason
    assert "delete the layers the rank does not own" in result.reason


class Reports(expecttest.TestCase):
    """The first violation of each cause as a user reads it."""

    maxDiff = None

    def first_violation(self, fault: str) -> str:
        recipe, world_size, *_ = FAULTS[fault]
        runnable(recipe.schedule_name, recipe.fault)
        report = tp.check_parallel(recipe, world_size=world_size, steps=2, timeout=60).report()
        return report[:report.index("\nAll violations")]

    def test_loss_not_scaled(self) -> None:
        self.assertExpectedInline(self.first_violation("not_scaled"), """\
trainparity parallel check: FAIL at gradients.embed.weight (loss_not_scaled, step 1, rank 0)
config: backend='gloo', comparison='tolerance(rtol=1e-07, atol=1e-09), the float64 default', isolation='process', precision='float64', recipe="pipeline_mlp:Pipeline('interleaved', 3, 'not_scaled')", seed=0, steps=2, world_size=2

First violation: gradients.embed.weight (step 1, rank 0, kind: gradient_mismatch, cause: loss_not_scaled)
  The gradients of rank 0's pipeline stage are 3 times the reference's, the number of micro-batches it ran: each micro-batch's loss is a mean over the micro-batch and their gradients were summed without dividing by their number (a schedule built with scale_grads=False, and a loss_fn not divided by n_microbatches).
  Tensor-likes are not close!

  Mismatched elements: 36 / 36 (100.0%)
  Greatest absolute difference: 0.00967723 at index (2, 3) (up to 1e-09 allowed)
  Greatest relative difference: 2.0 at index (0, 0) (up to 1e-07 allowed)
  expected: -0.00483861
  actual:   -0.0145158
""")

    def test_loss_scaled_twice(self) -> None:
        self.assertExpectedInline(self.first_violation("scaled_twice"), """\
trainparity parallel check: FAIL at gradients.embed.weight (loss_scaled_twice, step 1, rank 0)
config: backend='gloo', comparison='tolerance(rtol=1e-07, atol=1e-09), the float64 default', isolation='process', precision='float64', recipe="pipeline_mlp:Pipeline('1f1b', 4, 'scaled_twice')", seed=0, steps=2, world_size=2

First violation: gradients.embed.weight (step 1, rank 0, kind: gradient_mismatch, cause: loss_scaled_twice)
  The gradients of rank 0's pipeline stage are 1/4 of the reference's, one over the number of micro-batches it ran: the loss was divided by n_microbatches while the schedule scales the gradients by it too (scale_grads=True, the default).
  Tensor-likes are not close!

  Mismatched elements: 36 / 36 (100.0%)
  Greatest absolute difference: 0.00362896 at index (2, 3) (up to 1e-09 allowed)
  Greatest relative difference: 0.75 at index (0, 0) (up to 1e-07 allowed)
  expected: -0.00483861
  actual:   -0.00120965
""")

    def test_tied_weights_not_synchronized(self) -> None:
        self.assertExpectedInline(self.first_violation("tied_unsynced"), """\
trainparity parallel check: FAIL at gradients.embed.weight (tied_weights_not_synchronized, step 1, rank 1)
config: backend='gloo', comparison='tolerance(rtol=1e-07, atol=1e-09), the float64 default', isolation='process', precision='float64', recipe="pipeline_mlp:Pipeline('gpipe', 2, 'tied_unsynced', tied=True)", seed=0, steps=2, world_size=2

First violation: gradients.embed.weight (step 1, rank 1, kind: gradient_mismatch, cause: tied_weights_not_synchronized)
  The copies of embed.weight on rank 0's pipeline stage and rank 1's (a weight tied across stages, head.weight there) hold another gradient, and together they sum to the reference's gradient: each stage's copy holds only the part of the gradient from its own use of the weight. All-reduce the tied weight's gradient between the stages that hold it before the optimizer step (as Megatron-LM's embedding group does), so that every copy steps with the whole gradient.
  Tensor-likes are not close!

  Mismatched elements: 36 / 36 (100.0%)
  Greatest absolute difference: 0.0151717 at index (1, 4) (up to 1e-09 allowed)
  Greatest relative difference: 281.661 at index (3, 0) (up to 1e-07 allowed)
  expected: -0.000765082
  actual:   0.0144066
""")

    def test_a_stage_without_gradient(self) -> None:
        self.assertExpectedInline(self.first_violation("detached"), """\
trainparity parallel check: FAIL at gradients.embed.weight (param_without_grad, step 1, rank 0)
config: backend='gloo', comparison='tolerance(rtol=1e-07, atol=1e-09), the float64 default', isolation='process', precision='float64', recipe="pipeline_mlp:Pipeline('gpipe', 2, 'detached')", seed=0, steps=2, world_size=2

First violation: gradients.embed.weight (step 1, rank 0, kind: gradient_mismatch, cause: param_without_grad)
  The parameters of rank 0's pipeline stage got a zero gradient at its optimizer step, where the reference's is nonzero: backward never reached this stage (its output, or the next stage's input, detached or computed under torch.no_grad()?).
  Tensor-likes are not close!

  Mismatched elements: 36 / 36 (100.0%)
  Greatest absolute difference: 0.00483861 at index (2, 3) (up to 1e-09 allowed)
  Greatest relative difference: 1.0 at index (0, 0) (up to 1e-07 allowed)
  expected: -0.00483861
  actual:   0.0
""")

    def test_a_pipeline_whose_stages_read_other_samples(self) -> None:
        self.assertExpectedInline(self.first_violation("global_rank_sampler"), """\
trainparity parallel check: FAIL at data.sample_ids (peers_read_different_samples, step 1, rank 1)
config: backend='gloo', comparison='tolerance(rtol=1e-07, atol=1e-09), the float64 default', isolation='process', precision='float64', recipe="pipeline_mlp:Pipeline('1f1b', 3, 'global_rank_sampler', dp=2)", seed=0, steps=2, world_size=4

First violation: data.sample_ids (step 1, rank 1, kind: peer_mismatch, cause: peers_read_different_samples)
  Rank 1 read other samples than rank 0, its peer along the model dimensions: ranks that differ only along the model dimensions compute one replica of the model and must read the same shard of the batch (is the sampler given the global rank and world size instead of the data-parallel dimension's, mesh['dp'].get_local_rank() and mesh['dp'].size()?).
  expected: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ... (24 items)]
  actual:   [24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, ... (24 items)]
""")

    def test_a_forward_that_diverges_in_one_micro_batch(self) -> None:
        self.assertExpectedInline(self.first_violation("row_positions"), """\
trainparity parallel check: FAIL at outputs.model.embed (output_mismatch, step 1, rank 0)
config: backend='gloo', comparison='tolerance(rtol=1e-07, atol=1e-09), the float64 default', isolation='process', precision='float64', recipe="pipeline_mlp:Pipeline('1f1b', 3, 'row_positions')", seed=0, steps=2, world_size=2

First violation: outputs.model.embed (step 1, rank 0, kind: output_mismatch)
  model.embed (Linear) returned other values on rank 0, stage 0 of its pipeline, in micro-batch 2 of 3 than in the reference for the same samples: the step's forward diverges first there (every earlier micro-batch, and this one's earlier stages, agree).
  Tensor-likes are not close!

  Mismatched elements: 192 / 192 (100.0%)
  Greatest absolute difference: 0.390397 at index (0, 0) (up to 1e-09 allowed)
  Greatest relative difference: 20967.0 at index (6, 1) (up to 1e-07 allowed)
  expected: 1.21733
  actual:   0.826937
""")


def _trace(parameters: dict[str, torch.Tensor], aliases: dict[str, str] | None = None) -> RankTrace:
    return RankTrace([RankStep(1, None, {}, dict(parameters), [])], 1, [], {}, aliases=aliases or {})


WHOLE = {"embed.weight": torch.zeros(3, 3), "layers.0.weight": torch.zeros(3, 3), "head.bias": torch.zeros(3)}


def test_ranks_holding_the_whole_model_are_no_pipeline() -> None:
    assert stages_of(_trace(WHOLE), [_trace(WHOLE), _trace(WHOLE)]) is None


def test_a_tied_weight_is_matched_through_the_reference_s_other_name_for_it() -> None:
    reference = _trace(WHOLE, aliases={"head.weight": "embed.weight"})
    first = _trace({"embed.weight": WHOLE["embed.weight"], "layers.0.weight": WHOLE["layers.0.weight"]})
    last = _trace({"head.weight": WHOLE["embed.weight"], "head.bias": WHOLE["head.bias"]})
    stages = stages_of(reference, [first, last])
    assert not isinstance(stages, str) and stages is not None
    assert stages.holders == {"embed.weight": [0, 1], "layers.0.weight": [0], "head.bias": [1]}
    assert stages.stage == [0, 1] and stages.pipelines == [[0, 1]]


@pytest.mark.parametrize(("ranks", "told"), [
    ([{"embed.weight": torch.zeros(3, 3)}, {"layers.0.weight": torch.zeros(3, 3), "head.bias": torch.zeros(3)},
      {"stage.0.weight": torch.zeros(3, 3)}], "rank 2 holds stage.0.weight, which the reference's model does not"),
    ([{"embed.weight": torch.zeros(3, 3), "layers.0.weight": torch.zeros(3, 3)}, {"head.bias": torch.zeros(2)}],
     "head.bias is [2] on rank 1 and [3] in the reference"),
    ([{"embed.weight": torch.zeros(3, 3)}, {"head.bias": torch.zeros(3)}], "no rank holds layers.0.weight"),
    ([{"embed.weight": torch.zeros(3, 3)}, {"embed.weight": torch.zeros(3, 3)},
      {"layers.0.weight": torch.zeros(3, 3), "head.bias": torch.zeros(3)}],
     "its stages are held by different numbers of ranks (1, 2)"),
    ([{"embed.weight": torch.zeros(3, 3), "layers.0.weight": torch.zeros(3, 3)},
      {"layers.0.weight": torch.zeros(3, 3), "head.bias": torch.zeros(3)}],
     "layers.0.weight is held by ranks that hold other stages (0, 1) and is not a weight tied to another in the "
     "reference's model"),
], ids=["unknown-name", "other-shape", "unheld", "uneven-replicas", "untied-on-two-stages"])
def test_a_layout_the_check_cannot_match_says_how_to_lay_stages_out(ranks: list[dict[str, torch.Tensor]],
                                                                    told: str) -> None:
    reason = stages_of(_trace(WHOLE), [_trace(parameters) for parameters in ranks])
    assert isinstance(reason, str) and told in reason, reason
    assert "delete the layers the rank does not own" in reason and "fully qualified name" in reason
