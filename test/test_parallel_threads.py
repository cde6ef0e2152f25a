# ruff: noqa: E501 - the report snapshots hold report lines verbatim
"""`backend="threads"`: worlds of ranks as threads of one process, judged as gloo processes are.

Each rank of a threaded world has its own random streams, environment (RANK, LOCAL_RANK) and observer patches, as a
process would; the same recipe gets the same report on threads as on gloo processes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from data_parallel_recipes import DDPRecipe
from parallel_recipes import MegatronRecipe, TensorParallelMLP, ThreeDimRecipe, TwoDimRecipe, WideDDPRecipe
from torch import nn

import trainparity as tp
from trainparity._observe._hooks import patch_functions
from trainparity._process import _threads

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


def _without_backend(report: str) -> str:
    return report.replace("backend='threads'", "backend=?").replace("backend='gloo'", "backend=?")


@pytest.mark.parametrize("recipe", [
    pytest.param(TwoDimRecipe(), id="clean"),
    # each rank draws its own dropout mask: with the process's one generator shared, rank 1 would draw after rank 0
    pytest.param(TwoDimRecipe(dropout=0.5), id="dropout"),
    pytest.param(TwoDimRecipe("tp_rank_in_sampler"), id="tp_peers_read_other_samples"),
    # the causes of composed parallelism (each snapshot on threads in CausesOnAMesh)
    pytest.param(TwoDimRecipe("loss_divided_by_tp"), id="loss_not_averaged"),
    pytest.param(TwoDimRecipe(clip="local"), id="clip_norm_local"),
    pytest.param(TwoDimRecipe("reduced_over_tp", data_parallel="manual"), id="reduced_over_wrong_dim"),
])
def test_threads_and_gloo_processes_give_the_same_report(recipe: TwoDimRecipe) -> None:
    threads = tp.check_parallel(recipe, world_size=4, backend="threads", steps=2, timeout=120)
    gloo = tp.check_parallel(recipe, world_size=4, backend="gloo", steps=2, timeout=120)
    assert threads.outcome is gloo.outcome, (threads.report(), gloo.report())
    faulty = recipe.fault is not None or recipe.dropout or recipe.clip == "local"
    assert threads.outcome is (tp.Outcome.FAIL if faulty else tp.Outcome.PASS), threads.report()
    assert _without_backend(threads.report()) == _without_backend(gloo.report())
    if recipe.fault == "tp_rank_in_sampler":  # the peers of a replica on the mesh read other samples: named at once
        first = threads.first_violation
        assert first is not None
        assert (first.path, first.cause, first.step, first.rank) == (
            "data.sample_ids", "peers_read_different_samples", 1, 1), threads.report()
        assert "Rank 1 (dp=0, tp=1) read other samples than rank 0 (dp=0, tp=0), its peer along tp" in first.message


#: torch 2.7's FSDP2 x TP refuses uneven shards ("FSDP+TP sharding does not support uneven sharding"), and a 16 x 4
#: mesh shards this MLP's 16 rows unevenly
UNEVEN_FSDP_TP = pytest.mark.skipif(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 8),
                                    reason="torch 2.7's FSDP2 x tensor parallel cannot shard unevenly")


@UNEVEN_FSDP_TP
def test_a_64_rank_mesh_of_fsdp2_and_tensor_parallel_trains_like_one_process() -> None:
    result = tp.check_parallel(TwoDimRecipe(tp=4, global_batch=16), world_size=64, backend="threads", steps=1,
                               timeout=300)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.config["world_size"] == 64


def test_tensor_parallel_peers_reading_other_samples_are_named_at_16_ranks() -> None:
    result = tp.check_parallel(TwoDimRecipe("tp_rank_in_sampler", tp=4, global_batch=16), world_size=16,
                               backend="threads", steps=1, timeout=120)
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.cause, first.step, first.rank) == ("peers_read_different_samples", 1, 1), result.report()
    assert first.message.startswith("Rank 1 (dp=0, tp=1) read other samples than rank 0 (dp=0, tp=0)")


def first_lines(result: tp.Result) -> str:
    """The report's headline and first violation's message, as the snapshots keep them."""
    report = result.report()
    first = report.split("First violation: ", 1)[1].split("\n  Tensor-likes", 1)[0]
    return f"{report.splitlines()[0]}\nFirst violation: {first}"


class CausesOnAMesh(tp.TestCase):
    """The causes of composed parallelism, each on a (dp, tp) mesh of eight threads, with its clean twin where it has
    one (threads and gloo agree on each at four ranks: test_threads_and_gloo_processes_give_the_same_report)."""

    def test_a_loss_averaged_over_the_tensor_parallel_peers_too_names_the_factor_and_the_dimension(self) -> None:
        result = tp.check_parallel(TwoDimRecipe("loss_divided_by_tp", tp=4), world_size=8, backend="threads",
                                   steps=1, timeout=120)
        self.assertExpectedInline(first_lines(result), """\
