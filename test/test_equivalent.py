"""tp.check_equivalent: two configurations of one small transformer (test/equivalent_recipes.py) that must train
the same, and the checkpoint bugs that make them differ, each named by its cause."""

from __future__ import annotations

import pathlib
import random
import subprocess
import sys

import pytest
import torch
import torch.utils.checkpoint
from data_parallel_recipes import DDPRecipe
from equivalent_recipes import CheckpointedLM, PackedLM
from expecttest import assert_expected_inline
from resume_recipes import ResumeRecipe

import trainparity as tp
from trainparity._equivalent._packing import documents
from trainparity._state._compare import ignored
from trainparity.quickstarts.accumulation import ForgetsToScale

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

HERE = str(pathlib.Path(__file__).resolve().parent)


def first_lines(result: tp.Result, count: int = 7) -> str:
    """The headline and the first violation, without the config line (its recipe specs name this module)."""
    lines = result.report().splitlines()
    return "\n".join([lines[0], *lines[2:count]])


@pytest.mark.parametrize("candidate", [
    CheckpointedLM(checkpointing=True),
    CheckpointedLM(checkpointing=True, use_reentrant=True),
], ids=["non-reentrant", "reentrant"])
def test_checkpointing_trains_like_no_checkpointing_and_the_switch_is_configuration(
        candidate: CheckpointedLM) -> None:
    result = tp.check_equivalent(CheckpointedLM(dropout=0.1), CheckpointedLM(
        dropout=0.1, checkpointing=True, use_reentrant=candidate.use_reentrant))
    assert result.outcome is tp.Outcome.PASS, result.report()
    configuration = [n for n in result.notes if n.startswith("Configuration, not compared")]
    assert configuration and "model.checkpointing" in configuration[0], result.notes


def test_a_reentrant_checkpoint_over_a_frozen_embedding_gives_its_layers_no_gradient() -> None:
    result = tp.check_equivalent(CheckpointedLM(freeze_embedding=True),
                                 CheckpointedLM(freeze_embedding=True, checkpointing=True, use_reentrant=True))
    assert_expected_inline(first_lines(result), """\
trainparity runs_equivalent check: FAIL at gradients.blocks.0.norm1.weight (checkpoint_without_grad, step 1)

First violation: gradients.blocks.0.norm1.weight (step 1, kind: gradient_mismatch, cause: checkpoint_without_grad)
  The parameter got no gradient at the optimizer step, where the reference's got one.
  expected: 'Tensor[float64] of shape [16]'
  actual:   None""")
    # the head, outside every region, still gets its gradient: only the layers inside are named
    assert not any(v.path.startswith("gradients.head") for v in result.violations), result.report()
    assert {v.cause for v in result.violations} == {"checkpoint_without_grad"}


def test_a_recomputation_that_draws_other_dropout_masks_is_named() -> None:
    result = tp.check_equivalent(CheckpointedLM(dropout=0.1),
                                 CheckpointedLM(dropout=0.1, checkpointing=True, preserve_rng_state=False))
    assert_expected_inline(first_lines(result, 6), """\
trainparity runs_equivalent check: FAIL at gradients.embedding.weight (checkpoint_rng_not_preserved, step 1)

First violation: gradients.embedding.weight (step 1, kind: gradient_mismatch, cause: checkpoint_rng_not_preserved)
  The gradients at the optimizer step differ from the reference's.
  Tensor-likes are not close!""")
    # without dropout the recomputation draws nothing: the same switch changes nothing
    assert tp.check_equivalent(CheckpointedLM(), CheckpointedLM(checkpointing=True, preserve_rng_state=False)).passed


def test_running_statistics_updated_again_in_the_recomputation_are_named() -> None:
    result = tp.check_equivalent(CheckpointedLM(batchnorm=True), CheckpointedLM(batchnorm=True, checkpointing=True))
    assert_expected_inline(first_lines(result, 6), """\
trainparity runs_equivalent check: FAIL at model.blocks.0.batchnorm.running_mean (checkpoint_double_update, step 1)

First violation: model.blocks.0.batchnorm.running_mean (step 1, kind: state_mismatch, cause: checkpoint_double_update)
  The state after the step differs from the reference's.
  Tensor-likes are not close!""")
    assert {v.path.rsplit(".", 1)[1] for v in result.violations} == {"running_mean", "running_var",
                                                                      "num_batches_tracked"}


def test_a_candidate_that_does_not_divide_its_loss_is_named_in_another_process() -> None:
    result = tp.check_equivalent(CheckpointedLM, CheckpointedLM(scale=2.0), steps=2, isolation="process")
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.cause) == ("gradients.embedding.weight", "loss_not_scaled"), result.report()
    assert any(n.startswith("Steps after step 1 are not judged") for n in result.notes), result.notes


