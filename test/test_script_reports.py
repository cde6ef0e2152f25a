"""Snapshots of the script checks' reports where the first violation names a cause, not its consequence."""

from __future__ import annotations

import pathlib
import sys

import pytest
from test_script_launch import ALONE, TOLERANCE, launched

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

SCRIPT = pathlib.Path(__file__).resolve().parent / "scripts" / "nanogpt_train.py"


def nanogpt(fault: str) -> tp.ResumeResult:
    command = [sys.executable, str(SCRIPT), "--out_dir", "{workdir}", "--fault", fault]  # reports show it relative
    return tp.check_resume_script(command, [*command, "--init_from", "resume"], steps=6, resume_at=3, timeout=120)


def first_violation(result: tp.Result) -> str:
    """The report up to its list of violations: the part that names the cause."""
    return result.report().split("\n\nAll violations")[0]


class TestScriptReports(tp.TestCase):
    def test_an_rng_the_checkpoint_never_held_is_a_fresh_start_s_stream(self) -> None:
        self.assertExpectedInline(first_violation(nanogpt("rng_not_saved")), """\
trainparity resume check: FAIL at rng.torch (not_restored, step 4)
config: command="<python>/bin/python test/scripts/nanogpt_train.py --out_dir '{workdir}' --fault rng_not_saved", comparison='exact', resume_at=3, resume_command="<python>/bin/python test/scripts/nanogpt_train.py --out_dir '{workdir}' --fault rng_not_saved --init_from resume", steps=6

First violation: rng.torch (step 4, kind: rng_mismatch, cause: not_restored)
  The RNG stream at the start of the step differs from uninterrupted training: the resumed run draws a fresh start's stream: at this step it is where an uninterrupted run's is at step 1 (the checkpoint holds no RNG state and the script seeds it again).
  Generator states are not equal.""")

    def test_a_lost_prefetched_batch_leads_with_the_data(self) -> None:
        self.assertExpectedInline(first_violation(nanogpt("prefetch_lost")), """\
trainparity resume check: FAIL at data.sample_ids (data_skipped, step 4, sample 179)
config: command="<python>/bin/python test/scripts/nanogpt_train.py --out_dir '{workdir}' --fault prefetch_lost", comparison='exact', resume_at=3, resume_command="<python>/bin/python test/scripts/nanogpt_train.py --out_dir '{workdir}' --fault prefetch_lost --init_from resume", steps=6

First violation: data.sample_ids (step 4, position 0, sample 179, kind: data_mismatch, cause: data_skipped)
  The resumed run trained on other samples than uninterrupted training. rng.torch was restored, then drawn differently before this batch by what produces the data (a batch prefetched before the save and lost with it, or a DataLoader or sampler rebuilt on resume that draws its order or seed from the global RNG): the data stream is what to fix, and the RNG's difference follows from it.
  The batch's sample IDs differ.
  expected: [455, 5, 39, 282]
  actual:   [179, 25, 61, 400]""")


class TestLaunchReports(tp.TestCase):
    def test_gradients_never_all_reduced_lead_with_the_rank_that_differs(self) -> None:
        result = tp.check_runs_equivalent(ALONE, launched("--fault", "no_ddp"), steps=2, comparison=TOLERANCE,
                                          timeout=120)
        self.assertExpectedInline(first_violation(result), """\
trainparity runs_equivalent check: FAIL at gradients.0.weight (grads_not_synchronized, step 1, rank 1)
config: candidate="<python>/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 test/scripts/ddp_train.py --fault no_ddp --out_dir '{workdir}'", comparison='tolerance(rtol=1e-09, atol=1e-12)', reference="<python>/bin/python test/scripts/ddp_train.py --out_dir '{workdir}'", steps=2

First violation: gradients.0.weight (step 1, rank 1, kind: gradient_mismatch, cause: grads_not_synchronized)
  Rank 1 holds other gradients than rank 0 at its optimizer step: they were not all-reduced (the model not wrapped in DistributedDataParallel, or its gradients never all-reduced?).
  Tensor-likes are not equal!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.924587 at index (5, 1)
  Greatest relative difference: 4.55464 at index (4, 0)
  expected: 0.961149
  actual:   0.0365621""")

    def test_a_checkpoint_restored_on_rank_0_only_is_not_restored_on_the_others(self) -> None:
        result = tp.check_resume_script(launched("--fault", "rank0_loads"), launched("--fault", "rank0_loads",
                                                                                      "--resume"),
                                        steps=4, resume_at=3, timeout=120)
        self.assertExpectedInline(first_violation(result), """\
trainparity resume check: FAIL at model.0.weight (not_restored, step 3, rank 1)
config: command="<python>/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 test/scripts/ddp_train.py --fault rank0_loads --out_dir '{workdir}'", comparison='exact', resume_at=3, resume_command="<python>/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 test/scripts/ddp_train.py --fault rank0_loads --resume --out_dir '{workdir}'", steps=4

First violation: model.0.weight (step 3, rank 1, kind: state_mismatch, cause: not_restored)
  Rank 1's state right after the load differs from rank 0's: the checkpoint was restored on some ranks only (loaded on one rank and never broadcast to the others?).
  Tensor-likes are not equal!

  Mismatched elements: 32 / 32 (100.0%)
  Greatest absolute difference: 0.0300831 at index (5, 2)
  Greatest relative difference: 0.549857 at index (0, 0)
  expected: 0.380441
  actual:   0.410524""")