trainparity parallel check: FAIL at gradients.embed.weight (loss_not_averaged, step 1, rank 0)
First violation: gradients.embed.weight (step 1, rank 0, kind: gradient_mismatch, cause: loss_not_averaged)
  Rank 0's gradients are 1/4 of the reference's, one over the size of the mesh dimension tp (4): the loss was averaged over the ranks of tp once too often (divided by their number while the gradient reduction averages over them too, or averaged over ranks that read the same samples).""")

    def test_clipping_by_the_norm_of_each_rank_s_shards_is_named_and_by_the_whole_norm_passes(self) -> None:
        local = tp.check_parallel(TwoDimRecipe(clip="local", tp=4), world_size=8, backend="threads", steps=1,
                                  timeout=120)
        self.assertExpectedInline(first_lines(local).split(" by a norm of ")[0], """\
trainparity parallel check: FAIL at gradients.embed.weight (clip_norm_local, step 1, rank 1)
First violation: gradients.embed.weight (step 1, rank 1, kind: gradient_mismatch, cause: clip_norm_local)
  Rank 1 (dp=0, tp=1) clipped its gradients (clip_grads_with_norm_)""")
        first = local.first_violation
        assert first is not None and "computed over this rank's local shards" in first.message, local.report()
        whole = tp.check_parallel(TwoDimRecipe(clip="global", tp=4), world_size=8, backend="threads", steps=1,
                                  timeout=120)
        self.assertEqual(whole.outcome, tp.Outcome.PASS, whole.report())

    def test_gradients_averaged_by_hand_over_the_tensor_parallel_dimension_are_named(self) -> None:
        manual = tp.check_parallel(TwoDimRecipe(data_parallel="manual"), world_size=8, backend="threads", steps=1,
                                   timeout=120)
        self.assertEqual(manual.outcome, tp.Outcome.PASS, manual.report())
        wrong = tp.check_parallel(TwoDimRecipe("reduced_over_tp", data_parallel="manual"), world_size=8,
                                  backend="threads", steps=1, timeout=120)
        self.assertExpectedInline(first_lines(wrong), """\