def test_a_compiled_model_is_compared_by_its_own_names() -> None:
    passed = tp.check_equivalent(CheckpointedLM, CheckpointedLM(compile_backend="aot_eager"), steps=2)
    assert passed.outcome is tp.Outcome.PASS, passed.report()
    assert any("is compiled (torch.compile)" in note for note in passed.notes), passed.notes
    failed = tp.check_equivalent(CheckpointedLM, CheckpointedLM(compile_backend="aot_eager", scale=2.0), steps=2)
    assert failed.first_violation is not None and failed.first_violation.path == "gradients.embedding.weight"
    assert not any("_orig_mod" in v.path for v in failed.violations), failed.report()
    assert any("draws its own dropout masks" in note for note in failed.notes), failed.notes


def test_a_hook_the_compiled_model_never_runs_is_named() -> None:
    """Dynamo does not guard module hooks: a forward hook added after the first compiled call is not run."""
    result = tp.check_equivalent(CheckpointedLM(hook_at=2), CheckpointedLM(hook_at=2, compile_backend="aot_eager"),
                                 steps=3)
    assert_expected_inline(first_lines(result, 5), """\
trainparity runs_equivalent check: FAIL at loss (compile_stale, step 2)

First violation: loss (step 2, kind: loss_mismatch, cause: compile_stale)
  The step's loss differs from the reference's.""")
    assert any("model.head: forward hooks 0 -> 1 (at step 2)" in note for note in result.notes), result.notes
    # added before the first compiled call, the hook is compiled in: the same recipe trains like eager
    assert tp.check_equivalent(CheckpointedLM(hook_at=1), CheckpointedLM(hook_at=1, compile_backend="aot_eager"),
                               steps=2).passed


@pytest.mark.parametrize(("fault", "step", "seen"), [
    ("rng", 3, "random numbers drawn (rng.torch differs at the start of step 3)"),
    ("mode", 3, "a mode left changed (model.training train -> eval after step 2)"),
    ("ema", 2, "weights left changed (the gradients at step 2 agree, the State after it does not)"),
])
def test_an_evaluation_that_changes_training_is_named_with_what_it_left_behind(fault: str, step: int,
                                                                                seen: str) -> None:
    result = tp.check_equivalent(CheckpointedLM(dropout=0.1),
                                 CheckpointedLM(dropout=0.1, evaluate_every=2, evaluation_fault=fault), steps=3)
    first = result.first_violation
    assert first is not None and (first.step, first.cause) == (step, "evaluation_changed_training"), result.report()
    assert any(seen in note for note in result.notes), result.notes
    if fault == "ema":
        assert_expected_inline(first_lines(result, 5), """\
trainparity runs_equivalent check: FAIL at model.embedding.weight (evaluation_changed_training, step 2)

First violation: model.embedding.weight (step 2, kind: state_mismatch, cause: evaluation_changed_training)
  The state after the step differs from the reference's.""")


def test_an_evaluation_that_restores_what_it_changed_trains_like_none() -> None:
    result = tp.check_equivalent(CheckpointedLM(dropout=0.1), CheckpointedLM(dropout=0.1, evaluate_every=2), steps=3)
    assert result.outcome is tp.Outcome.PASS, result.report()


def test_packed_documents_train_like_padded_ones_and_a_mask_across_them_is_named() -> None:
    assert tp.check_equivalent(PackedLM, PackedLM(packed=True)).passed
    result = tp.check_equivalent(PackedLM, PackedLM(packed=True, block_diagonal=False), steps=2)
    assert_expected_inline(first_lines(result, 4), """\
trainparity runs_equivalent check: FAIL at loss (cross_document_attention, step 1)

First violation: loss (step 1, kind: loss_mismatch, cause: cross_document_attention)""")
    assert any("the candidate's row 0: the document at positions 18-19 reads positions 0-17" in note
               for note in result.notes), result.notes


def test_the_packing_probe_reads_documents_from_position_ids_and_cu_seq_lens() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    assert documents((), {"position_ids": positions}) == [[(0, 3), (3, 5)], [(0, 5)]]
    assert documents((), {"position_ids": positions[1:]}) is None  # one document per row: nothing packed
    assert documents((), {"cu_seq_lens_q": torch.tensor([0, 3, 5, 9])}) == [[(0, 3), (3, 5), (5, 9)]]
    assert documents((torch.zeros(2, 5),), {}) is None


def test_ignored_paths_are_not_compared_and_shown_in_the_config() -> None:
    ignore = ["gradients.*", "model", "optimizer"]
    result = tp.check_equivalent(CheckpointedLM, CheckpointedLM(scale=2.0), steps=2, ignore=ignore)
    first = result.first_violation
    # what is left to see the difference is the loss of the next step
    assert first is not None and (first.path, first.step) == ("loss", 2), result.report()
    assert result.config["ignore"] == ignore
    assert ignored("ema.fc.weight", ["ema"]) and ignored("model.fc.weight", ["model.*"])
    assert not ignored("emax.fc", ["ema"]) and not ignored("model.fc.weight", ["model.fc.bias"])


