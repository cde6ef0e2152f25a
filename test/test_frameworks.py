"""The script checks on training code written for a framework: a PyTorch Lightning script
(test/scripts/lightning_train.py), a Hugging Face `Trainer` script (test/scripts/hf_train.py), a Hugging Face
Accelerate script (test/scripts/accelerate_train.py), a PyTorch-Ignite script (test/scripts/ignite_train.py)
and a script that checkpoints in safetensors files only (test/scripts/safetensors_train.py). The
frameworks are a test-only extra: `python -m pip install -e ".[frameworks]" "torch==2.13.0"`."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

import trainparity as tp

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"
EXTRA = 'a test-only extra: python -m pip install -e ".[frameworks]" "torch==2.13.0"'
needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason=f"Lightning is {EXTRA}")
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
    reason=f"transformers and accelerate are {EXTRA}")
needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                      reason=f"accelerate is {EXTRA}")
needs_ignite = pytest.mark.skipif(importlib.util.find_spec("ignite") is None, reason=f"pytorch-ignite is {EXTRA}")
needs_safetensors = pytest.mark.skipif(importlib.util.find_spec("safetensors") is None,
                                       reason=f"safetensors comes with transformers, {EXTRA}")
#: nothing is downloaded: the scripts build their models locally
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def check_script(script: str, resume_flag: str, *extra: str) -> tp.ResumeResult:
    command = [sys.executable, str(SCRIPTS / script), "--out_dir", "{workdir}", *extra]
    return tp.check_resume_script(command, [*command, resume_flag], steps=6, resume_at=3, timeout=300, env=OFFLINE)


@pytest.mark.exact
@needs_lightning
@pytest.mark.parametrize("accumulate", ["1", pytest.param("2", marks=pytest.mark.torch_internals)])
def test_a_lightning_fit_resumed_from_its_checkpoint_passes_and_says_the_rng_is_not_saved(accumulate: str) -> None:
    """Trainer.fit(..., ckpt_path=...) restores the module, optimizer, scheduler, callbacks and loops,
    with or without accumulate_grad_batches. Lightning's checkpoint holds no global RNG state: nothing
    here draws from it, so that is a note, not a FAIL."""
    result = check_script("lightning_train.py", "--resume", "--accumulate", accumulate)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert any(note.startswith("rng.torch differs from uninterrupted training from step 4 on")
               for note in result.notes), result.notes


@pytest.mark.exact
@needs_lightning
def test_a_callback_whose_state_is_not_loaded_is_named_with_its_attribute() -> None:
    result = check_script("lightning_train.py", "--resume", "--fault", "callback_state_lost")
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.step, first.cause, first.expected, first.actual) == (
        "counter.batches", 3, "not_restored", 3, 0), result.report()


@pytest.mark.numeric
@pytest.mark.torch_internals
@needs_lightning
def test_lightning_accumulating_two_batches_trains_like_one_batch_twice_as_large() -> None:
    """Lightning divides the loss by accumulate_grad_batches and steps inside optimizer.step(closure): the
    gradients the step takes are whole once the closure has run, and equal the large batch's."""
    script = [sys.executable, str(SCRIPTS / "lightning_train.py"), "--out_dir", "{workdir}", "--untracked_counter",
              "--max_steps", "3"]
    result = tp.check_runs_equivalent([*script, "--batch", "8"], [*script, "--batch", "4", "--accumulate", "2"],
                                      steps=3, comparison=tp.ToleranceComparison(rtol=1e-5, atol=1e-7), timeout=300)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.exact
@needs_transformers
@pytest.mark.parametrize("grad_accum", ["1", pytest.param("2", marks=pytest.mark.torch_internals)])
def test_a_hugging_face_trainer_resumed_from_its_checkpoint_passes(grad_accum: str) -> None:
    """trainer.train(resume_from_checkpoint=...) restores the model (model.safetensors), the
    optimizer, the scheduler and the RNG states (dropout draws from the global RNG), and skips the
    batches of the epoch already trained, with or without gradient_accumulation_steps."""
    result = check_script("hf_train.py", "--resume", "--grad-accum", grad_accum)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.notes == [], result.notes