trainparity parallel check: FAIL at gradients.embed.weight (reduced_over_wrong_dim, step 1, rank 2)
First violation: gradients.embed.weight (step 1, rank 2, kind: gradient_mismatch, cause: reduced_over_wrong_dim)
  Rank 2 (dp=1, tp=0) holds other gradients than rank 0 (dp=0, tp=0) at its optimizer step: the recipe all-reduced the gradient of embed.weight over tp (ranks 0, 1), a dimension that splits the model and whose ranks read the same samples, and never over dp, the dimension that splits the data (dist.all_reduce(grad, group=mesh['dp'].get_group())?).""")


def test_resume_on_worlds_of_threads_across_a_world_size_change_and_a_fault_as_on_gloo() -> None:
    # tensor parallel + torch.distributed.checkpoint saved by 2 threads, the process exits, loaded by 1 in another
    changed = tp.check_resume(TensorParallelMLP(), steps=6, resume_at=3, world_size=2, resume_world_size=1,
                              backend="threads", timeout=120)
    assert changed.outcome is tp.Outcome.PASS, changed.report()
    threads, gloo = (tp.check_resume(WideDDPRecipe("optimizer_not_loaded"), steps=6, resume_at=3, world_size=2,
                                     backend=backend, timeout=120) for backend in ("threads", "gloo"))
    first = threads.first_violation
    assert first is not None and (first.path, first.cause) == ("optimizer.state.weight.step", "not_restored")
    assert _without_backend(threads.report()) == _without_backend(gloo.report())
    raised = tp.check_resume(DDPRecipe("raises"), steps=4, resume_at=2, world_size=2, backend="threads", timeout=60)
    assert raised.error is not None and (raised.error.rank, raised.error.exc_type) == (1, "ValueError")
    assert raised.error.phase in ("interrupted", "baseline", "baseline (repeat)"), raised.report()


@pytest.mark.skipif(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 8),
                    reason="torch 2.7's HSDP fails its own assertion on CPU (post_backward: all_reduce_event is None)")
def test_a_3d_mesh_of_hsdp_and_tensor_parallel_trains_like_one_process_and_names_peers_by_coordinate() -> None:
    clean = tp.check_parallel(ThreeDimRecipe(), world_size=8, backend="threads", steps=2, timeout=120)
    assert clean.outcome is tp.Outcome.PASS, clean.report()
    wrong = tp.check_parallel(ThreeDimRecipe("tp_rank_in_sampler"), world_size=8, backend="threads", steps=1,
                              timeout=120)
    first = wrong.first_violation
    assert first is not None and first.cause == "peers_read_different_samples", wrong.report()
    assert first.message.startswith("Rank 1 (dp_replicate=0, dp_shard=0, tp=1) read other samples than rank 0 "
                                    "(dp_replicate=0, dp_shard=0, tp=0), its peer along tp"), wrong.report()


def test_megatron_style_slices_in_plain_tensors_are_assembled_and_unmarked_ones_say_how_to_mark_them() -> None:
    clean = tp.check_parallel(MegatronRecipe(), world_size=4, backend="threads", steps=2, timeout=120)
    assert clean.outcome is tp.Outcome.PASS, clean.report()
    fault = tp.check_parallel(MegatronRecipe("input_grad_not_reduced"), world_size=4, backend="threads", steps=1,
                              timeout=120)
    first = fault.first_violation
    assert first is not None and (first.path, first.cause, first.rank) == (
        "gradients.embed.weight", "tp_partial_not_reduced", 1), fault.report()
    assert "model.up (Linear), the first sharded layer after it" in first.message, fault.report()
    # Megatron's sequence parallelism: each rank's rows outside the tensor-parallel layers
    sequence = tp.check_parallel(MegatronRecipe(sequence_parallel=True), world_size=4, backend="threads", steps=2,
                                 timeout=120)
    assert sequence.outcome is tp.Outcome.PASS, sequence.report()
    partial = tp.check_parallel(MegatronRecipe("sp_grads_not_reduced", sequence_parallel=True), world_size=4,
                                backend="threads", steps=1, timeout=120)
    first = partial.first_violation
    assert first is not None and (first.path, first.cause) == ("gradients.embed.weight", "tp_partial_not_reduced")
    unmarked = tp.check_parallel(MegatronRecipe("unmarked"), world_size=4, backend="threads", steps=1, timeout=120)
    assert unmarked.outcome is tp.Outcome.ABSTAIN, unmarked.report()
    assert "down.weight is [8, 4] there and [8, 16] in the reference (a slice of a plain tensor? mark each slice as " \
        "Megatron-LM does (parameter.tensor_model_parallel = True" in (unmarked.reason or ""), unmarked.report()


def test_code_written_for_torchrun_reads_its_rank_from_the_environment() -> None:
    # DDPRecipe asserts LOCAL_RANK and WORLD_SIZE against dist.get_rank() and dist.get_world_size() on each rank
    result = tp.check_parallel(DDPRecipe(), world_size=4, backend="threads", steps=2, timeout=60)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert tp.check_parallel(DDPRecipe("grads_summed"), world_size=4, backend="threads", steps=1,
                             timeout=60).first_violation.cause == "loss_not_averaged"  # type: ignore[union-attr]


def test_a_rank_that_raises_is_an_error_naming_it_and_its_traceback() -> None:
    result = tp.check_parallel(DDPRecipe("raises"), world_size=4, backend="threads", steps=3, timeout=60)
    assert result.outcome is tp.Outcome.ERROR and result.error is not None, result.report()
    assert (result.error.phase, result.error.rank, result.error.exc_type) == ("rank 1", 1, "ValueError")
    assert "rank 1 cannot go on" in result.error.message
    assert "data_parallel_recipes.py" in (result.error.traceback or "")


def test_a_rank_that_hangs_is_a_timeout_with_every_rank_s_stack() -> None:
    result = tp.check_parallel(DDPRecipe("hangs"), world_size=2, backend="threads", steps=3, timeout=6)
    assert result.outcome is tp.Outcome.ERROR and result.error is not None, result.report()
    assert (result.error.kind, result.error.phase) == ("timeout", "ranks")
    # the process of the ranks: rank 1 in the recipe's sleep, rank 0 waiting for it in DDP's all-reduce
    ranks = result.report().split("Stacks of every process", 1)[1].split("  ranks:\n", 1)[1]
    assert 'data_parallel_recipes.py", line' in ranks and "multi_threaded_pg.py" in ranks, result.report()


class Upcast(nn.Module):
    """A rotary embedding's habit: compute in float32 whatever the model's dtype, then cast back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() * 2).type_as(x)


