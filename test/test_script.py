"""check_resume_script on an unmodified nanoGPT-shaped training script (test/scripts/nanogpt_train.py)."""

from __future__ import annotations

import pathlib
import shlex
import subprocess
import sys

import pytest

import trainparity as tp
from trainparity import probe
from trainparity._script import _hook

pytestmark = pytest.mark.torch_internals

check_resume_script = tp.check_resume_script

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "nanogpt_train.py"


def check(fault: str = "none", *extra: str, steps: int = 6) -> tp.ResumeResult:
    command = [sys.executable, str(SCRIPT), "--out_dir", "{workdir}", "--fault", fault, *extra]
    return check_resume_script(command, [*command, "--init_from", "resume"], steps=steps, resume_at=3, timeout=120)


@pytest.mark.exact
def test_a_script_that_resumes_exactly_passes_and_says_which_streams_it_never_seeds() -> None:
    result = check()
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert any(note.startswith("not compared: rng.numpy, rng.python") for note in result.notes), result.notes


@pytest.mark.exact
def test_an_rng_the_checkpoint_never_held_is_not_restored_a_fresh_start_s_stream() -> None:
    """nanoGPT's train.py seeds again on resume and saves no RNG: the resumed stream is a fresh start's, the first
    cause, and the batches it draws replay the first ones."""
    result = check("rng_not_saved")
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("rng.torch", 4, "not_restored"), (
        result.report())
    assert "draws a fresh start's stream" in first.message
    data = next(v for v in result.violations if v.path == "data.sample_ids")
    assert (data.step, data.cause) == (4, "data_replayed"), result.report()


@pytest.mark.exact
def test_a_prefetched_batch_lost_leads_with_the_data_and_the_restored_rng_explains_it(tmp_path: pathlib.Path) -> None:
    """The RNG was restored right; the batch prefetched before the save was not kept, so the first batch drawn
    after the resume is the next one: the data is what to fix, and the RNG's difference is that draw. Checked on
    the command line, which exits 1 on the FAIL and writes the result that is read back here."""
    command = f"{sys.executable} {SCRIPT} --out_dir {{workdir}} --fault prefetch_lost"
    written = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "trainparity", "resume-script", "--steps", "6", "--resume-at", "3",
                           "--run", command, "--resume", command + " --init_from resume", "--timeout", "120",
                           "--json", str(written)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cause: data_skipped" in done.stdout
    result = tp.ResumeResult.from_json(written.read_text())
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("data.sample_ids", 4, "data_skipped"), (
        result.report())
    assert "rng.torch was restored, then drawn differently before this batch" in first.message
    rng = next(v for v in result.violations if v.path == "rng.torch")
    assert (rng.step, rng.cause) == (4, None), result.report()


@pytest.mark.exact
def test_evaluating_again_after_the_resume_draws_the_random_batches_twice() -> None:
    result = check("eval_again")
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.kind, first.step) == ("rng.torch", "rng_mismatch", 4), result.report()


@pytest.mark.exact
@pytest.mark.parametrize("fault", ["none", "rng_not_saved"])
def test_a_checkpoint_of_several_files_is_written_whole_before_the_run_ends(fault: str) -> None:
    """The model and optimizer go to a DCP checkpoint, then the RNG state and batch to a second file:
    the interrupted run ends only once the script moves on, so the resumed run finds both."""
    result = check(fault, "--checkpoint", "sharded")
    if fault == "none":
        assert result.outcome is tp.Outcome.PASS, result.report()
    else:
        first = result.first_violation
        assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
        assert (first.path, first.step) == ("rng.torch", 4), result.report()


