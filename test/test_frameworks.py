"""check_resume_script on training code written for a framework: a PyTorch Lightning script
(test/scripts/lightning_train.py). Lightning is a test-only extra: `pip install -e ".[frameworks]"`."""

from __future__ import annotations

import pathlib
import sys

import pytest

import trainparity as tp

pytest.importorskip("lightning", reason='Lightning is a test-only extra: python -m pip install -e ".[frameworks]"')

LIGHTNING = pathlib.Path(__file__).resolve().parent / "scripts" / "lightning_train.py"


def check(*extra: str) -> tp.ResumeResult:
    command = [sys.executable, str(LIGHTNING), "--out_dir", "{workdir}", *extra]
    return tp.check_resume_script(command, [*command, "--resume"], steps=6, resume_at=3, timeout=300)


@pytest.mark.parametrize("accumulate", ["1", "2"])
def test_a_lightning_fit_resumed_from_its_checkpoint_passes_and_says_the_rng_is_not_saved(accumulate: str) -> None:
    """Trainer.fit(..., ckpt_path=...) restores the module, optimizer, scheduler, callbacks and loops,
    with or without accumulate_grad_batches. Lightning's checkpoint holds no global RNG state: nothing
    here draws from it, so that is a note, not a FAIL."""
    result = check("--accumulate", accumulate)
    assert result.outcome is tp.Outcome.PASS, result.report()
    assert any(note.startswith("rng.torch differs from uninterrupted training from step 4 on")
               for note in result.notes), result.notes


def test_a_callback_whose_state_is_not_loaded_is_named_with_its_attribute() -> None:
    result = check("--fault", "callback_state_lost")
    first = result.first_violation
    assert result.outcome is tp.Outcome.FAIL and first is not None, result.report()
    assert (first.path, first.step, first.cause, first.expected, first.actual) == (
        "counter.batches", 3, "not_restored", 3, 0), result.report()
