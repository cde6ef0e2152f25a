"""The parallel check on data-parallel (DDP) gloo ranks: a clean DDP recipe, each diagnosis, errors, cleanup, the
mixin, and the torchrun coverage example through the harness's own launcher."""

from __future__ import annotations

import contextlib
import os
import pathlib
import runpy
import signal
import subprocess
import sys
import tempfile
import unittest
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from data_parallel_recipes import DDPRecipe, NestedRecipe, UnobservedRecipe
from process_helpers import still_running

import trainparity as tp
from trainparity._parallel._judge import NOT_REPLICAS, layout_difference
from trainparity._parallel._megatron import HOW_TO_MARK
from trainparity._parallel._trace import RankStep, RankTrace
from trainparity._process._engine import Job, run_jobs
from trainparity._process._options import Deadline

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

#: DDP reduces the batch in another order than one process: rounding-level differences are declared acceptable
TOLERANCE = tp.ToleranceComparison(rtol=1e-4, atol=1e-6)
EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "torchrun_coverage.py"

#: fault -> (first violation path, rank, cause)
FAULTS: dict[str, tuple[str, int | None, str]] = {
    "no_ddp": ("gradients.fc1.weight", 1, "grads_not_synchronized"),
    "grads_summed": ("gradients.fc1.weight", 0, "loss_not_averaged"),
    "same_shard": ("data.sample_ids", 1, "rank_shard_overlap"),
    "rank_drops_samples": ("data.sample_ids", None, "rank_shard_missing"),
    "batchnorm": ("gradients.fc1.weight", 0, "batch_dependent_layer"),
}


def check(fault: str | None = None, **kwargs: Any) -> tp.ParallelResult:
    options: dict[str, Any] = {"comparison": TOLERANCE, "timeout": 60, **kwargs}
    pid_dir = options.pop("pid_dir", None)
    recipe = DDPRecipe(fault=fault) if pid_dir is None else DDPRecipe(fault=fault, pid_dir=pid_dir)
    return tp.check_parallel(recipe, **options)


def test_clean_ddp_recipe_passes() -> None:
    result = check()
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.violations == [] and result.notes == []
    assert result.config == {
        "recipe": "data_parallel_recipes:DDPRecipe(fault=None)",
        "world_size": 2,
        "backend": "gloo",
        "steps": 3,
        "seed": 0,
        "precision": "float64",
        "comparison": "tolerance(rtol=0.0001, atol=1e-06)",
        "isolation": "process",
    }


def test_float64_judging_needs_no_declared_comparison() -> None:
    result = check(comparison=None)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.config["comparison"] == "tolerance(rtol=1e-07, atol=1e-09), the float64 default"


def test_batch_dependent_layer_suggests_sync_batchnorm() -> None:
    first = check("batchnorm", comparison=None).first_violation
    assert first is not None and first.cause == "batch_dependent_layer"
    assert "model.norm (BatchNorm1d)" in first.message and "SyncBatchNorm" in first.message


def test_what_cannot_be_observed_is_noted() -> None:
    result = tp.check_parallel(UnobservedRecipe, comparison=TOLERANCE, timeout=60)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert result.notes == [
        "data stream not checked: the recipe's sample_ids() returns None.",
        "gradients not compared: the State holds no torch.optim.Optimizer whose step could be observed.",
    ]


def test_model_and_optimizer_inside_list_and_dict_entries_are_observed() -> None:
    result = tp.check_parallel(NestedRecipe(fault="grads_summed"), steps=1, timeout=60)
    assert result.outcome is tp.Outcome.FAIL, result.report()
    first = result.first_violation
    assert first is not None and (first.path, first.cause) == ("gradients.fc1.weight", "loss_not_averaged")


def test_spawned_interpreters_agree() -> None:
    result = check(isolation="spawn", steps=2)
    assert result.outcome is tp.Outcome.PASS, result.report()


def test_native_exact_comparison_fails_at_rounding_level_and_says_so() -> None:
    result = check(comparison=None, precision="native")
    assert result.outcome is tp.Outcome.FAIL
    assert {v.kind for v in result.violations} <= {"gradient_mismatch", "parameter_mismatch"}
    assert all(v.cause is None and v.rank == 0 for v in result.violations), result.report()
    assert any("within torch.testing's default tolerance" in note for note in result.notes)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_is_diagnosed(fault: str) -> None:
    path, rank, cause = FAULTS[fault]
    result = check(fault)
    assert result.outcome is tp.Outcome.FAIL, result.report()
    first = result.first_violation
    assert first is not None
    assert (first.path, first.step, first.rank, first.cause) == (path, 1, rank, cause), result.report()
    assert not any(".module." in v.path for v in result.violations)
    assert not any("within torch.testing's default tolerance" in note for note in result.notes)


