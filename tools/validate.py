"""The validation matrix: `python tools/validate.py [--write docs/validation.md]`.

Runs the clean controls and the deliberate faults of the realistic examples in `examples/`
through the resume, accumulation and coverage checks, (surface "parallel") through the resume
and parallel checks on real gloo ranks, (surfaces "frozen" and "train-mode") through the
frozen, optimizer coverage and train-mode checks, (surface "autocast") through the mixed-precision
check's autocast coverage, (surface "workers") through the worker randomness check and (surface
"training") through the verdicts of check_training, and compares each outcome and first violation
(path and cause) with what the fault declares. Prints one table per surface; with `--write FILE`,
also writes the tables, the exact command and the versions that produced them. Exits 1 when a
clean control does not pass or a fault is missed, 0 otherwise (the StatefulDataLoader cases are
skipped, and said to be, when torchdata is not installed).

The faults are constructor arguments of the examples' recipes and pipelines (`fault="..."`),
each modelled on a bug that real training code has had; this file only declares what each
should be caught as.
"""

from __future__ import annotations

import os

# Tiny models train faster on one thread than on two, and the checks' processes inherit this.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402  (the environment variable goes first: torch reads it when it loads)
import dataclasses  # noqa: E402
import fnmatch  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import trainparity as tp  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))  # the examples are modules the checks' fresh processes import

import augment  # noqa: E402
import autocast_lm  # noqa: E402
import charlm  # noqa: E402
import classifier  # noqa: E402
import cnn  # noqa: E402
import finetune  # noqa: E402
import fsdp_gpt  # noqa: E402
import packing  # noqa: E402
import pipeline_mlp  # noqa: E402
import stateful_loader  # noqa: E402
import tp_mlp  # noqa: E402
import transformations  # noqa: E402

torch.set_num_threads(1)
# Faulted recipes step the scheduler out of order on purpose; torch warns about it.
warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
# The autocast fault that asks for CUDA on a CPU model: torch warns that it turns the region off.
warnings.filterwarnings("ignore", message="CUDA is not available")

SURFACES = ("resume", "accumulation", "coverage", "parallel", "equivalent", "frozen", "train-mode", "autocast",
            "workers", "training")
RESUME = {"steps": 8, "resume_at": 3, "timeout": 120.0}
#: judged in float64 (the default precision) with its fixed tolerance: the same verdict on any CPU
ACCUMULATION = {"microbatches": 4, "cycles": 2}


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a fault must be caught as: the outcome, and the first violation's path (fnmatch) and cause."""

    path: str
    cause: str | None
    outcome: tp.Outcome = tp.Outcome.FAIL
    #: other fields of the first violation that must match, e.g. {"worker": 1}
    fields: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        extra = "".join(f", {name}={value}" for name, value in self.fields)
        return f"{self.outcome} {self.path} ({self.cause or '-'}{extra})"


@dataclasses.dataclass(frozen=True)
class Case:
    surface: str
    example: str
    name: str
    #: the real bug this fault is modelled on; for a clean control, what it checks
    models: str
    run: Callable[[], tp.Result]
    #: None for a clean control, which must PASS
    expect: Expect | None = None


@dataclasses.dataclass(frozen=True)
class Row:
    case: Case
    observed: str
    ok: bool
    reason: str
    seconds: float
    skipped: bool = False


def resume(recipe: type[tp.Recipe], fault: str | None = None) -> Callable[[], tp.Result]:
    return lambda: tp.check_resume(recipe(fault=fault), **RESUME)  # type: ignore[call-arg]


def accumulation(recipe: type[tp.Recipe], fault: str | None = None) -> Callable[[], tp.Result]:
    return lambda: tp.check_accumulation(recipe(fault=fault), **ACCUMULATION)  # type: ignore[call-arg]


def charlm_coverage(fault: str | None = None) -> Callable[[], tp.Result]:
    policy = [tp.ExactlyOnce(range(len(charlm.LINES))), tp.DistinctEpochOrder()]
    return lambda: tp.check_coverage(charlm.coverage_epochs(epochs=3, fault=fault), policy=policy)


def cnn_coverage(layout: str, fault: str | None = None) -> Callable[[], tp.Result]:
    """`layout`: "2 ranks" (2 epochs, every sample once, reshuffled), "4 ranks" (the padded epoch), "stream"."""
    universe = range(cnn.TRAIN)

    def run() -> tp.Result:
        if layout == "2 ranks":
            epochs = [cnn.rank_loaders(epoch, world=2, fault=fault) for epoch in range(2)]
            return tp.check_coverage(epochs, policy=[tp.ExactlyOnce(universe), tp.DistinctEpochOrder()],
                                     sample_ids=cnn.sample_ids)
        if layout == "4 ranks":
            return tp.check_coverage(cnn.rank_loaders(world=4, fault=fault),
                                     policy=tp.ExpectedPadding(universe, padding=2), sample_ids=cnn.sample_ids)
        return tp.check_coverage(cnn.rank_loaders(world=2, streaming=True, fault=fault),
                                 policy=tp.ExactlyOnce(universe), sample_ids=cnn.sample_ids)

    return run