IGNORING = {
    # check, its FAIL without ignore=, the globs that pass over every path it fails at
    "resume": (lambda **ignore: tp.check_resume(ResumeRecipe(fault="ema"), steps=4, resume_at=2, timeout=60,
                                                **ignore), ["ema"]),
    "accumulation": (lambda **ignore: tp.check_accumulation(ForgetsToScale, **ignore),
                     ["gradients", "parameters", "optimizer.state.*"]),
    "parallel": (lambda **ignore: tp.check_parallel(DDPRecipe(fault="grads_summed"), world_size=2, steps=2,
                                                    **ignore), ["gradients.*", "parameters"]),
}


@pytest.mark.parametrize("check", sorted(IGNORING))
def test_every_check_that_compares_states_passes_over_ignored_paths(check: str) -> None:
    run, globs = IGNORING[check]
    failed = run()
    assert failed.outcome is tp.Outcome.FAIL and "ignore" not in failed.config, failed.report()
    assert all(ignored(v.path, globs) for v in failed.violations), [v.path for v in failed.violations]
    result = run(ignore=globs)
    assert result.outcome is tp.Outcome.PASS and result.config["ignore"] == globs, result.report()


class Unseeded(CheckpointedLM):
    """Draws its initial weights from a source no seed reaches: two runs of it differ."""

    def setup(self) -> tp.State:
        state = super().setup()
        with torch.no_grad():
            state.model.head.bias.fill_(random.SystemRandom().random())
        return state


def test_a_reference_that_does_not_reproduce_itself_abstains() -> None:
    result = tp.check_equivalent(Unseeded, Unseeded, steps=1)
    assert result.outcome is tp.Outcome.ABSTAIN, result.report()
    assert result.reason is not None and result.reason.startswith("the reference is not reproducible: "
                                                                   "model.head.bias differs"), result.reason


class Broken(CheckpointedLM):
    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        raise ValueError("broken step")


def test_a_recipe_that_raises_is_an_error() -> None:
    result = tp.check_equivalent(CheckpointedLM, Broken, steps=1)
    assert result.outcome is tp.Outcome.ERROR and isinstance(result.exception, ValueError), result.report()


class NoCompiler(CheckpointedLM):
    """What torch.compile's inductor backend raises at its first call on a machine without a C++ compiler."""

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        from torch._inductor.exc import InvalidCxxCompiler

        raise InvalidCxxCompiler()


def test_a_missing_cxx_compiler_is_an_error_that_says_what_to_do() -> None:
    result = tp.check_equivalent(CheckpointedLM, NoCompiler, steps=1)
    assert result.outcome is tp.Outcome.ERROR, result.report()
    assert any("backend='aot_eager'" in note for note in result.notes), result.notes


@pytest.mark.parametrize(("arguments", "message"), [
    ({"steps": 0}, "steps= must be an int >= 1"),
    ({"ignore": 5}, "ignore= must be a glob or a list of globs"),
    ({"precision": "half"}, "precision= must be"),
])
def test_misuse_is_refused_before_anything_runs(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(tp.InvalidArgument, match=message):
        tp.check_equivalent(Broken, Broken, **arguments)  # type: ignore[arg-type]


def test_the_observation_leaves_torch_checkpoint_as_it_was() -> None:
    names = ("CheckpointFunction", "_checkpoint_without_reentrant_generator",
             "_checkpoint_without_reentrant_generator_impl")  # the last from torch 2.15 on
    before = [getattr(torch.utils.checkpoint, name, None) for name in names]
    tp.check_equivalent(CheckpointedLM, CheckpointedLM(checkpointing=True), steps=1)
    assert [getattr(torch.utils.checkpoint, name, None) for name in names] == before


def test_the_assertion_and_the_command_line() -> None:
    tp.assert_equivalent(CheckpointedLM, CheckpointedLM(checkpointing=True), steps=1)
    with pytest.raises(AssertionError, match="cause: loss_not_scaled"):
        tp.assert_equivalent(CheckpointedLM, CheckpointedLM(scale=2.0), steps=1)
    done = subprocess.run([sys.executable, "-m", "trainparity", "equivalent", "equivalent_recipes:CheckpointedLM",
                           "equivalent_recipes:CheckpointedLM(scale=3.0)", "--steps", "1"],
                          capture_output=True, text=True, timeout=300, check=False, cwd=HERE)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL at gradients.embedding.weight (loss_not_scaled, step 1)" in done.stdout
    usage = subprocess.run([sys.executable, "-m", "trainparity", "equivalent", "equivalent_recipes:CheckpointedLM"],
                           capture_output=True, text=True, timeout=300, check=False, cwd=HERE)
    assert usage.returncode == 4 and "give two recipes" in usage.stderr, usage.stderr