class Float32Inside(DDPRecipe):
    def setup(self) -> tp.State:
        state = super().setup()
        state.model = nn.Sequential(Upcast(), state.model)
        return state


@pytest.mark.parametrize("backend", ["threads", "gloo"])
def test_a_recipe_that_computes_in_float32_inside_a_float64_check_is_an_error_naming_the_op(backend: str) -> None:
    result = tp.check_parallel(Float32Inside(), world_size=2, backend=backend, steps=1, timeout=60)
    assert result.outcome is tp.Outcome.ERROR and result.error is not None, result.report()
    assert result.error.exc_type == "PrecisionError", result.report()
    assert result.error.message.startswith("Tensor.float in model.0 computed in float32: precision='float64' runs "
                                           "the recipe in float64"), result.report()
    assert "Pass precision='native'" in result.error.message
    assert 'test_parallel_threads.py", line' in (result.error.traceback or ""), result.report()  # the user's line
    if backend == "threads":
        native = tp.check_parallel(Float32Inside(), world_size=2, backend=backend, steps=1, timeout=60,
                                   precision="native", comparison=tp.ToleranceComparison(rtol=1e-4, atol=1e-6))
        assert native.outcome is tp.Outcome.PASS, native.report()


def test_a_torch_without_the_threaded_group_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_threads, "threads_unavailable", lambda: "torch 9.9 has no threaded process group")
    from trainparity._process import _world

    monkeypatch.setattr(_world, "threads_unavailable", _threads.threads_unavailable)
    with pytest.raises(tp.InvalidArgument, match="backend='threads' cannot run here: torch 9.9 has no threaded "
                                                 "process group; use backend='gloo'"):
        tp.check_parallel(DDPRecipe(), world_size=2, backend="threads")


def test_patched_functions_call_the_wrapper_of_the_thread_that_calls_them() -> None:
    """Ranks as threads each observe their own calls of a function patched process-wide; the function is itself
    again once every patch is undone."""
    import contextlib

    calls: dict[str, list[str]] = {"a": [], "b": []}

    def wrapper_for(thread: str) -> Callable[[Callable[..., Any], str], Callable[..., Any]]:
        def make(original: Callable[..., Any], name: str) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                calls[thread].append(name)
                return original(*args, **kwargs)
            return wrapper
        return make

    original = F.dropout
    both_patched, a_done = threading.Barrier(2), threading.Event()

    def thread(name: str, calls_made: int) -> None:
        with contextlib.ExitStack() as stack:
            patch_functions(stack, DDPRecipe, {F.dropout: "F.dropout"}, wrapper_for(name))
            both_patched.wait()
            import torch

            for _ in range(calls_made):
                F.dropout(torch.ones(2), 0.0)
            if name == "b":
                a_done.wait()  # a has undone its patch: b's still holds
                F.dropout(torch.ones(2), 0.0)
        if name == "a":
            a_done.set()

    threads = [threading.Thread(target=thread, args=(name, count)) for name, count in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert calls == {"a": ["F.dropout"], "b": ["F.dropout"] * 3}
    assert F.dropout is original
