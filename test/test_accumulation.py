"""tp.check_accumulation: one fault per diagnosis code, clean controls, ABSTAIN, ERROR, bad input, cleanup."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import test_accumulation_recipes as recipes
import torch
import torch.nn.utils.clip_grad as clip_grad
from torch import nn

import trainparity as tp
import trainparity._accumulation
import trainparity._state._snapshot
from trainparity._cli import main

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

TOL = recipes.TOLERANCE


def check(recipe: Any, **kwargs: Any) -> tp.AccumulationResult:
    kwargs.setdefault("comparison", TOL)
    with warnings.catch_warnings():
        # SchedulerPerMicrobatch steps its scheduler before the first optimizer step, on purpose.
        warnings.filterwarnings("ignore", "Detected call of", UserWarning)
        return tp.check_accumulation(recipe, **kwargs)


# -- one fault per diagnosis code ------------------------------------------------------------------

FAULTS = [
    # recipe, check arguments, path of the first violation, kind, cause, window
    (recipes.NotScaled, {}, "gradients.0.weight", "gradient_mismatch", "loss_not_scaled", 1),
    (recipes.NotScaled, {"microbatches": (3, 3, 2)}, "gradients.0.weight", "gradient_mismatch",
     "loss_not_scaled", 1),
    (recipes.SparseEmbedding(scaled=False), {}, "gradients.weight", "gradient_mismatch", "loss_not_scaled", 1),
    (recipes.ScaledTwice, {}, "gradients.0.weight", "gradient_mismatch", "loss_scaled_twice", 1),
    (recipes.NoZeroGrad, {}, "gradients.0.weight", "gradient_mismatch", "grads_not_reset", 2),
    (recipes.Premature, {}, "optimizer_steps", "step_count_mismatch", "premature_step", 1),
    (recipes.SamplesPerStep, {}, "optimizer_steps", "step_count_mismatch", "missing_step", 1),
    (recipes.StepsEveryMicrobatch, {}, "optimizer_steps", "step_count_mismatch", "extra_step", 1),
    # a step inside the window is observed before the window's declared losses can be summed
    (recipes.TokenWeightedPremature, {}, "optimizer_steps", "step_count_mismatch", "premature_step", 1),
    (recipes.TokenWeightedEveryMicrobatch, {}, "optimizer_steps", "step_count_mismatch", "extra_step", 1),
    (recipes.SchedulerPerMicrobatch, {}, "optimizer.param_groups.0.lr", "learning_rate_mismatch",
     "scheduler_per_microbatch", 1),
    (recipes.LrFromCounter(per_microbatch=True), {}, "optimizer.param_groups.0.lr", "learning_rate_mismatch",
     "lr_schedule_per_microbatch", 2),
    (recipes.ScalerStepBypassed, {}, "gradients.0.weight", "step_on_scaled_gradients", "scaled_gradients_stepped",
     1),
    (recipes.WithBatchNorm, {}, "gradients.0.weight", "gradient_mismatch", "batch_dependent_layer", 1),
    (recipes.MeanOfMeansDeclared, {"microbatches": (3, 3, 2)}, "loss_accounting", "loss_accounting_mismatch",
     "mean_of_means", 1),
    # nanoGPT's evaluation on random batches at each step draws the same numbers in both runs
    (recipes.EvaluatesEachStep(scaled=False), {}, "gradients.0.weight", "gradient_mismatch", "loss_not_scaled", 1),
    (recipes.ClipPerMicrobatch, {}, "gradients.0.weight", "gradient_mismatch", "clip_per_microbatch", 1),
    (recipes.MeanOfMeans, {}, "loss_accounting", "loss_accounting_mismatch", "mean_of_means", 1),
    (recipes.MeanOfMeansBareLoss, {}, "gradients.weight", "gradient_mismatch", "mean_of_means", 1),
    # a per-sample mean divided by k is a mean of means as soon as the micro-batches differ in size
    (recipes.MLP, {"microbatches": (3, 3, 2)}, "gradients.0.weight", "gradient_mismatch", "mean_of_means", 1),
    (recipes.TokensOwnMean, {}, "loss_accounting", "loss_accounting_mismatch", "loss_not_scaled", 1),
    (recipes.ClipBeforeUnscale, {}, "gradients.0.weight", "clip_on_scaled_gradients",
     "unscale_before_clip_missing", 1),
]


@pytest.mark.parametrize(("recipe", "kwargs", "path", "kind", "cause", "window"), FAULTS,
                         ids=[f"{getattr(f[0], '__name__', type(f[0]).__name__)}-{f[4]}" for f in FAULTS])
def test_fault_is_caught_with_its_phase_and_cause(
    recipe: type[tp.Recipe], kwargs: dict[str, Any], path: str, kind: str, cause: str, window: int
) -> None:
    result = check(recipe, **kwargs)
    assert result.outcome is tp.Outcome.FAIL, result.report()
    first = result.first_violation
    assert first is not None
    assert (first.path, first.kind, first.cause, first.step) == (path, kind, cause, window), result.report()
    assert f"Diagnosis ({cause})" in first.message


def test_every_diagnosis_code_has_a_fault() -> None:
    codes = {"loss_not_scaled", "loss_scaled_twice", "grads_not_reset", "premature_step", "missing_step",
             "extra_step", "scheduler_per_microbatch", "clip_per_microbatch", "mean_of_means",
             "unscale_before_clip_missing", "scaled_gradients_stepped", "lr_schedule_per_microbatch",
             "batch_dependent_layer"}
    assert {fault[4] for fault in FAULTS} == codes


def test_step_violation_records_counts_per_microbatch() -> None:
    first = check(recipes.StepsEveryMicrobatch).first_violation
    assert first is not None
    assert (first.expected, first.actual, first.position) == ([0, 0, 0, 1], [1, 1, 1, 1], 0)
    first = check(recipes.Premature, microbatches=2).first_violation
    assert first is not None
    assert (first.expected, first.actual) == ([0, 1], [1, 0])


def test_gradient_fault_reports_losses_and_consequences() -> None:
    result = check(recipes.NotScaled)
    first = result.first_violation
    assert first is not None and "Losses returned by step(): reference" in first.message
    later = [v for v in result.violations if v.path.startswith(("parameters.", "optimizer."))]
    assert later and all(v.cause is None and "follows from the earlier divergence" in v.message for v in later)
    assert "windows after window 1 not judged: they start from the diverged state" in result.notes


def test_contributions_are_held_only_for_windows_whose_gradients_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process the candidate drops its micro-batch contribution samples (about SAMPLE_ELEMENTS float64 per
    # call) in a window whose gradients all agreed with the reference's: only a differing gradient's diagnosis
    # reads them. NoZeroGrad agrees in window 1 and differs in window 2, where the diagnosis needs them.
    candidates: list[Any] = []
    judge = trainparity._accumulation.judge_accumulation

    def keep_candidate(reference: Any, candidate: Any, *args: Any) -> tp.AccumulationResult:
        candidates.append(candidate)
        return judge(reference, candidate, *args)

    monkeypatch.setattr(trainparity._accumulation, "judge_accumulation", keep_candidate)
    assert check(recipes.Scaled).passed
    failed = check(recipes.NoZeroGrad)
    assert failed.first_violation is not None and failed.first_violation.cause == "grads_not_reset"
    held = [[[bool(call.contribution) for call in window.calls] for window in trace.windows] for trace in candidates]
    # NoZeroGrad's first candidate run samples none (the judge asks for them, `ContributionsNeeded`), its second
    # holds those of window 2 alone
    assert held == [[[False] * 4, [False] * 4], [[False] * 4, [False] * 4], [[False] * 4, [True] * 4]]


def test_contributions_are_sampled_only_in_a_second_candidate_run_when_a_diagnosis_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process the candidate runs first without sampling contributions (a gradient hook per parameter and
    # backward); only when the judge diagnoses a gradient that differs from the reference's, which reads them, does
    # it run again sampling them, and that run is the one judged.
    runs: list[tuple[str, int]] = []  # (run, contributions sampled in it)
    observer_class = trainparity._accumulation._run.Observer

    class CountingObserver(observer_class):  # type: ignore[misc, valid-type]
        def _contribution(self, name: str, grad: torch.Tensor) -> None:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            super()._contribution(name, grad)

    run = trainparity._accumulation._run.accumulation_run

    def counted_run(payload: Any, workdir: Any) -> Any:
        runs.append(("reference" if payload.microbatches is None else "candidate", 0))
        return run(payload, workdir)

    monkeypatch.setattr(trainparity._accumulation._run, "Observer", CountingObserver)
    monkeypatch.setattr(trainparity._accumulation._run, "accumulation_run", counted_run)
    assert check(recipes.Scaled).passed
    assert runs == [("reference", 0), ("candidate", 0)]
    runs.clear()
    failed = check(recipes.NotScaled)
    assert failed.first_violation is not None and failed.first_violation.cause == "loss_not_scaled"
    assert [name for name, _ in runs] == ["reference", "candidate", "candidate"] and runs[1][1] == 0 < runs[2][1]
    runs.clear()
    premature = check(recipes.Premature)  # a step count differs: no gradient diagnosis, no second run
    assert premature.first_violation is not None and premature.first_violation.cause == "premature_step"
    assert runs == [("reference", 0), ("candidate", 0)]
    runs.clear()
    # Nothing shared (as on a GPU, where the reference's copies are on the CPU): a pass is still two runs.
    monkeypatch.setattr(trainparity._state._snapshot.Sharing, "leaf", lambda self, path, tensor: None)
    assert check(recipes.Scaled).passed
    assert runs == [("reference", 0), ("candidate", 0)]


def test_scheduler_fault_marks_the_scheduler_state_and_the_learning_rate_used() -> None:
    result = check(recipes.SchedulerPerMicrobatch)
    first = result.first_violation
    assert first is not None
    assert "stepped with learning rates [0.0125] where the reference used [0.1]" in first.message
    scheduler = [v for v in result.violations if v.path.startswith("scheduler.")]
    assert scheduler and all(v.cause == "scheduler_per_microbatch" for v in scheduler)
    assert "scheduler.last_epoch" in {v.path for v in scheduler}


def test_gradients_reset_between_microbatches_is_observed_without_a_code() -> None:
    first = check(recipes.ZeroGradEveryCall).first_violation
    assert first is not None and first.path == "gradients.0.weight" and first.cause is None
    assert "hold only the last micro-batch's gradient" in first.message


def test_native_float32_rounding_fails_exact_and_passes_the_documented_tolerance() -> None:
    exact = check(recipes.MLP32, comparison=None, precision="native")
    first = exact.first_violation
    assert exact.outcome is tp.Outcome.FAIL and first is not None and first.cause is None
    assert "floating-point rounding" in first.message and "precision='float64' (the default)" in first.message
    declared = check(recipes.MLP32, comparison=tp.ToleranceComparison(rtol=1e-5, atol=1e-6), cycles=4,
                     precision="native")
    assert declared.outcome is tp.Outcome.PASS, declared.report()


def test_float32_recipe_is_judged_in_float64_by_default() -> None:
    result = tp.check_accumulation(recipes.MLP32, cycles=4)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert (result.config["precision"], result.config["comparison"]) == (
        "float64", "tolerance(rtol=1e-07, atol=1e-09), the float64 default")
    faulty = tp.check_accumulation(recipes.NotScaled)
    assert faulty.first_violation is not None and faulty.first_violation.cause == "loss_not_scaled"


def test_recipe_that_forces_float32_is_an_error_naming_native() -> None:
    result = tp.check_accumulation(recipes.ForcesFloat32)
    assert result.outcome is tp.Outcome.ERROR, result.report()
    assert "precision='native'" in result.report()
    assert tp.check_accumulation(recipes.ForcesFloat32, precision="native",
                                 comparison=tp.ToleranceComparison(rtol=1e-5, atol=1e-6)).passed


def test_autocast_and_grad_scaler_run_in_float64() -> None:
    result = tp.check_accumulation(recipes.AutocastScaled)
    assert result.outcome is tp.Outcome.PASS, result.report()
    native = tp.check_accumulation(recipes.AutocastScaled, precision="native",
                                   comparison=tp.ToleranceComparison(rtol=1e-2, atol=1e-3))
    assert native.outcome is tp.Outcome.PASS, native.report()


@pytest.mark.parametrize("width", [1024, 2048])
def test_clean_adamw_passes_without_a_declared_comparison(width: int) -> None:
    result = tp.check_accumulation(recipes.AdamWWide(width=width), microbatches=4)
    assert result.outcome is tp.Outcome.PASS, result.report()
    faulty = tp.check_accumulation(recipes.AdamWWide(width=width, scaled=False), microbatches=4)
    assert faulty.first_violation is not None and faulty.first_violation.cause == "loss_not_scaled", faulty.report()


def test_mean_of_means_is_never_also_called_loss_not_scaled() -> None:
    result = check(recipes.MeanOfMeansDeclared, microbatches=(3, 3, 2))
    first = result.first_violation
    assert first is not None and first.cause == "mean_of_means", result.report()
    assert not any(v.cause == "loss_not_scaled" for v in result.violations if v.step == first.step)


def test_learning_rate_from_an_optimizer_step_counter_passes() -> None:
    assert check(recipes.LrFromCounter).passed
    result = check(recipes.LrFromCounter(per_microbatch=True))
    first = result.first_violation
    assert first is not None and "stepped with learning rates [0.05] where the reference used [0.02]" in \
        first.message, result.report()


# -- clean controls ----------------------------------------------------------------------------------

CLEAN = [
    (recipes.MLP, {}),
    (recipes.MLP, {"microbatches": 2, "cycles": 3}),
    (recipes.AdamWUnscaledReturn, {}),
    (recipes.ClipAtBoundary, {}),
    (recipes.Scaled, {}),
    (recipes.SumOverWindow, {"microbatches": (3, 3, 2)}),
    (recipes.SumOverWindow, {"microbatches": (1, 5, 2)}),
    (recipes.TokenWeighted, {"microbatches": (3, 3, 2)}),
    (recipes.TokenWeighted, {}),
    (recipes.FrozenBatchNorm, {}),
    (recipes.MLP, {"split": recipes.chunk_split}),
    (recipes.ClipPerMicrobatch(max_norm=1e6), {}),
    (recipes.ExactLinear, {"comparison": None}),
    (recipes.SparseEmbedding, {}),
    (recipes.CheckpointsInStep, {}),
]


@pytest.mark.parametrize(("recipe", "kwargs"), CLEAN, ids=[f"{getattr(c[0], '__name__', type(c[0]).__name__)}-{i}"
                                                            for i, c in enumerate(CLEAN)])
def test_clean_recipe_passes(recipe: Any, kwargs: dict[str, Any]) -> None:
    result = check(recipe, **kwargs)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.violations == []


def test_both_loss_return_conventions_pass_and_are_shown_unjudged() -> None:
    for recipe in (recipes.MLP, recipes.AdamWUnscaledReturn):
        result = check(recipe)
        assert result.passed, result.report()
        assert any(note.startswith("loss_accounting not judged: step() returns a bare loss") for note in result.notes)


def test_loss_accounting_is_judged_when_declared() -> None:
    result = check(recipes.TokenWeighted, microbatches=(3, 3, 2))
    assert result.passed and not any("loss_accounting" in note for note in result.notes)


def test_loss_accounting_convention_alone_never_fails() -> None:
    result = check(recipes.TokenWeightedUnscaledValue, microbatches=(3, 3, 2))
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert any(note.startswith("loss_accounting differs in windows 1, 2 (it would be diagnosed loss_not_scaled)")
               for note in result.notes)


def test_exact_default_comparison_in_native_precision() -> None:
    result = tp.check_accumulation(recipes.ExactLinear, precision="native")
    assert result.passed and result.config["comparison"] == "exact"


def test_harmless_clipping_per_microbatch_is_noted() -> None:
    result = check(recipes.ClipPerMicrobatch(max_norm=1e6))
    assert any("clip_grad_norm_() at micro-batches 0, 1, 2 of windows 1, 2, before its optimizer step" in n
               for n in result.notes)


def test_dropout_is_disabled_in_both_runs_and_said() -> None:
    result = check(recipes.WithDropout)
    assert result.passed
    assert "dropout disabled in both runs (disable_dropout=True): model.2" in result.notes
    kept = check(recipes.WithDropout, disable_dropout=False)
    assert "dropout left active in both runs (disable_dropout=False)" in kept.notes
    assert any("step() draws random numbers" in note for note in kept.notes + [kept.reason or ""])


@pytest.mark.parametrize(("recipe", "said"), [
    (recipes.FunctionalDropout, "F.dropout(p>0) calls"),
    (recipes.AttentionDropout, "model.1, F.scaled_dot_product_attention(p>0) calls"),
])
def test_functional_dropout_is_disabled_for_the_run_only(recipe: type[tp.Recipe], said: str) -> None:
    import torch.nn.functional as F

    original = F.dropout, F.scaled_dot_product_attention
    result = check(recipe)
    assert result.passed, result.report()
    assert any(said in note for note in result.notes), result.notes
    assert (F.dropout, F.scaled_dot_product_attention) == original
    kept = check(recipe, disable_dropout=False)
    assert kept.outcome is not tp.Outcome.PASS or any("draws random numbers" in n for n in kept.notes)


def test_dropout_modules_at_zero_are_named_not_denied() -> None:
    result = check(recipes.MLP)
    assert "dropout disabled in both runs (disable_dropout=True): nothing was active" in result.notes
    zero = check(recipes.AttentionDropout, disable_dropout=True)
    assert not any("no dropout module" in note for note in zero.notes)


# -- ABSTAIN and ERROR -------------------------------------------------------------------------------


def test_batchnorm_in_training_mode_fails_unless_run_in_eval_mode() -> None:
    result = check(recipes.WithBatchNorm)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None
    assert first.cause == "batch_dependent_layer" and "model.1 (BatchNorm1d)" in first.message
    assert "batch_dependent='eval'" in first.message
    evaluated = check(recipes.WithBatchNorm, batch_dependent="eval")
    assert evaluated.outcome is tp.Outcome.PASS, evaluated.report()
    assert any(note.startswith("batch-dependent layers ran in eval mode in both runs (batch_dependent='eval'): "
                               "model.1 (BatchNorm1d)") for note in evaluated.notes)


def test_randomness_drawn_the_same_way_in_both_runs_does_not_block_a_verdict() -> None:
    clean = check(recipes.EvaluatesEachStep)
    assert clean.passed, clean.report()
    assert any("the same ones at the same moments in both runs" in note for note in clean.notes)


def test_randomness_in_step_abstains_on_divergence() -> None:
    result = check(recipes.NoisyStep)
    assert result.outcome is tp.Outcome.ABSTAIN
    assert result.reason is not None and "step() draws random numbers" in result.reason
    assert result.first_violation is not None


def test_setup_that_depends_on_k_abstains() -> None:
    result = check(recipes.SetupDependsOnK)
    assert result.outcome is tp.Outcome.ABSTAIN
    assert result.first_violation is not None and result.first_violation.path == "loader.batch_size"


def test_batches_that_differ_between_runs_abstain() -> None:
    result = check(recipes.DataDependsOnK)
    assert result.outcome is tp.Outcome.ABSTAIN
    first = result.first_violation
    assert first is not None and (first.kind, first.path, first.step) == ("batch_mismatch", "batch[0]", 1)


def test_nothing_to_compare_abstains() -> None:
    result = check(recipes.ModelOutsideState)
    assert result.outcome is tp.Outcome.ABSTAIN
    assert result.reason is not None and result.reason.startswith("the State holds no optimizer")


def test_recipe_error_is_an_error_result() -> None:
    result = check(recipes.RaisesInStep)
    assert result.outcome is tp.Outcome.ERROR
    assert result.error is not None and result.error.phase == "reference"
    assert isinstance(result.exception, ValueError)


# In this process the candidate runs after the whole reference, which has been freed: each run sees the global
# state and the memory that it would see alone (running them window by window was tried and is not done, see
# docs/design.md).


def test_an_error_of_the_candidate_in_this_process_names_the_candidate() -> None:
    result = check(recipes.RaisesInCandidate)
    assert result.outcome is tp.Outcome.ERROR
    assert result.error is not None and result.error.phase == "candidate"
    assert str(result.exception) == "boom in the candidate's second window"


def test_a_timeout_of_the_candidate_in_this_process_names_the_candidate() -> None:
    result = check(recipes.HangsInCandidate, timeout=1.0)
    assert result.error is not None and (result.error.kind, result.error.phase) == ("timeout", "candidate")


def test_an_error_of_the_reference_comes_first_whatever_window_the_candidate_fails_at() -> None:
    # The reference runs out of batches at window 2, the candidate raises in window 1.
    result = check(recipes.CandidateFailsFirst, cycles=2)
    assert result.error is not None and (result.error.phase, result.error.message) == (
        "reference", "CandidateFailsFirst.batches() ran out of batches at window 2")


@pytest.mark.parametrize("recipe", [recipes.ModuleLevelCounter, recipes.ModuleLevelModelReset])
def test_module_level_state_that_setup_resets_is_each_run_own(recipe: type[recipes.MLP]) -> None:
    result = check(recipe)
    assert result.passed, result.report()


def test_the_reference_is_freed_before_the_candidate_is_set_up() -> None:
    # Two trainings alive at once would double a GPU model's memory in this process.
    recipes.ALIVE_AT_SETUP.clear()
    assert check(recipes.CountsLiveModels).passed
    assert recipes.ALIVE_AT_SETUP == [0, 0]


def test_a_state_that_setup_shares_between_the_runs_differs_at_the_start() -> None:
    # A module-level model that setup() does not reset starts the candidate from what the reference trained.
    result = check(recipes.SharedModel)
    assert result.outcome is tp.Outcome.ABSTAIN
    first = result.first_violation
    assert first is not None and first.kind == "initial_state_mismatch" and first.path.startswith("model.")


def test_batches_that_run_out_are_an_error_naming_the_window() -> None:
    result = check(recipes.OneBatch, cycles=2)
    assert result.outcome is tp.Outcome.ERROR
    assert result.error is not None and (result.error.phase, result.error.message) == (
        "reference", "OneBatch.batches() ran out of batches at window 2")


def test_process_isolation() -> None:
    result = check(recipes.NotScaled, isolation="process", timeout=60)
    assert result.first_violation is not None and result.first_violation.cause == "loss_not_scaled"
    assert result.config["isolation"] == "process"
    passed = check(recipes.Scaled, isolation="process", timeout=60, split=recipes.chunk_split)
    assert passed.passed, passed.report()
    failed = check(recipes.RaisesInStep, isolation="process", timeout=60)
    assert failed.error is not None and failed.error.exc_type == "ValueError" and failed.exception is None


def test_several_optimizers_and_schedulers_are_named_in_paths() -> None:
    result = check(recipes.TwoOptimizers)
    assert result.passed, result.report()
    broken = check(recipes.TwoOptimizers(head_every_call=True))
    first = broken.first_violation
    assert first is not None and (first.path, first.cause) == ("optimizer_steps", "extra_step")
    assert first.message.startswith("Optimizer 'opt_head' stepped 4 times")
    paths = {v.path for v in broken.violations}
    assert {"parameters.head.weight", "opt_head.state.head.weight.exp_avg"} <= paths
    # The body's optimizer stepped as it should, but on gradients through a head that changed mid-window.
    body = [v for v in broken.violations if v.path == "gradients.body.weight"]
    assert body and body[0].cause is None and broken.violations.index(body[0]) > 0


def test_modules_and_optimizers_inside_list_and_dict_entries_are_observed() -> None:
    assert check(recipes.ContainedTwoOptimizers).passed
    broken = check(recipes.ContainedTwoOptimizers(head_every_call=True))
    first = broken.first_violation
    assert first is not None and first.message.startswith("Optimizer 'optimizers.head' stepped 4 times")
    paths = {v.path for v in broken.violations}
    assert {"parameters.models.1.weight", "optimizers.head.state.models.1.weight.exp_avg"} <= paths


def test_hang_is_an_error_after_the_timeout() -> None:
    result = check(recipes.Hangs, isolation="process", timeout=3)
    assert result.outcome is tp.Outcome.ERROR
    assert result.error is not None and result.error.kind == "timeout"


# -- bad input -------------------------------------------------------------------------------------

BAD_INPUT = [
    ({"microbatches": 1}, ValueError, "microbatches= must be at least 2"),
    ({"microbatches": True}, TypeError, "got a bool"),
    ({"microbatches": "4"}, TypeError, "sequence of sizes"),
    ({"microbatches": (8,)}, ValueError, "at least 2 micro-batch sizes"),
    ({"microbatches": (4, 0, 4)}, ValueError, "must be ints >= 1"),
    ({"microbatches": (3, 3)}, ValueError, "adds up to 6 samples but the batch has 8"),
    ({"microbatches": 3}, ValueError, "does not split into 3 equal micro-batches; declare the sizes, e.g. "
                                      "microbatches=(3, 3, 2)"),
    ({"microbatches": 16}, ValueError, "a batch of 8 samples cannot be cut into 16 micro-batches"),
    ({"cycles": 0}, ValueError, "cycles= must be an int >= 1"),
    ({"comparison": 1e-5}, TypeError, "tolerances are declared"),
    ({"split": "chunk"}, TypeError, "split= must be a function"),
    ({"split": lambda batch, k: [batch]}, ValueError, "split= must return a sequence of 4 micro-batches, got 1"),
    ({"split": lambda batch, k: [batch], "isolation": "process"}, TypeError, "defined at module level"),
    ({"disable_dropout": "yes"}, TypeError, "disable_dropout= must be True or False"),
    ({"isolation": "thread"}, ValueError, "isolation= must be one of"),
    ({"timeout": 0}, ValueError, "timeout= must be a positive number"),
    ({"seed": 1.5}, TypeError, "seed= must be an int"),
]


@pytest.mark.parametrize(("kwargs", "error", "text"), BAD_INPUT, ids=[b[2][:30] for b in BAD_INPUT])
def test_bad_input_raises_a_clear_error(kwargs: dict[str, Any], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=None) as raised:
        tp.check_accumulation(recipes.MLP, **kwargs)
    assert text in str(raised.value)


def test_recipe_without_accumulation_steps_is_refused() -> None:
    with pytest.raises(TypeError, match="takes no accumulation_steps parameter"):
        tp.check_accumulation(recipes.NoAccumulationParameter)
    with pytest.raises(TypeError, match="not a tp.Recipe subclass"):
        tp.check_accumulation(nn.Linear)


def test_batch_that_cannot_be_split_is_refused() -> None:
    with pytest.raises(ValueError, match=r"batch\['weights'\] is a list of 8 plain values"):
        tp.check_accumulation(recipes.ListBatch)


# -- nothing left behind -----------------------------------------------------------------------------


def _assert_clean(state: tp.State) -> None:
    for value in vars(state).values():
        if isinstance(value, torch.optim.Optimizer):
            assert not value._optimizer_step_pre_hooks and not value._optimizer_step_post_hooks
        if isinstance(value, nn.Module):
            for parameter in value.parameters():
                assert not parameter._backward_hooks
            for module in value.modules():
                assert not module._forward_pre_hooks
                if isinstance(module, nn.Dropout):
                    assert module.p == 0.5
        if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
            assert "step" not in vars(value)
        if isinstance(value, torch.amp.GradScaler):
            assert "unscale_" not in vars(value) and "update" not in vars(value)


@pytest.mark.parametrize("recipe", [recipes.Scaled, recipes.ClipAtBoundary, recipes.WithDropout,
                                    recipes.WithBatchNorm, recipes.RaisesInStep, recipes.ClipPerMicrobatch])
def test_hooks_and_wrappers_are_removed_afterwards(recipe: type[recipes.MLP]) -> None:
    originals = {name: getattr(torch.nn.utils, name) for name in ("clip_grad_norm_", "clip_grad_value_")}
    imported = recipes.clip_grad_norm_
    recipes.BUILT.clear()
    check(recipe(record=True))
    # The reference's State and the candidate's, and the candidate's again where the judge diagnoses a gradient (its
    # run that samples each micro-batch's contribution); a reference that raises in this process ends the check
    # before the candidate is built.
    runs = {recipes.RaisesInStep: 1, recipes.WithBatchNorm: 3, recipes.ClipPerMicrobatch: 3}
    assert len(recipes.BUILT) == runs.get(recipe, 2)
    for state in recipes.BUILT:
        _assert_clean(state)
    assert {name: getattr(torch.nn.utils, name) for name in originals} == originals
    assert clip_grad.clip_grad_norm_ is originals["clip_grad_norm_"]
    assert recipes.clip_grad_norm_ is imported


# -- the mixin and the command line ------------------------------------------------------------------


class MixinTest(tp.TestCase):
    def test_error_reraises_the_recipe_error(self) -> None:
        with self.assertRaisesRegex(ValueError, "boom in step"):
            self.assertAccumulationEquivalent(recipes.RaisesInStep)


@pytest.mark.parametrize(("argv", "code"), [
    (["test_accumulation_recipes:MLP", "--rtol", "1e-9", "--atol", "1e-12"], 0),
    (["test_accumulation_recipes:NotScaled", "--microbatches", "2", "--cycles", "1"], 1),
    (["test_accumulation_recipes:NoisyStep"], 2),
    (["test_accumulation_recipes:RaisesInStep"], 3),
    (["test_accumulation_recipes:MLP", "--microbatches", "3"], 4),
    (["test_accumulation_recipes:MLP", "--microbatches", "three"], 4),
    (["test_accumulation_recipes:NoAccumulationParameter"], 4),
])
def test_cli_exit_codes(argv: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["accumulation", *argv])
    except SystemExit as exit_:  # argparse usage errors exit from parse_args
        status = exit_.code
    assert status == code, capsys.readouterr()


def test_cli_json_and_declared_sizes(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    status = main(["accumulation", "test_accumulation_recipes:SumOverWindow", "--microbatches", "3,3,2",
                   "--rtol", "1e-9", "--atol", "1e-12", "--json", str(out)])
    assert status == 0
    assert capsys.readouterr().out.startswith("trainparity accumulation check: PASS")
    document = json.loads(out.read_text())
    assert document["config"]["microbatches"] == [3, 3, 2] and document["outcome"] == "PASS"


def test_quickstart_outcomes_are_as_expected(capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity.quickstarts.accumulation import main as quickstart

    assert quickstart() == 0
    out = capsys.readouterr().out
    assert "trainparity accumulation check: PASS" in out and "cause: loss_not_scaled" in out


def test_a_quickstart_fails_when_its_bug_is_caught_as_something_else() -> None:
    from trainparity.quickstarts import shown

    clean = tp.RunsResult(tp.Outcome.PASS, [])
    broken = tp.RunsResult(tp.Outcome.FAIL, [tp.Violation("gradient_mismatch", "gradients.w", "", cause="a")])
    assert shown(clean, broken, "a") == 0 and shown(clean, broken, "gradient_mismatch") == 0
    assert shown(clean, broken, "b") == 1 and shown(broken, broken) == 1 and shown(clean, clean) == 1


# -- the observer's watches, each alone ----------------------------------------------------------------------


class _WithDropoutAndNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.body(x), 0.25, training=self.training)


def test_dropout_off_switches_dropout_off_for_its_time_and_says_what_it_switched() -> None:
    from trainparity._observe._watches import DropoutOff

    model = _WithDropoutAndNorm().train()
    state = tp.State(model=model)
    x, functional = torch.ones(8, 4), torch.nn.functional.dropout
    with DropoutOff(state, _WithDropoutAndNorm) as dropout:
        assert torch.nn.functional.dropout is not functional
        assert model.body[1].p == 0.0
        first, second = model(x), model(x)
    assert torch.equal(first, second)  # nothing dropped, by the module nor by the function
    assert model.body[1].p == 0.5 and torch.nn.functional.dropout is functional
    assert (dropout.record.modules, dropout.record.inactive, dropout.record.functions) == (
        ["model.body.1"], ["model.body.3"], ["F.dropout"])
    assert not torch.equal(model(x), model(x))  # undone on exit


def test_an_observer_refuses_to_record_forward_passes_with_dropout_off() -> None:
    """ForwardRecorder names the dropouts that dropped: under DropoutOff it would describe another run."""
    from trainparity._observe._forwards import ForwardRecorder
    from trainparity._observe._observer import Observer
    from trainparity._observe._watches import DropoutOff

    state = tp.State(model=_WithDropoutAndNorm())
    with pytest.raises(AssertionError, match="observe different runs"):
        Observer(state, _WithDropoutAndNorm, [ForwardRecorder(state, _WithDropoutAndNorm),
                                               DropoutOff(state, _WithDropoutAndNorm)])


@pytest.mark.parametrize("mode", ["fail", "eval"])
def test_batch_dependent_modules_names_those_that_ran_in_training_mode_or_runs_them_in_eval(mode: str) -> None:
    from trainparity._observe._watches import BatchDependentModules

    model = _WithDropoutAndNorm().train()
    norm = model.body[2]
    with BatchDependentModules(tp.State(model=model), mode) as watch:
        model(torch.randn(8, 4))
        assert norm.training  # left in its mode between forwards, either way
    assert watch.ran == {"model.body.2 (BatchNorm1d)"}
    assert int(norm.num_batches_tracked) == (1 if mode == "fail" else 0)  # eval mode: its statistics untouched
    model.eval()
    with BatchDependentModules(tp.State(model=model), mode) as watch:
        model(torch.randn(8, 4))
    assert watch.ran == set()
