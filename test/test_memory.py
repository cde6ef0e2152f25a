"""The parent of many resume checks does not grow: nothing of a check's runs (traces, snapshots, digests, results)
stays behind in the process that called it.

The recipe's model and optimizer state are about 12 MB (a 1024 x 1024 float32 weight and AdamW's two
moments), so a check that left one model-sized snapshot behind would grow the parent by 4 MB or more per
check, 80 MB over 20 checks: well past the bound. The bound itself is shown to catch such a leak.
"""

from __future__ import annotations

import gc
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from regression_recipe import RegressionRecipe
from torch import nn

import trainparity as tp

WIDTH = 1024
#: the growth allowed over CHECKS checks after WARM_UP checks (allocator slack, caches warming)
BOUND = 50 * 2**20
WARM_UP, CHECKS = 3, 20
STATUS = pathlib.Path("/proc/self/status")

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals,
              pytest.mark.skipif(not STATUS.exists(), reason="reads the resident set size from /proc/self/status")]


class FewMegabytes(RegressionRecipe):
    """AdamW on an MLP with a 1024 x 1024 float32 hidden layer (4 MB of parameters, 8 MB of moments)."""

    def setup(self) -> tp.State:
        model = nn.Sequential(nn.Linear(16, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))
        return tp.State(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), position=0)

    def batches(self, state: tp.State) -> Iterator[Any]:
        while True:
            generator = torch.Generator().manual_seed(state.position)
            ids = torch.arange(8) + 8 * state.position
            state.position += 1
            yield ids, torch.randn(8, 16, generator=generator), torch.randn(8, 1, generator=generator)



def resident_bytes() -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("/proc/self/status has no VmRSS")


def growth(action: Callable[[], object]) -> int:
    """How much the resident set grew over CHECKS calls of `action`, after WARM_UP calls."""
    for _ in range(WARM_UP):
        action()
    gc.collect()
    before = resident_bytes()
    for _ in range(CHECKS):
        action()
    gc.collect()
    return resident_bytes() - before


def model_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in FewMegabytes().setup().model.parameters())


def resume_checks() -> None:
    result = tp.check_resume(FewMegabytes, steps=4, resume_at=2)
    assert result.passed, result.report()


def leaked_snapshots() -> Callable[[], object]:
    model = FewMegabytes().setup().model
    leaked: list[dict[str, torch.Tensor]] = []
    return lambda: leaked.append({k: v.clone() for k, v in model.state_dict().items()})


def measured_in_a_fresh_process(what: str) -> int:
    """The growth, measured in a new interpreter: one whose allocator holds no memory freed by earlier
    tests, which would hide a leak (and the checks' own growth) from the resident set size."""
    done = subprocess.run([sys.executable, __file__, what], capture_output=True, text=True, timeout=900,
                          check=False, cwd=pathlib.Path(__file__).parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.split()[-1])


def test_many_resume_checks_do_not_grow_the_parent() -> None:
    grown = measured_in_a_fresh_process("checks")
    assert grown < BOUND, f"the parent grew by {grown / 2**20:.1f} MiB over {CHECKS} resume checks"


def test_the_bound_catches_a_model_snapshot_left_behind_per_check() -> None:
    assert CHECKS * model_bytes() > 1.5 * BOUND
    grown = measured_in_a_fresh_process("leak")
    assert grown >= BOUND, f"a leak of {CHECKS} model snapshots grew the parent by only {grown / 2**20:.1f} MiB"


if __name__ == "__main__":
    print(growth(resume_checks if sys.argv[1] == "checks" else leaked_snapshots()))