def stateful_coverage(fault: str | None = None) -> Callable[[], tp.Result]:
    return lambda: tp.check_coverage(stateful_loader.resumed_epoch(world=2, stop_after=2, fault=fault),
                                     policy=tp.ExactlyOnce(range(stateful_loader.ROWS)))


def ranks(fault: str | None = None, resume_world_size: int = 2, dropout: float = 0.0) -> Callable[[], tp.Result]:
    """The FSDP2 + DCP tiny GPT saved on 2 ranks and resumed on `resume_world_size`."""
    recipe = fsdp_gpt.TinyGPT(dropout=dropout, fault=fault)
    return lambda: tp.check_resume(recipe, steps=6, resume_at=3, world_size=2, resume_world_size=resume_world_size,
                                   timeout=120.0)


def sharded(fault: str | None = None) -> Callable[[], tp.Result]:
    """The FSDP2 tiny GPT on 2 ranks against one process."""
    return lambda: tp.check_parallel(fsdp_gpt.TinyGPT(dropout=0.0, fault=fault), world_size=2, steps=3,
                                     timeout=120.0)


def tensor_parallel(fault: str | None = None) -> Callable[[], tp.Result]:
    """The tensor-parallel MLP on 2 ranks against one process."""
    return lambda: tp.check_parallel(tp_mlp.TensorParallelMLP(fault), world_size=2, steps=2, timeout=120.0)


def pipeline(schedule: str, fault: str | None = None, **options: Any) -> Callable[[], tp.Result]:
    """The pipeline-parallel MLP on 2 stages (4 ranks with dp=2) against the whole model in one process."""
    recipe = pipeline_mlp.Pipeline(schedule, fault=fault, **options)
    return lambda: tp.check_parallel(recipe, world_size=2 * recipe.dp, steps=2, timeout=120.0)


#: what examples/finetune.py freezes after its warm-up, and keeps in eval mode (mmcv's norm_eval)
FINETUNE_FROZEN = ["backbone.stem.*", "backbone.stages.0.*"]
FINETUNE_IN_EVAL = ["backbone.stem", "backbone.stages.0"]


def frozen(fault: str | None = None, declared: bool = False) -> Callable[[], tp.Result]:
    """The fine-tuning loop's frozen stages, as setup() froze them or as declared."""
    return lambda: tp.check_frozen(finetune.FineTune(fault), frozen=FINETUNE_FROZEN if declared else None)


def optimizer_coverage(fault: str | None = None) -> Callable[[], tp.Result]:
    return lambda: tp.check_optimizer_coverage(finetune.FineTune(fault), steps=2)


def train_mode(fault: str | None = None) -> Callable[[], tp.Result]:
    return lambda: tp.check_train_mode(finetune.FineTune(fault), eval_modules=FINETUNE_IN_EVAL)


def autocast(fault: str | None = None, **allowed: Any) -> Callable[[], tp.Result]:
    """The bfloat16 language model's mixed precision (its autocast coverage), 2 steps."""
    return lambda: tp.check_mixed_precision(autocast_lm.AutocastLM(fault=fault), steps=2, **allowed)


def workers(stream: bool = False, fault: str | None = None) -> Callable[[], tp.Result]:
    """The augmentation pipeline's workers over 2 epochs: the map-style loader, or the streaming one."""
    return lambda: tp.check_worker_randomness((augment.stream_loader if stream else augment.loader)(fault), epochs=2)


#: check_training's verdicts as a test suite asks for them, on examples/classifier.py
TRAINING: dict[str, dict[str, Any]] = {
    "loss decreases": {"steps": 20, "min_decrease": 0.1},
    "overfits one batch": {"steps": 100, "overfit": True},
    "healthy": {"steps": 20, "max_grad_norm": 10.0, "update_ratio": True, "max_skipped_steps": 0},
    "schedule": {"steps": 20, "lr_schedule": classifier.learning_rate},
    "overfits one batch, schedule": {"steps": 100, "overfit": True, "lr_schedule": classifier.learning_rate},
}


def training(verdicts: str, fault: str | None = None) -> Callable[[], tp.Result]:
    return lambda: tp.check_training(classifier.Classifier(fault), **TRAINING[verdicts])


def training_case(verdicts: str, fault: str | None, models: str, expect: Expect | None = None) -> Case:
    return Case("training", "classifier", f"{fault or 'clean'} ({verdicts})", models, training(verdicts, fault), expect)


def equivalent(reference: dict[str, Any], candidate: dict[str, Any]) -> Callable[[], tp.Result]:
    """`check_equivalent` of two configurations of examples/transformations.py, 4 steps in float64."""
    return lambda: tp.check_equivalent(transformations.Transformed(**reference),
                                       transformations.Transformed(**candidate))


def restored(path: str) -> Expect:
    return Expect(path, "not_restored")


CharLM, Shapes, Rows = charlm.CharLM, cnn.ShapesClassifier, stateful_loader.RowRegression