@pytest.mark.exact
@needs_transformers
def test_a_hugging_face_resume_that_ignores_the_data_skip_replays_the_epoch() -> None:
    """With ignore_data_skip=True the resumed Trainer starts its epoch's sampler from the first batch again: the
    data replayed leads; the RNG it restored (torch.random.set_rng_state) was then drawn by the rebuilt epoch."""
    result = check_script("hf_train.py", "--resume", "--fault", "data_skip_ignored")
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.step, first.cause) == ("data.sample_ids", 4, "data_replayed"), result.report()
    assert "rng.torch was restored, then drawn differently before this batch" in first.message
    rng = next(v for v in result.violations if v.path == "rng.torch")
    assert (rng.step, rng.cause) == (4, None), result.report()


HF_REFERENCE = [sys.executable, str(SCRIPTS / "hf_train.py"), "--out_dir", "{workdir}", "--double", "--dropout", "0",
                "--batch", "8"]
HF_ACCUMULATED = [*HF_REFERENCE[:-1], "4", "--grad-accum", "2"]
TOLERANCE = tp.ToleranceComparison(rtol=1e-9, atol=1e-12)  # float64: the order of the sums is all that differs


@pytest.mark.numeric
@pytest.mark.torch_internals
@needs_transformers
def test_a_hugging_face_trainer_accumulating_variable_length_sequences_trains_like_the_whole_batch() -> None:
    """The Trainer counts the labelled tokens of all micro-batches of a step (num_items_in_batch) and
    the model divides its summed loss by that count: two micro-batches of 4 train as one batch of 8."""
    result = tp.check_runs_equivalent(HF_REFERENCE, HF_ACCUMULATED, steps=3, comparison=TOLERANCE, timeout=300,
                                      env=OFFLINE)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.numeric
@needs_transformers
def test_a_per_micro_batch_token_mean_under_accumulation_is_found_at_the_first_step() -> None:
    """A model that does not take num_items_in_batch (accepts_loss_kwargs = False) averages each
    micro-batch's tokens on its own, and the Trainer divides by the accumulation steps: the short
    sequences of a micro-batch weigh more than in the whole batch. The gradients are not a whole
    multiple of the reference's, so no scaling cause is named."""
    result = tp.check_runs_equivalent(HF_REFERENCE, [*HF_ACCUMULATED, "--fault", "loss_mean_per_batch"], steps=3,
                                      comparison=TOLERANCE, timeout=300, env=OFFLINE)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.step, first.kind, first.cause) == ("loss", 1, "loss_mismatch", None), result.report()
    assert any(v.kind == "gradient_mismatch" and v.step == 1 for v in result.violations), result.report()


@pytest.mark.exact
@needs_safetensors
def test_a_checkpoint_written_only_with_safetensors_is_seen() -> None:
    """save_model and save_file, the functions behind `save_pretrained`'s model.safetensors, mark the
    checkpoint: without them the interrupted run would be an ERROR (no checkpoint written)."""
    result = check_script("safetensors_train.py", "--resume")
    assert result.outcome is tp.Outcome.PASS, result.report()


# -- Hugging Face Accelerate: accelerator.save_state / load_state, skip_first_batches ---------------------------


@pytest.mark.exact
@needs_accelerate
@pytest.mark.parametrize("grad_accum", ["1", pytest.param("2", marks=pytest.mark.torch_internals)])
def test_an_accelerate_script_resumed_with_load_state_and_skip_first_batches_passes(grad_accum: str) -> None:
    result = check_script("accelerate_train.py", "--resume", "--grad_accum", grad_accum)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.exact
@needs_accelerate
def test_a_scheduler_accelerate_never_prepared_is_named_with_what_save_state_holds() -> None:
    result = check_script("accelerate_train.py", "--resume", "--fault", "scheduler_not_prepared")
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("scheduler.last_epoch", 3, "not_restored"), (
        result.report())
    assert "accelerator.save_state does not save scheduler: it is neither prepared" in first.message


@pytest.mark.exact
@needs_accelerate
@pytest.mark.parametrize("extra", [["--fault", "batches_not_skipped"],
                                   ["--grad_accum", "2", "--fault", "skip_counts_optimizer_steps"],
                                   ["--unseeded_sampler"]])