@pytest.mark.exact
def test_a_save_function_is_observed_from_the_moment_the_script_imports_its_module(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "checkpointing_library.py").write_text("def save(path):\n    open(path, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[object] = []
    finder = _hook._PatchOnImport({"checkpointing_library": lambda module: seen.append(module)})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    assert "checkpointing_library" not in sys.modules and seen == []  # nothing imported in advance
    import checkpointing_library  # type: ignore[import-not-found]

    assert seen == [checkpointing_library]
    monkeypatch.delitem(sys.modules, "checkpointing_library")


@pytest.mark.exact
def test_a_script_that_writes_no_checkpoint_in_time_is_an_error() -> None:
    result = check("none", "--eval_interval", "100")
    assert result.outcome is tp.Outcome.ERROR and result.error is not None, result.report()
    assert ("wrote no checkpoint (torch.save, safetensors or torch.distributed.checkpoint) at or after "
            "optimizer step 3") in result.error.message


@pytest.mark.exact
def test_a_script_that_stops_too_early_or_raises_is_an_error() -> None:
    early = check("none", "--max_iters", "4", steps=6)
    assert early.outcome is tp.Outcome.ERROR and early.error is not None, early.report()
    assert "ended after optimizer step 4, before step 6" in early.error.message
    raised = check("none", "--max_iters", "not-a-number")
    assert raised.outcome is tp.Outcome.ERROR and raised.error is not None, raised.report()
    assert raised.error.kind == "died" and raised.error.exitcode == 2  # argparse's usage error


@pytest.mark.exact
def test_the_probe_does_nothing_outside_a_check() -> None:
    assert _hook.RECORDER is None
    probe.sample_ids([1, 2, 3])
    probe.track(counter=1)
    assert _hook.RECORDER is None


@pytest.mark.exact
@pytest.mark.parametrize(("arguments", "error"), [
    ({"command": "", "resume_command": "python x.py"}, ValueError),
    ({"command": 3, "resume_command": "python x.py"}, TypeError),
    ({"command": "python x.py", "resume_command": "python x.py", "resume_at": 6}, ValueError),
    ({"command": "python x.py", "resume_command": "python x.py", "env": {"A": 1}}, TypeError),
])
def test_bad_arguments_are_refused_at_the_call(arguments: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        check_resume_script(**arguments)  # type: ignore[arg-type]


REFERENCE = [sys.executable, str(SCRIPT), "--out_dir", "{workdir}", "--double", "--eval_interval", "100",
             "--batch", "4"]
ACCUMULATED = [*REFERENCE[:-1], "2", "--grad_accum", "2"]
TOLERANCE = tp.ToleranceComparison(rtol=1e-9, atol=1e-12)  # float64: the order of the sums is all that differs


@pytest.mark.numeric
def test_accumulating_two_micro_batches_trains_like_the_whole_batch() -> None:
    result = tp.check_runs_equivalent(REFERENCE, ACCUMULATED, steps=3, comparison=TOLERANCE, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.exact
def test_a_script_that_compiles_its_model_is_observed_and_trains_like_eager() -> None:
    """torch.compile leaves a dead weakref.proxy on the heap, which the search for the script's modules once raised
    ReferenceError on; aot_eager trains exactly like eager, and the compiled model is named by its own names."""
    result = tp.check_runs_equivalent(REFERENCE, [*REFERENCE, "--compile", "aot_eager"], steps=2, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.numeric
def test_the_checkpointing_switch_of_a_script_is_configuration_not_state() -> None:
    """transformers-style `model.gradient_checkpointing = True`: a plain attribute that differs at every step and
    never changes, named in a note; the recomputed MLP trains like the stored one."""
    result = tp.check_runs_equivalent(REFERENCE, [*REFERENCE, "--checkpointing"], steps=2, comparison=TOLERANCE,
                                      timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.notes == ["Configuration, not compared (it differs between the two commands at every step and "
                            "holds no tensor): model.gradient_checkpointing."]


@pytest.mark.numeric
def test_a_loss_not_divided_by_the_accumulation_steps_is_named(tmp_path: pathlib.Path) -> None:
    """On the command line, which exits 1 on the FAIL and writes the result that is read back here."""
    written = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "trainparity", "equivalent", "--steps", "3", "--rtol", "1e-9",
                           "--atol", "1e-12", "--reference", shlex.join(REFERENCE),
                           "--candidate", shlex.join([*ACCUMULATED, "--fault", "loss_not_scaled"]),
                           "--timeout", "120", "--json", str(written)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cause: loss_not_scaled" in done.stdout
    result = tp.RunsResult.from_json(written.read_text())
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.step, first.cause) == ("loss", 1, "loss_not_scaled"), result.report()
    assert {v.cause for v in result.violations if v.step == 1} == {"loss_not_scaled"}


@pytest.mark.exact
def test_the_report_shows_the_values_of_tensors_compared_by_digest() -> None:
    # The weight (128 KiB) travels as a digest; the report's first divergence and the save/load
    # mismatches get their values by training those runs again.
    command = [sys.executable, str(SCRIPT.parent / "wide_train.py"), "--out_dir", "{workdir}", "--fault",
               "optimizer_not_saved"]
    result = tp.check_resume_script(command, [*command, "--resume"], steps=6, resume_at=3, timeout=120)
    assert result.outcome is tp.Outcome.FAIL, result.report()
    weight = next(v for v in result.violations if v.path == "model.weight")
    assert (weight.step, weight.kind) == (4, "state_mismatch"), result.report()
    assert "Mismatched elements: 32768 / 32768" in weight.message and "digest" not in weight.message, weight.message
    moment = next(v for v in result.violations if v.path == "optimizer.state.weight.exp_avg")
    assert (moment.step, moment.cause) == (3, "not_restored") and "digest" not in moment.message, moment.message
    assert not any("digest" in note for note in result.notes), result.notes


@pytest.mark.exact
def test_a_restored_tensor_known_by_its_digest_is_reported_with_its_values() -> None:
    """The weight the checkpoint lost is held, at the resumed run's first backward, against the baseline's at the
    same point: both are digests (128 KiB), and the report shows their values."""
    command = [sys.executable, str(SCRIPT.parent / "wide_train.py"), "--out_dir", "{workdir}", "--fault",
               "model_not_saved"]
    result = tp.check_resume_script(command, [*command, "--resume"], steps=6, resume_at=3, timeout=120)
    first = result.first_violation
    assert first is not None and (first.path, first.step, first.cause) == ("model.weight", 3, "not_restored"), (
        result.report())
    assert "Mismatched elements: 32768 / 32768" in first.message and "digest" not in first.message, first.message


LOOP_SHAPES = SCRIPT.parent / "loop_shapes_train.py"


def loop_shape(shape: str, fault: str = "none", steps: int = 6, resume_at: int = 3) -> tp.ResumeResult:
    command = [sys.executable, str(LOOP_SHAPES), "--out_dir", "{workdir}", "--shape", shape, "--fault", fault]
    return check_resume_script(command, [*command, "--resume"], steps=steps, resume_at=resume_at, timeout=120)


@pytest.mark.exact
@pytest.mark.parametrize("shape", ["top", "bottom", "epoch", "callback"])
def test_code_between_the_load_and_the_first_step_is_held_against_the_same_code_uninterrupted(shape: str) -> None:
    """A scheduler at the top of the iteration (Ignite's LRScheduler handler), or a callback that sets the learning
    rate before the forward, changes the restored State before the first backward, as it changes the
    uninterrupted run's at the same point: that is not a lost state."""
    result = loop_shape(shape)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.exact
@pytest.mark.parametrize(("shape", "path", "resume_at"), [
    ("top", "scheduler.last_epoch", 3), ("epoch", "scheduler.last_epoch", 6), ("callback", "callback.seen", 3),
])
def test_a_scheduler_or_callback_the_checkpoint_lost_is_not_restored_whatever_the_loop(shape: str, path: str,
                                                                                        resume_at: int) -> None:
    result = loop_shape(shape, "scheduler_not_saved", steps=8, resume_at=resume_at)
    restored = [v for v in result.violations if v.cause == "not_restored"]
    assert result.outcome is tp.Outcome.FAIL and path in [v.path for v in restored], result.report()
    assert all(v.step == resume_at for v in restored), result.report()