CASES = [
    # -- resume ------------------------------------------------------------------------------------------
    Case("resume", "charlm", "clean", "save at step 3 of 8, mid-epoch", resume(CharLM)),
    Case("resume", "charlm", "optimizer_not_saved", "checkpoint without the optimizer: AdamW moments restart",
         resume(CharLM, "optimizer_not_saved"), restored("optimizer.state.embed.weight.step")),
    Case("resume", "charlm", "scheduler_not_saved", "checkpoint without the scheduler: warmup restarts",
         resume(CharLM, "scheduler_not_saved"), restored("scheduler.last_epoch")),
    Case("resume", "charlm", "scheduler_rebuilt_after_optimizer_load",
         "LambdaLR built after optimizer.load_state_dict overwrites the restored lr",
         resume(CharLM, "scheduler_rebuilt_after_optimizer_load"), restored("optimizer.param_groups.0.lr")),
    Case("resume", "charlm", "scaler_not_saved", "GradScaler state lost: the loss scale restarts",
         resume(CharLM, "scaler_not_saved"), restored("scaler.scale")),
    Case("resume", "charlm", "torch_rng_not_saved", "torch RNG not saved: other dropout masks",
         resume(CharLM, "torch_rng_not_saved"), restored("rng.torch")),
    Case("resume", "charlm", "cursor_ignored_on_resume", "cursor restored but the epoch restarts from batch 0",
         resume(CharLM, "cursor_ignored_on_resume"), Expect("data.sample_ids", "data_replayed")),
    Case("resume", "charlm", "cursor_counts_prefetched", "cursor counts what a prefetcher fetched, not trained",
         resume(CharLM, "cursor_counts_prefetched"), Expect("data.sample_ids", "data_skipped")),
    Case("resume", "cnn", "clean", "save at step 3 of 8, mid-epoch, 2 DataLoader workers", resume(Shapes)),
    Case("resume", "cnn", "optimizer_not_saved", "checkpoint without the optimizer: SGD momentum restarts",
         resume(Shapes, "optimizer_not_saved"), restored("optimizer.state.model.0.weight.momentum_buffer")),
    Case("resume", "cnn", "plateau_not_saved", "ReduceLROnPlateau not saved: its best and patience restart",
         resume(Shapes, "plateau_not_saved"), restored("scheduler.last_epoch")),
    Case("resume", "cnn", "ema_rebuilt_on_resume", "EMA re-initialized from the loaded weights",
         resume(Shapes, "ema_rebuilt_on_resume"), restored("ema.n_averaged")),
    Case("resume", "cnn", "numpy_rng_not_saved", "numpy RNG not saved: other random erasing",
         resume(Shapes, "numpy_rng_not_saved"), restored("rng.numpy")),
    Case("resume", "cnn", "python_rng_not_saved", "Python RNG not saved: other random erasing",
         resume(Shapes, "python_rng_not_saved"), restored("rng.python")),
    Case("resume", "cnn", "cursor_counts_prefetched", "cursor counted by the batch sampler, ahead by the prefetch",
         resume(Shapes, "cursor_counts_prefetched"), Expect("data.sample_ids", "data_skipped")),
    Case("resume", "cnn", "iterator_seeded_from_global_rng",
         "DataLoader without a generator draws its base seed from the global RNG at the resume",
         resume(Shapes, "iterator_seeded_from_global_rng"), Expect("rng.torch", None)),
    Case("resume", "stateful_loader", "clean", "StatefulDataLoader resumed mid-epoch", resume(Rows)),
    Case("resume", "stateful_loader", "loader_not_saved", "loader.state_dict() not in the checkpoint",
         resume(Rows, "loader_not_saved"), restored("loader.*")),
    Case("resume", "stateful_loader", "iteration_not_saved", "the iteration counter that drives warmup is lost",
         resume(Rows, "iteration_not_saved"), restored("iteration")),
    # -- accumulation ------------------------------------------------------------------------------------
    Case("accumulation", "charlm", "clean", "4 micro-batches, token-weighted, GradScaler, clipping",
         accumulation(CharLM)),
    Case("accumulation", "charlm", "loss_not_scaled", "each micro-batch's own token mean, never divided by k",
         accumulation(CharLM, "loss_not_scaled"), Expect("loss_accounting", "loss_not_scaled")),
    Case("accumulation", "charlm", "loss_scaled_twice", "normalized by the window's tokens, then by k again",
         accumulation(CharLM, "loss_scaled_twice"), Expect("loss_accounting", "loss_scaled_twice")),
    Case("accumulation", "charlm", "mean_of_means", "per-micro-batch token means averaged (the 2024 trainer bug)",
         accumulation(CharLM, "mean_of_means"), Expect("loss_accounting", "mean_of_means")),
    Case("accumulation", "charlm", "premature_step", "window counter tested before incrementing",
         accumulation(CharLM, "premature_step"), Expect("optimizer_steps", "premature_step")),
    Case("accumulation", "charlm", "extra_step", "micro-step counter never reset, compared with >=",
         accumulation(CharLM, "extra_step"), Expect("optimizer_steps", "extra_step")),
    Case("accumulation", "charlm", "small_batch_guard", "a guard against ragged batches skips every micro-batch",
         accumulation(CharLM, "small_batch_guard"), Expect("optimizer_steps", "missing_step")),
    Case("accumulation", "charlm", "scheduler_per_microbatch", "scheduler.step() on every micro-batch",
         accumulation(CharLM, "scheduler_per_microbatch"),
         Expect("optimizer.param_groups.0.lr", "scheduler_per_microbatch")),
    Case("accumulation", "charlm", "clip_before_unscale", "clip_grad_norm_ without scaler.unscale_",
         accumulation(CharLM, "clip_before_unscale"),
         Expect("gradients.embed.weight", "unscale_before_clip_missing")),
    Case("accumulation", "cnn", "clean", "4 micro-batches, clipping, EMA, ReduceLROnPlateau", accumulation(Shapes)),
    Case("accumulation", "cnn", "grads_not_reset", "no zero_grad() after the optimizer step",
         accumulation(Shapes, "grads_not_reset"), Expect("gradients.model.0.weight", "grads_not_reset")),
    Case("accumulation", "cnn", "clip_per_microbatch", "clip_grad_norm_ on every micro-batch",
         accumulation(Shapes, "clip_per_microbatch"), Expect("gradients.model.0.weight", "clip_per_microbatch")),
    Case("accumulation", "stateful_loader", "clean", "4 micro-batches from a StatefulDataLoader", accumulation(Rows)),
    Case("accumulation", "stateful_loader", "loss_not_scaled", "micro-batch mean loss not divided by k",
         accumulation(Rows, "loss_not_scaled"), Expect("gradients.0.weight", "loss_not_scaled")),
    # -- coverage ----------------------------------------------------------------------------------------
    Case("coverage", "charlm", "clean", "3 epochs: every line once, a new order each epoch", charlm_coverage()),
    Case("coverage", "charlm", "same_order_every_epoch", "shuffle generator seeded without the epoch",
         charlm_coverage("same_order_every_epoch"), Expect("coverage.repeated_epoch_order", None)),
    Case("coverage", "charlm", "sampled_with_replacement", "indices drawn with replacement",
         charlm_coverage("sampled_with_replacement"), Expect("coverage.same_rank_duplicate", None)),
    Case("coverage", "cnn", "clean (2 ranks)", "DistributedSampler, 2 workers per rank, 2 epochs",
         cnn_coverage("2 ranks")),
    Case("coverage", "cnn", "clean (4 ranks)", "50 samples over 4 ranks: 2 padded", cnn_coverage("4 ranks")),
    Case("coverage", "cnn", "clean (stream)", "IterableDataset sharded by rank and worker", cnn_coverage("stream")),
    Case("coverage", "cnn", "rank_from_local_rank", "every rank passes its node-local rank 0",
         cnn_coverage("2 ranks", "rank_from_local_rank"), Expect("coverage.cross_rank_duplicate", None)),
    Case("coverage", "cnn", "drop_last", "drop_last=True loses the tail of the epoch",
         cnn_coverage("4 ranks", "drop_last"), Expect("coverage.missing_id", None)),
    Case("coverage", "cnn", "padded_to_whole_batches", "a sampler pads every rank to whole batches",
         cnn_coverage("4 ranks", "padded_to_whole_batches"), Expect("coverage.padding_count", None)),
    Case("coverage", "cnn", "held_out_ids_leak", "the sampler shards the held-out split too",
         cnn_coverage("2 ranks", "held_out_ids_leak"), Expect("coverage.unexpected_id", None)),
    Case("coverage", "cnn", "set_epoch_forgotten", "sampler.set_epoch() never called",
         cnn_coverage("2 ranks", "set_epoch_forgotten"), Expect("coverage.repeated_epoch_order", None)),
    Case("coverage", "cnn", "stream_not_sharded_by_worker", "every worker iterates the whole rank shard",
         cnn_coverage("stream", "stream_not_sharded_by_worker"),
         Expect("coverage.same_rank_duplicate", None, fields=(("worker", 1),))),
    Case("coverage", "stateful_loader", "clean", "an epoch stopped after 2 batches and resumed, 2 ranks",
         stateful_coverage()),
    Case("coverage", "stateful_loader", "loader_state_not_restored", "the restarted job never loads the loader state",
         stateful_coverage("loader_state_not_restored"), Expect("coverage.same_rank_duplicate", None)),
    # -- parallel: real gloo ranks ----------------------------------------------------------------------
    Case("parallel", "fsdp_gpt", "clean (resume 2 -> 2)", "FSDP2 + DCP, dropout from each rank's RNG",
         ranks(dropout=0.1)),
    Case("parallel", "fsdp_gpt", "clean (resume 2 -> 1)", "DCP resharded on load, the loader skips the trained steps",
         ranks(resume_world_size=1)),
    Case("parallel", "fsdp_gpt", "rng_in_dcp", "each rank's RNG saved under one DCP key: one copy for all ranks",
         ranks("rng_in_dcp", dropout=0.1), restored("rng.torch*")),
    Case("parallel", "fsdp_gpt", "rank0_loader_position", "rank 0's loader position loaded on another world size",
         ranks("rank0_loader_position", resume_world_size=1), Expect("data.sample_ids", "data_replayed")),
    Case("parallel", "fsdp_gpt", "clean (2 ranks vs 1)", "FSDP2 on 2 ranks against one process", sharded()),
    Case("parallel", "fsdp_gpt", "root_not_sharded", "embeddings, final norm and head left outside fully_shard",
         sharded("root_not_sharded"), Expect("gradients.tokens.weight", "grads_not_synchronized")),
    Case("parallel", "tp_mlp", "clean", "column- then row-parallel projections on 2 ranks against one process",
         tensor_parallel()),
    Case("parallel", "tp_mlp", "missing_reduction", "the row-parallel output declared Partial, never all-reduced",
         tensor_parallel("missing_reduction"), Expect("outputs.model.down", "tp_partial_not_reduced")),
    Case("parallel", "tp_mlp", "missing_grad_reduction", "the column-parallel input's gradient not all-reduced",
         tensor_parallel("missing_grad_reduction"), Expect("gradients.embed.weight", "tp_partial_not_reduced")),
    Case("parallel", "tp_mlp", "rank_seeded_shuffle", "each rank shuffles with its own seed: other batches",
         tensor_parallel("rank_seeded_shuffle"), Expect("data.sample_ids", "rank_shard_overlap")),
    Case("parallel", "pipeline_mlp", "clean", "1F1B on 2 stages, 4 micro-batches, a weight tied across stages",
         pipeline("1f1b", microbatches=4, tied=True)),
    Case("parallel", "pipeline_mlp", "clean (dp x pp)", "2 pipelines of 2 ranks (interleaved: 4 stages), FSDP2",
         pipeline("interleaved", microbatches=3, dp=2, replicas="fsdp")),
    Case("parallel", "pipeline_mlp", "not_scaled", "scale_grads=False with a per-micro-batch mean: gradients summed",
         pipeline("interleaved", "not_scaled", microbatches=3), Expect("gradients.embed.weight", "loss_not_scaled")),
    Case("parallel", "pipeline_mlp", "scaled_twice", "the loss divided by n_microbatches, the schedule scaling too",
         pipeline("1f1b", "scaled_twice", microbatches=4), Expect("gradients.embed.weight", "loss_scaled_twice")),
    Case("parallel", "pipeline_mlp", "tied_unsynced", "the tied weight's copies on two stages never all-reduced",
         pipeline("gpipe", "tied_unsynced", microbatches=2, tied=True),
         Expect("gradients.embed.weight", "tied_weights_not_synchronized")),
    Case("parallel", "pipeline_mlp", "detached", "the last stage detaches its input: stage 0 gets no gradient",
         pipeline("gpipe", "detached", microbatches=2), Expect("gradients.embed.weight", "param_without_grad")),
    Case("parallel", "pipeline_mlp", "dp_summed", "4 pipelines' gradients all-reduced with a sum, never divided",
         pipeline("gpipe", "dp_summed", microbatches=2, dp=4), Expect("gradients.embed.weight", "loss_not_averaged")),
    Case("parallel", "pipeline_mlp", "global_rank_sampler", "dp replicas shard by the global rank: stages disagree",
         pipeline("1f1b", "global_rank_sampler", microbatches=3, dp=2),
         Expect("data.sample_ids", "peers_read_different_samples")),
    Case("parallel", "pipeline_mlp", "row_positions", "a feature from each row's position: restarts per micro-batch",
         pipeline("1f1b", "row_positions", microbatches=3), Expect("outputs.model.embed", None, fields=(("rank", 0),))),
    # -- frozen: what fine-tuning freezes stays put ------------------------------------------------------
    Case("frozen", "finetune", "clean", "stem and first stage frozen after a warm-up, their BatchNorms in eval",
         frozen()),
    Case("frozen", "finetune", "clean (declared)", "frozen='backbone.stem.*', 'backbone.stages.0.*'",
         frozen(declared=True)),
    Case("frozen", "finetune", "clean (optimizer coverage)",
         "AdamW holds every parameter (mmcv's builder); the frozen ones never move: a note", optimizer_coverage()),
    Case("frozen", "finetune", "stale_grad", "zero_grad(set_to_none=False): AdamW moves the frozen stages",
         frozen("stale_grad"), Expect("parameters.backbone.stem.0.weight", "frozen_param_changed")),
    Case("frozen", "finetune", "stale_grad (optimizer coverage)", "the same loop, seen by check_optimizer_coverage",
         optimizer_coverage("stale_grad"), Expect("parameters.backbone.stem.0.weight", "frozen_param_changed")),
    Case("frozen", "finetune", "bn_in_train_mode", "frozen with requires_grad_(False) alone: BatchNorm stats update",
         frozen("bn_in_train_mode"), Expect("buffers.backbone.stem.1.running_mean", "frozen_module_in_train_mode")),
    Case("frozen", "finetune", "frozen_stages_never_applied",
         "mmpretrain issue 702: frozen_stages applied only in train(), never called",
         frozen("frozen_stages_never_applied", declared=True),
         Expect("parameters.backbone.stem.0.weight", "frozen_param_trainable")),
    # -- train-mode: train in train mode, evaluate in eval mode -----------------------------------------
    Case("train-mode", "finetune", "clean", "evaluation every 2 steps: eval(), no_grad(), train() after",
         train_mode()),
    Case("train-mode", "finetune", "eval_without_train", "the evaluation never calls model.train() after eval()",
         train_mode("eval_without_train"), Expect("modules.backbone.stages.1.0.1", "module_left_in_eval")),
    Case("train-mode", "finetune", "eval_in_train_mode", "the evaluation runs under no_grad() without model.eval()",
         train_mode("eval_in_train_mode"), Expect("modules.backbone.stages.1.0.1", "eval_in_train_mode")),
    # -- autocast: the mixed-precision check's autocast coverage ---------------------------------------------
    Case("autocast", "autocast_lm", "clean", "bfloat16 autocast on the tensors' device, autocast_dtype declared",
         autocast()),
    Case("autocast", "autocast_lm", "clean (float32 attention allowed)",
         "a deliberate float32 attention, allowed by allow_float32=('attn',)",
         autocast("attention_in_float32", allow_float32=("attn",))),
    Case("autocast", "autocast_lm", "autocast_on_wrong_device", "torch.autocast('cuda') around a CPU model",
         autocast("autocast_on_wrong_device"), Expect("autocast.AutocastLM.step", "autocast_ineffective")),
    Case("autocast", "autocast_lm", "amp_flag_off", "enabled= read from a config flag that is False",
         autocast("amp_flag_off"), Expect("autocast.AutocastLM.step", "autocast_ineffective")),
    Case("autocast", "autocast_lm", "forward_autocast_disabled", "a nested autocast(enabled=False) over the forward",
         autocast("forward_autocast_disabled"), Expect("autocast.AutocastLM.step", "autocast_ineffective")),
    Case("autocast", "autocast_lm", "custom_fwd_float32", "every matmul in custom_fwd(cast_inputs=torch.float32)",
         autocast("custom_fwd_float32"), Expect("autocast.AutocastLM.step", "autocast_ineffective")),
    Case("autocast", "autocast_lm", "attention_in_float32", "attention scores in float32 with autocast off",
         autocast("attention_in_float32"), Expect("modules.attn", "autocast_bypassed")),
    # -- workers: the worker randomness check --------------------------------------------------------------
    Case("workers", "augment", "clean", "each worker's generators seeded from torch.initial_seed()", workers()),
    Case("workers", "augment", "clean (stream)", "a generator derived from the worker id and the epoch",
         workers(stream=True)),
    Case("workers", "augment", "generator_built_in_init", "np.random.default_rng(0) in __init__, copied to workers",
         workers(fault="generator_built_in_init"),
         Expect("dataset.augment.shift.rng", "worker_rng_shared", fields=(("worker", 1),))),
    Case("workers", "augment", "torch_generator_not_reseeded", "a torch.Generator the worker_init_fn forgets",
         workers(fault="torch_generator_not_reseeded"), Expect("dataset.augment.noise.generator", "worker_rng_shared")),
    Case("workers", "augment", "numpy_seeded_in_worker_init", "np.random.seed(0) in worker_init_fn",
         workers(fault="numpy_seeded_in_worker_init"), Expect("rng.numpy", "worker_rng_shared")),
    Case("workers", "augment", "python_seeded_in_worker_init", "random.seed(0) in worker_init_fn",
         workers(fault="python_seeded_in_worker_init"), Expect("rng.python", "worker_rng_shared")),
    Case("workers", "augment", "persistent_epoch_seed", "persistent workers never see set_epoch: epochs repeat",
         workers(stream=True, fault="persistent_epoch_seed"),
         Expect("dataset.rng", "epoch_rng_repeated", fields=(("epoch", 1),))),
    # -- equivalent configurations: a switch that must change nothing -------------------------------------------
    Case("equivalent", "transformations", "clean", "activation checkpointing on (non-reentrant) vs off",
         equivalent({}, {"checkpointing": True})),
    Case("equivalent", "transformations", "reentrant_frozen_inputs", transformations.FAULTS["reentrant_frozen_inputs"],
         equivalent({}, {"checkpointing": True, "fault": "reentrant_frozen_inputs"}),
         Expect("gradients.blocks.0.*", "checkpoint_without_grad")),
    Case("equivalent", "transformations", "clean", "torch.compile (aot_eager) vs eager, a hook added in setup()",
         equivalent({"probe": True}, {"probe": True, "compile_backend": "aot_eager"})),
    Case("equivalent", "transformations", "clean", "torch.compile (inductor, C++ kernels) vs eager, dropout off",
         equivalent({"dropout": 0.0}, {"dropout": 0.0, "compile_backend": "inductor"})),
    Case("equivalent", "transformations", "hook_after_compile", transformations.FAULTS["hook_after_compile"],
         equivalent({"probe": True, "fault": "hook_after_compile"},
                    {"probe": True, "fault": "hook_after_compile", "compile_backend": "aot_eager"}),
         Expect("loss", "compile_stale", fields=(("step", 2),))),
    Case("equivalent", "transformations", "clean", "an EMA evaluation every 2 steps vs none",
         equivalent({}, {"evaluate_every": 2})),
    Case("equivalent", "transformations", "ema_not_restored", transformations.FAULTS["ema_not_restored"],
         equivalent({}, {"evaluate_every": 2, "fault": "ema_not_restored"}),
         Expect("model.*", "evaluation_changed_training", fields=(("step", 2),))),
    Case("equivalent", "packing", "clean", "documents packed into one row (position_ids restarting) vs padded",
         lambda: tp.check_equivalent(packing.Packing(), packing.Packing(packed=True))),
    Case("equivalent", "packing", "causal_mask_only", packing.FAULTS["causal_mask_only"],
         lambda: tp.check_equivalent(packing.Packing(), packing.Packing(packed=True, fault="causal_mask_only")),
         Expect("loss", "cross_document_attention", fields=(("step", 1),))),
    # -- training: the loss goes down, one batch is overfit, the updates are healthy ----------------------------
    *(training_case(verdicts, None, "MLP, learned temperature, AdamW, warmup-cosine, float16 GradScaler, clipping")
      for verdicts in TRAINING),
    training_case("loss decreases", "lr_zero", "the linear scaling rule with integer division: lr 0",
                  Expect("loss", "loss_not_decreasing", fields=(("step", 20),))),
    training_case("overfits one batch", "lr_zero", "the same",
                  Expect("loss", "not_overfitting", fields=(("step", 100),))),
    training_case("healthy", "lr_zero", "the same", Expect("optimizer.param_groups.0.update_ratio", "update_too_small",
                                                          fields=(("step", 1),))),
    training_case("overfits one batch", "detached_loss", "the logits detached for the metric, then used for the loss",
                  Expect("loss", "not_overfitting", fields=(("step", 100),))),
    training_case("healthy", "detached_loss", "the same", Expect("optimizer.param_groups.0.update_ratio",
                                                                "update_too_small", fields=(("step", 1),))),
    training_case("overfits one batch", "frozen_model", "model.requires_grad_(False) left by an embedding extraction",
                  Expect("loss", "not_overfitting", fields=(("step", 100),))),
    training_case("healthy", "frozen_model", "the same", Expect("optimizer.param_groups.0.update_ratio",
                                                               "update_too_small", fields=(("step", 1),))),
    # the step at which float16 overflows into a NaN loss is the kernels' to decide
    training_case("overfits one batch", "lr_too_high", "5 where 5e-3 was meant: the loss diverges to NaN",
                  Expect("loss", "nonfinite")),
    training_case("healthy", "lr_too_high", "the same", Expect("optimizer.param_groups.0.update_ratio",
                                                              "update_too_large", fields=(("step", 1),))),
    training_case("overfits one batch", "static_loss_scale", "scaler.update(2.0**24): every float16 step overflows",
                  Expect("loss", "not_overfitting", fields=(("step", 100),))),
    training_case("healthy", "static_loss_scale", "the same", Expect("scaler.scale", "skipped_updates",
                                                                    fields=(("step", 1),))),
    training_case("schedule", "scheduler_before_optimizer", "scheduler.step() before scaler.step(optimizer)",
                  Expect("optimizer.param_groups.0.lr", "lr_mismatch", fields=(("step", 1),))),
    training_case("overfits one batch, schedule", "scheduler_before_optimizer", "the same, on one batch",
                  Expect("optimizer.param_groups.0.lr", "lr_mismatch", fields=(("step", 1),))),
]