def test_an_accelerate_resume_on_other_batches_leads_with_the_data(extra: list[str]) -> None:
    """Batches not skipped, or skipped by optimizer steps under accumulation, replay the epoch; accelerate's
    default sampler draws a new order from the restored RNG (docs/limitations.md): either way the data is what
    to fix, and the RNG is its explanation."""
    result = check_script("accelerate_train.py", "--resume", *extra)
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("data.sample_ids", 4, "data_replayed"), (
        result.report())


ACCELERATE = [sys.executable, str(SCRIPTS / "accelerate_train.py"), "--out_dir", "{workdir}"]


@pytest.mark.numeric
@needs_accelerate
@pytest.mark.parametrize(("fault", "cause"), [pytest.param("none", None, marks=pytest.mark.torch_internals),
                                               ("loss_divided_twice", "loss_scaled_twice")])
def test_accelerate_accumulation_trains_like_the_whole_batch_unless_the_loss_is_divided_twice(
        fault: str, cause: str | None) -> None:
    """accelerator.backward divides the loss by the accumulation steps: dividing it again halves the steps."""
    result = tp.check_runs_equivalent([*ACCELERATE, "--batch", "8"],
                                      [*ACCELERATE, "--batch", "4", "--grad_accum", "2", "--fault", fault], steps=3,
                                      comparison=tp.ToleranceComparison(rtol=1e-5, atol=1e-7), timeout=300)
    first = result.first_violation
    if cause is None:
        assert result.outcome is tp.Outcome.PASS, result.report()
    else:
        assert first is not None and (first.path, first.step, first.cause) == ("loss", 1, cause), result.report()


# -- PyTorch-Ignite: Checkpoint(to_save), Checkpoint.load_objects, trainer.run ------------------------------------


@pytest.mark.exact
@needs_ignite
@pytest.mark.parametrize("dropout", ["0", pytest.param("0.2", marks=pytest.mark.torch_internals)])
def test_an_ignite_deterministic_engine_resumed_with_load_objects_passes(dropout: str) -> None:
    """Its LRScheduler handler moves the learning rate at ITERATION_STARTED, before the first backward of the
    resumed run, as it does in the uninterrupted run: not a lost state. The DeterministicEngine seeds the global
    RNG from the iteration, so dropout resumes exactly too."""
    result = check_script("ignite_train.py", "--resume", "--dropout", dropout)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.exact
@needs_ignite
def test_an_ignite_trainer_missing_from_to_save_replays_the_epoch_and_is_named() -> None:
    result = check_script("ignite_train.py", "--resume", "--fault", "trainer_not_saved")
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("data.sample_ids", 4, "data_replayed"), (
        result.report())
    assert "Ignite's Checkpoint does not save the trainer Engine" in first.message


@pytest.mark.exact
@needs_ignite
def test_an_ignite_scheduler_missing_from_to_save_is_named_with_the_keys_it_has() -> None:
    result = check_script("ignite_train.py", "--resume", "--fault", "scheduler_not_saved")
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("scheduler.last_epoch", 3, "not_restored"), (
        result.report())
    assert "its to_save has the keys 'trainer', 'model', 'optimizer'" in first.message


@pytest.mark.exact
@needs_ignite
def test_a_plain_ignite_engine_holds_no_rng_and_dropout_draws_a_fresh_start_s_stream() -> None:
    result = check_script("ignite_train.py", "--resume", "--engine", "plain", "--dropout", "0.2")
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("rng.torch", 4, "not_restored"), (
        result.report())


IGNITE = [sys.executable, str(SCRIPTS / "ignite_train.py"), "--out_dir", "{workdir}"]


@pytest.mark.exact
@needs_ignite
@pytest.mark.parametrize(("extra", "passes"), [
    pytest.param(["--engine", "plain"], True, marks=pytest.mark.torch_internals),
    (["--scheduler_event", "completed"], False)])
def test_ignite_runs_compared_step_by_step(extra: list[str], passes: bool) -> None:
    """A plain Engine trains as the DeterministicEngine does when nothing draws from the RNG; the scheduler moved
    to ITERATION_COMPLETED changes the learning rate one step later."""
    result = tp.check_runs_equivalent(IGNITE, [*IGNITE, *extra], steps=4, timeout=300)
    assert result.passed is passes, result.report()
    if not passes:
        first = result.first_violation
        assert first is not None and (first.path, first.step) == ("scheduler.last_epoch", 1), result.report()
