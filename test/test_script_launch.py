"""The script checks on `torchrun` launches: every rank observed, one trace for the launch. test/scripts/ddp_train.py
is a DDP script, test/scripts/pipeline_train.py a torchtitan-style pipeline; each trains alone or under torchrun on
the same samples."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest
import torch

import trainparity as tp
from trainparity._resume._trace import Boundary, RunTrace, StepRecord
from trainparity._script._launch import merged
from trainparity._state._compare import Snapshot

pytestmark = pytest.mark.torch_internals

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "ddp_train.py"
PIPELINE = SCRIPT.parent / "pipeline_train.py"
ALONE = [sys.executable, str(SCRIPT), "--out_dir", "{workdir}"]
#: float64; DDP averages the ranks' mean losses' gradients where one process takes the mean of all: the order of the
#: sums is all that differs
TOLERANCE = tp.ToleranceComparison(rtol=1e-9, atol=1e-12)


def launched(*extra: str, script: pathlib.Path = SCRIPT) -> list[str]:
    # --standalone: a free port of its own, so that launches beside each other (pytest-xdist) never meet
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
            *extra] + (["--out_dir", "{workdir}"] if script == SCRIPT else [])


def leftover_workers(fault: str) -> list[str]:
    """Processes still running the script with `fault` (torchrun's workers), from /proc."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(SCRIPT) in command and fault in command.split():
            found.append(command)
    return found


@pytest.mark.numeric
def test_a_script_trains_alone_as_its_torchrun_launch_does() -> None:
    result = tp.check_runs_equivalent(ALONE, launched(), steps=4, comparison=TOLERANCE, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.numeric
@pytest.mark.parametrize(("fault", "cause"), [("none", None), ("scaled_twice", "loss_scaled_twice")])
def test_a_pipeline_script_checks_against_its_launch_stage_by_stage(fault: str, cause: str | None) -> None:
    """The stages' parameters, gradients and optimizer groups joined by name are the whole model's; the samples are
    one stage's (every stage reads the batch); a loss divided by the micro-batches twice halves every gradient."""
    result = tp.check_runs_equivalent([sys.executable, str(PIPELINE)], launched("--fault", fault, script=PIPELINE),
                                      steps=2, comparison=TOLERANCE, timeout=120)
    if cause is None:
        assert result.outcome is tp.Outcome.PASS, result.report()
        return
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.step, first.cause) == ("gradients.layers.0.weight", 1, cause), result.report()
    assert {v.path for v in result.violations if v.kind == "gradient_mismatch"} == {
        f"gradients.layers.{layer}.{name}" for layer in range(4) for name in ("weight", "bias")}


@pytest.mark.exact
def test_a_worker_that_raises_is_the_error_with_its_rank_and_no_worker_is_left_running() -> None:
    result = tp.check_runs_equivalent(ALONE, launched("--fault", "rank1_raises"), steps=3, timeout=120)
    error = result.error
    assert result.outcome is tp.Outcome.ERROR and error is not None, result.report()
    assert (error.kind, error.exc_type, error.rank, error.phase) == ("raised", "RuntimeError", 1, "candidate")
    assert "rank 1 ran out of data" in error.message
    assert leftover_workers("rank1_raises") == []


@pytest.mark.numeric
def test_a_launch_resumes_as_it_trains() -> None:
    result = tp.check_resume_script(launched(), launched("--resume"), steps=4, resume_at=3, timeout=120)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.exact
def test_the_launch_s_trace_joins_its_ranks_steps() -> None:
    """The samples of one stage's replicas in rank order, the mean of the losses, each path as the lowest rank
    holding it has it (the parameters the optimizers step: every stage's), the steps every rank took, and where
    replicas disagree."""
    one, other = torch.ones(2), torch.zeros(2)
    stepped = "optimizer.param_groups.0.params"

    def rank(ids: list[int], losses: list[float | None], state: Snapshot) -> RunTrace:
        steps = [StepRecord(n + 1, {}, [i + n for i in ids], loss, dict(state)) for n, loss in enumerate(losses)]
        return RunTrace(steps, Boundary(dict(state), {}), None, [])

    trace = merged([rank([0, 1], [1.0, 2.0], {"model.w": one, "optimizer.lr": 0.1, stepped: "w"}),
                    rank([2, 3], [3.0, 4.0, 5.0], {"model.w": other, stepped: "w"}),
                    rank([0, 1, 2, 3], [None, None], {"model.v": other, stepped: "v"})])
    assert [s.sample_ids for s in trace.steps] == [[0, 1, 2, 3], [1, 2, 3, 4]]
    assert [s.loss for s in trace.steps] == [2.0, 3.0]
    assert trace.steps[0].state == {"model.w": one, "optimizer.lr": 0.1, stepped: "w,v", "model.v": other}
    # rank 1 replicates rank 0 (its model holds the same paths) and differs from it at the load; rank 2 is a stage
    assert [(c.step, c.rank, c.first, c.at_load, c.mismatch.path) for c in trace.copies] == [
        (0, 1, 0, True, "model.w"), (0, 1, 0, True, "optimizer.lr")]