def observe(result: tp.Result, fields: tuple[str, ...] = ()) -> str:
    """The outcome and first violation, in the form `Expect.describe` uses (with the fields it names)."""
    first = result.first_violation
    if first is None:
        return f"{result.outcome}" + (f": {result.reason}" if result.reason else "")
    extra = "".join(f", {name}={getattr(first, name)}" for name in fields)
    return f"{result.outcome} {first.path} ({first.cause or '-'}{extra})"


def judge(case: Case, result: tp.Result) -> tuple[bool, str]:
    """Whether the case behaved as declared, and if not, why."""
    if case.expect is None:
        return (True, "") if result.passed else (False, f"clean control {observe(result)}")
    expect, first = case.expect, result.first_violation
    if result.outcome is not expect.outcome:
        return False, f"outcome {result.outcome}, expected {expect.outcome}" + (
            f": {result.reason}" if result.reason else "")
    if first is None:
        return False, "no violation recorded"
    if not fnmatch.fnmatchcase(first.path, expect.path):
        return False, f"first violation at {first.path}, expected {expect.path}"
    if first.cause != expect.cause:
        return False, f"cause {first.cause or 'none'}, expected {expect.cause or 'none'}"
    for name, value in expect.fields:
        if getattr(first, name) != value:
            return False, f"{name}={getattr(first, name)}, expected {value}"
    return True, ""