def test_unsynchronized_gradients_make_the_replicas_drift() -> None:
    result = check("no_ddp", steps=2)
    at_step_1 = [(v.path, v.rank, v.cause) for v in result.violations if v.step == 1]
    assert at_step_1[:4] == [(f"gradients.{p}", 1, "grads_not_synchronized")
                             for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")]
    assert ("replicas.fc2.bias", 1, "grads_not_synchronized") in at_step_1
    assert ("parameters.fc2.bias", 0, "grads_not_synchronized") in at_step_1


def test_a_rank_whose_parameters_have_another_shape_than_the_reference_s_is_named() -> None:
    """Parameters sharded by hand (plain tensors, not DTensors) keep the reference's names with other shapes."""
    weight, shard = torch.zeros(4, 8), torch.zeros(2, 8)

    def trace(parameters: dict[str, Any]) -> RankTrace:
        return RankTrace([RankStep(1, None, {}, parameters, [])], 1, [], {})

    reference = trace({"fc.weight": weight, "fc.bias": torch.zeros(4)})
    ranks = [reference, trace({"fc.weight": shard, "fc.bias": torch.zeros(4)})]
    assert layout_difference(reference, ranks) == (
        "rank 1 does not hold the model the reference trains: fc.weight is [2, 8] there and [4, 8] in the reference "
        f"(a slice of a plain tensor? {HOW_TO_MARK}). " + NOT_REPLICAS)
    assert layout_difference(reference, [reference, reference]) is None


def test_shard_violations_name_samples_and_ranks() -> None:
    result = check("same_shard", steps=1)
    data = [v for v in result.violations if v.path == "data.sample_ids"]
    assert [v.kind for v in data] == ["cross_rank_duplicate"] * 2 + ["missing_id"] * 2
    reference, ranks = data[0].expected, data[0].actual
    assert isinstance(reference, list) and isinstance(ranks, list) and len(ranks) == 2
    rank0, rank1 = ranks
    assert isinstance(rank1, list) and rank0 == rank1 and len(reference) == 4
    assert [v.sample_id for v in data] == [*rank1, *(s for s in reference if s not in rank1)]
    assert [(v.rank, v.position) for v in data] == [(1, 0), (1, 1), (None, None), (None, None)]


class ReportSnapshot(tp.TestCase):
    def test_first_violation_report(self) -> None:
        result = check("rank_drops_samples", steps=1)
        self.assertExpectedInline(result.report(), """\
trainparity parallel check: FAIL at data.sample_ids (rank_shard_missing, step 1, sample 6)
config: backend='gloo', comparison='tolerance(rtol=0.0001, atol=1e-06)', isolation='process', precision='float64', recipe="data_parallel_recipes:DDPRecipe(fault='rank_drops_samples')", seed=0, steps=1, world_size=2

First violation: data.sample_ids (step 1, sample 6, kind: missing_id, cause: rank_shard_missing)
  The ranks' samples together are not the reference's batch (each of its samples read once by one rank).
  Sample 6 of the reference's batch was read by no rank: a shard is missing.
  expected: [15, 11, 3, 6]
  actual:   [[15, 3], [11]]

All violations (9):
  1. data.sample_ids (step 1, sample 6, kind: missing_id, cause: rank_shard_missing)
  2. gradients.fc1.weight (step 1, rank 0, kind: gradient_mismatch)
  3. gradients.fc1.bias (step 1, rank 0, kind: gradient_mismatch)
  4. gradients.fc2.weight (step 1, rank 0, kind: gradient_mismatch)
  5. gradients.fc2.bias (step 1, rank 0, kind: gradient_mismatch)
  6. parameters.fc1.weight (step 1, rank 0, kind: parameter_mismatch)
  7. parameters.fc1.bias (step 1, rank 0, kind: parameter_mismatch)
  8. parameters.fc2.weight (step 1, rank 0, kind: parameter_mismatch)
  9. parameters.fc2.bias (step 1, rank 0, kind: parameter_mismatch)""")  # noqa: E501


def _run_recording(monkeypatch: pytest.MonkeyPatch, fault: str, timeout: float) -> tuple[tp.ParallelResult,
                                                                                     dict[int, int], list[str]]:
    """Run a faulty recipe; return the result, {pid: rank} of every process that ran it, and the scratch dirs."""
    from trainparity._parallel import _check as _data_parallel

    scratch: list[str] = []
    made = _data_parallel.scratch_directory

    @contextlib.contextmanager
    def recording(prefix: str) -> Iterator[pathlib.Path]:
        with made(prefix) as path:
            scratch.append(str(path))
            yield path

    monkeypatch.setattr(_data_parallel, "scratch_directory", recording)
    with tempfile.TemporaryDirectory() as pid_dir:
        result = check(fault, pid_dir=pid_dir, timeout=timeout)
        pids = {int(f.name): int(f.read_text()) for f in pathlib.Path(pid_dir).iterdir()}
    return result, pids, [path for path in scratch if "trainparity-dp-" in path]


def test_rank_that_raises_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    result, pids, scratch = _run_recording(monkeypatch, "raises", timeout=60)
    assert result.outcome is tp.Outcome.ERROR
    assert result.error is not None
    assert (result.error.kind, result.error.rank, result.error.exc_type) == ("raised", 1, "ValueError")
    assert result.reason == "rank 1: the recipe raised ValueError: rank 1 cannot go on"
    assert 'data_parallel_recipes.py", line' in result.report() and "in step" in result.report()
    assert sorted(pids.values()) == [0, 0, 1], "both ranks and the reference ran"
    assert still_running(list(pids)) == []
    assert scratch and not any(pathlib.Path(path).exists() for path in scratch)


def test_rank_that_hangs_is_a_timeout_that_kills_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    result, pids, scratch = _run_recording(monkeypatch, "hangs", timeout=6)
    assert result.outcome is tp.Outcome.ERROR
    assert result.error is not None and result.error.kind == "timeout"
    assert result.error.rank in (0, 1)
    report = result.report()
    assert "did not finish within timeout=6 s" in report and "every process of the check was killed" in report
    # the stacks show rank 1 in the recipe's sleep and rank 0 waiting for it inside DDP
    stacks = report.split("Stacks of every process", 1)[1]
    rank0, rank1 = stacks.split("  rank 0:\n", 1)[1].split("  rank 1:\n", 1)
    assert "distributed.py" in rank0 and 'data_parallel_recipes.py", line' in rank0
    assert 'data_parallel_recipes.py", line' in rank1 and "distributed.py" not in rank1
    assert sorted(pids.values()) == [0, 0, 1]
    assert still_running(list(pids)) == []
    assert scratch and not any(pathlib.Path(path).exists() for path in scratch)


def test_rank_that_dies_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    result, pids, scratch = _run_recording(monkeypatch, "dies", timeout=60)
    assert result.outcome is tp.Outcome.ERROR
    assert result.error is not None
    assert (result.error.kind, result.error.rank, result.error.exitcode) == ("died", 1, 3)
    assert result.reason == "rank 1: the process died (exit code 3)"
    assert still_running(list(pids)) == []
    assert scratch and not any(pathlib.Path(path).exists() for path in scratch)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"world_size": 1}, ValueError, "world_size= must be an int >= 2"),
        ({"world_size": True}, ValueError, "world_size= must be an int >= 2"),
        ({"steps": 0}, ValueError, "steps= must be an int >= 1"),
        ({"seed": 1.5}, TypeError, "seed= must be an int"),
        ({"backend": 2}, TypeError, "backend= must be a string"),
        ({"backend": "carrier-pigeon"}, ValueError, "backend='carrier-pigeon' is not available"),
        ({"timeout": 0}, ValueError, "timeout= must be a positive number"),
        ({"comparison": 1e-6}, TypeError, "tolerances are declared, never inferred"),
        ({"isolation": "inprocess"}, ValueError, "cannot run a world of ranks"),
        ({"isolation": "thread"}, ValueError, "isolation= must be one of"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        tp.check_parallel(DDPRecipe, **kwargs)


def test_nccl_needs_a_gpu_per_rank() -> None:
    # A CPU build has no nccl at all; a GPU machine has fewer than 64 GPUs.
    with pytest.raises(ValueError, match="backend='nccl' (is not available|needs one GPU per rank)"):
        tp.check_parallel(DDPRecipe, backend="nccl", world_size=64)


class MixinTest(tp.TestCase):
    def test_pass_returns_the_result(self) -> None:
        result = self.assertParallelEquivalent(DDPRecipe, comparison=TOLERANCE, steps=2, timeout=60)
        self.assertIs(result.outcome, tp.Outcome.PASS)

    def test_fail_raises_with_the_report(self) -> None:
        with self.assertRaises(AssertionError) as caught:
            self.assertParallelEquivalent(DDPRecipe(fault="no_ddp"), comparison=TOLERANCE, steps=1, timeout=60)
        self.assertIn("First violation: gradients.fc1.weight (step 1, rank 1, kind: gradient_mismatch, cause: "
                      "grads_not_synchronized)", str(caught.exception))

    def test_error_reraises_the_users_exception(self) -> None:
        with self.assertRaises(ValueError) as caught:
            self.assertParallelEquivalent(DDPRecipe(fault="raises"), timeout=60)
        self.assertIsInstance(caught.exception, tp.RecipeError)
        self.assertIn("rank 1 cannot go on", str(caught.exception))


class PlainUnittestMixinTest(tp.TrainParityMixin, unittest.TestCase):
    def test_mixin_without_expecttest(self) -> None:
        with self.assertRaises(self.failureException):
            self.assertParallelEquivalent(DDPRecipe(fault="same_shard"), comparison=TOLERANCE, steps=1,
                                          timeout=60)


# -- the torchrun example, launched by the harness: 2 ranks, a file store ------------------------------------


_KEPT: list[Any] = []


def run_example_rank(payload: dict[str, Any], workdir: pathlib.Path) -> dict[str, Any]:
    """Engine task: join the 2-rank world through the file store, run the example's main(), report rank 0's audit."""
    dist.init_process_group("gloo", init_method=pathlib.Path(payload["store"]).as_uri(), rank=payload["rank"],
                            world_size=2)
    result = runpy.run_path(str(EXAMPLE))["main"](same_shard=payload["same_shard"])
    dist.barrier()
    _KEPT.append(dist.group.WORLD)  # released by the child's os._exit, as in trainparity._process._world
    dist.destroy_process_group()
    if result is None:
        return {"outcome": None, "report": None, "kinds": []}
    return {"outcome": result.outcome.value, "report": result.report(), "kinds": sorted(result.counts)}


@pytest.mark.parametrize("same_shard", [False, True])
def test_torchrun_example_through_the_harness_launcher(tmp_path: pathlib.Path, same_shard: bool) -> None:
    store = str(tmp_path / "store")
    jobs = [Job("test_data_parallel:run_example_rank", {"store": store, "rank": rank, "same_shard": same_shard},
                f"rank {rank}", rank=rank) for rank in range(2)]
    rank0, rank1 = run_jobs(jobs, deadline=Deadline.after(60), isolation="process", concurrency=2, on_failure="all")
    assert rank0.error is None and rank1.error is None, (rank0.error, rank1.error)
    assert rank0.output is not None and rank1.output == {"outcome": None, "report": None, "kinds": []}
    if same_shard:
        assert rank0.output["outcome"] == "FAIL"
        assert rank0.output["kinds"] == ["cross_rank_duplicate", "missing_id"], rank0.output["report"]
    else:
        assert rank0.output["outcome"] == "PASS", rank0.output["report"]
        assert "ranks=[0, 1]" in rank0.output["report"]


def test_torchrun_example_under_torchrun() -> None:
    # --standalone: a free port of its own, so that concurrent test runs do not collide on torchrun's default
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
               "--same-shard"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # torchrun's workers too, whatever happened
        process.wait()
    assert process.returncode == 1, err
    assert "trainparity coverage check: FAIL" in out and "ranks=[0, 1]" in out, out
    assert "First violation: coverage.cross_rank_duplicate" in out, out


def test_shards_of_a_batch_drawn_with_replacement_are_judged_as_a_multiset() -> None:
    from trainparity._parallel._shards import shard_violations

    assert shard_violations(1, [1, 1, 2], [[1], [1, 2]]) == []
    found = shard_violations(1, [1, 1, 2], [[1], [2, 2]])
    assert [(v.kind, v.sample_id, v.cause) for v in found] == [
        ("missing_id", 1, "rank_shard_missing"),
        ("cross_rank_duplicate", 2, "rank_shard_overlap"),
    ]


def test_check_judges_a_reference_batch_drawn_with_replacement() -> None:
    from trainparity._parallel._judge import judge_parallel
    from trainparity._parallel._trace import RankStep, RankTrace

    def trace(*steps: list[int | str]) -> RankTrace:
        return RankTrace([RankStep(i, ids, {}, {}, []) for i, ids in enumerate(steps, 1)], 1, [], {})

    result = judge_parallel(trace([1, 1, 2]), [trace([1]), trace([2, 2])], tp.ExactComparison(), {})
    assert result.outcome is tp.Outcome.FAIL, result.report()
    assert [(v.kind, v.sample_id, v.step) for v in result.violations] == [
        ("missing_id", 1, 1), ("cross_rank_duplicate", 2, 1)]
    assert judge_parallel(trace([1, 1, 2]), [trace([1]), trace([1, 2])], tp.ExactComparison(), {}).passed