def run_case(case: Case) -> Row:
    missing = {"stateful_loader": stateful_loader.TORCHDATA_MISSING, "fsdp_gpt": fsdp_gpt.TORCHDATA_MISSING}
    if missing.get(case.example):
        return Row(case, "not run", True, f"skipped: {missing[case.example]}", 0.0, skipped=True)
    start = time.perf_counter()
    try:
        result = case.run()
    except Exception as error:  # a misuse error is a failure of this case, reported in the table
        return Row(case, f"raised {type(error).__name__}", False, str(error).splitlines()[0],
                   time.perf_counter() - start)
    seconds = time.perf_counter() - start
    ok, reason = judge(case, result)
    fields = tuple(name for name, _ in case.expect.fields) if case.expect else ()
    return Row(case, observe(result, fields), ok, reason, seconds)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def count(rows: list[Row]) -> str:
    """`passed/total`, and how many were skipped."""
    skipped = sum(r.skipped for r in rows)
    return f"{sum(r.ok and not r.skipped for r in rows)}/{len(rows)}" + (f" ({skipped} skipped)" if skipped else "")


def table(surface: str, rows: list[Row]) -> list[str]:
    clean = [r for r in rows if r.case.expect is None]
    faults = [r for r in rows if r.case.expect is not None]
    lines = [
        f"### {surface}",
        "",
        f"- clean controls passing: {count(clean)}",
        f"- faults caught with the expected component and cause: {count(faults)}",
        f"- wall time: {sum(r.seconds for r in rows):.1f} s",
        "",
        "| example | case | models | expected | observed | verdict | s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        expected = "PASS" if row.case.expect is None else row.case.expect.describe()
        if row.ok:
            verdict = row.reason if row.skipped else "passed" if row.case.expect is None else "caught"
        else:
            verdict = ("FAILED: " if row.case.expect is None else "MISSED: ") + row.reason
        lines.append("| " + " | ".join(cell(c) for c in (
            row.case.example, f"`{row.case.name}`", row.case.models, expected, row.observed, verdict,
            f"{row.seconds:.1f}")) + " |")
    return lines + [""]


def environment() -> list[str]:
    try:
        from importlib.metadata import version

        torchdata = version("torchdata")
    except Exception:
        torchdata = "not installed"
    return [
        f"- Python {platform.python_version()}, torch {torch.__version__}, torchdata {torchdata}, "
        f"trainparity {tp.__version__}",
        f"- {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}",
    ]


def command() -> str:
    script = pathlib.Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(pathlib.Path.cwd().resolve()))
    except ValueError:
        shown = str(script)
    return shlex.join(["python", shown, *sys.argv[1:]])


def document(rows: list[Row], total: float) -> str:
    lines = [
        "# Validation matrix",
        "",
        "Generated by `tools/validate.py`; do not edit by hand, re-run it. Each clean control must PASS;",
        "each deliberate fault (a constructor argument of an example in `examples/`, modelled on a bug",
        "real training code has had) must FAIL with the declared first-violation path (a glob) and cause.",
        "A fault that is not caught stays in the table as MISSED, with the reason.",
        "",
        f"Command: `{command()}` (wall time {total:.1f} s)",
        "",
        *environment(),
        "",
        "Resume checks: `steps=8, resume_at=3`; accumulation checks: `microbatches=4, cycles=2`, judged in "
        "float64 (the default `precision`) with its fixed tolerance. Parallel checks on gloo ranks: resume "
        "`steps=6, resume_at=3, world_size=2` (exact on the same world size, float64 with its tolerance across "
        "a change), `check_parallel` `world_size=2` in float64. Frozen checks: `steps=2` (optimizer coverage: "
        "`steps=2`); train-mode checks: `steps=3`, `eval_modules` the frozen stages. Autocast: "
        "`check_mixed_precision(steps=2)`; workers: `check_worker_randomness(epochs=2)`. Training checks: "
        "`check_training` with the arguments each case names (`TRAINING` in tools/validate.py). Equivalent "
        "configurations: `check_equivalent(reference, candidate)`, 4 steps in float64.",
        "",
    ]
    for surface in SURFACES:
        selected = [r for r in rows if r.case.surface == surface]
        if selected:
            lines += table(surface, selected)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="FILE", help="also write the tables as Markdown (docs/validation.md)")
    parser.add_argument("--only", metavar="TEXT",
                        help="run only the cases whose 'surface/example/case' contains TEXT (not with --write)")
    args = parser.parse_args()
    if args.only and args.write:
        parser.error("--write records the whole matrix: drop --only")
    cases = [c for c in CASES if not args.only or args.only in f"{c.surface}/{c.example}/{c.name}"]
    if not cases:
        parser.error(f"no case matches --only {args.only!r}")
    start = time.perf_counter()
    rows = []
    for case in cases:
        row = run_case(case)
        mark = "BAD" if not row.ok else "skip" if row.skipped else "ok"
        print(f"{mark:<5}{case.surface}/{case.example}/{case.name}: {row.observed} ({row.seconds:.1f} s)"
              + (f" -- {row.reason}" if row.reason else ""), flush=True)
        rows.append(row)
    total = time.perf_counter() - start
    text = document(rows, total)
    print("\n" + text)
    if args.write:
        pathlib.Path(args.write).write_text(text)
        print(f"wrote {args.write}")
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"{len(bad)} case(s) did not behave as declared: "
              + ", ".join(f"{r.case.surface}/{r.case.example}/{r.case.name}" for r in bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
