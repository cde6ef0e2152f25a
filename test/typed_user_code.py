"""A user's test module as `mypy --strict` sees it: test_typing.py type-checks it, it is never run.

A typed State, a recipe generic over it, the assertion functions and the mixin with the exact
types of their checks, and `tp.strategies`.
"""

from __future__ import annotations

import pathlib
from typing import assert_type

import torch
from hypothesis import given
from torch import nn

import trainparity as tp
from trainparity import strategies as tps


class RegressionState(tp.State):
    model: nn.Linear
    optimizer: torch.optim.SGD
    global_step: int


class Regression(tp.Recipe[RegressionState]):
    def __init__(self, accumulation_steps: int = 1) -> None:
        self.accumulation_steps = accumulation_steps

    def setup(self) -> RegressionState:
        model = nn.Linear(4, 1)
        return RegressionState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), global_step=0)

    def step(self, state: RegressionState, batch: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = state.model(batch).pow(2).mean()
        state.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch's stubs leave Tensor.backward untyped
        state.optimizer.step()
        state.global_step += 1
        return loss.detach()

    def load(self, path: pathlib.Path) -> RegressionState:
        state = tp.load_state(self.setup(), path)
        assert_type(state, RegressionState)
        return state


class Untyped(tp.Recipe):
    def setup(self) -> tp.State:
        return tp.State(model=nn.Linear(4, 1))


def test_functions() -> None:
    resume = tp.assert_resume_equivalent(Regression, steps=4, resume_at=2, msg="after the refactoring")
    assert_type(resume, tp.ResumeResult)
    accumulation = tp.assert_accumulation_equivalent(Regression(), microbatches=[2, 2], precision="native",
                                                     comparison=tp.ToleranceComparison(rtol=1e-5, atol=1e-6))
    assert_type(accumulation, tp.AccumulationResult)
    coverage = tp.assert_coverage({0: [[0, 1]], 1: [[2, 3]]}, policy=tp.ExactlyOnce(range(4)), abstain="skip")
    assert_type(coverage, tp.CoverageResult)
    parallel = tp.assert_parallel_equivalent("my_project.training:Regression", world_size=2, timeout=60)
    assert_type(parallel, tp.ParallelResult)
    assert_type(tp.check_resume(Untyped, isolation="spawn"), tp.ResumeResult)


@tps.torch_settings(max_examples=5)
@given(cfg=tps.sampler_configs(max_workers=0))
def test_strategies(cfg: tps.SamplerConfig) -> None:
    tp.assert_coverage(tps.data_loaders(cfg), policy=tps.expected_policy(cfg))


class TestRegression(tp.TestCase):
    def test_mixin(self) -> None:
        assert_type(self.assertResumeEquivalent(Regression, steps=4, msg=lambda report: report), tp.ResumeResult)
        assert_type(self.assertAccumulationEquivalent(Regression, microbatches=4), tp.AccumulationResult)
        assert_type(self.assertCoverage({0: [0]}, policy=[tp.NoCrossRankOverlap()]), tp.CoverageResult)
        assert_type(self.assertParallelEquivalent(Regression, steps=2), tp.ParallelResult)
        result = tp.check_coverage({0: [0]}, policy=tp.ExactlyOnce(range(1)))
        assert_type(self.assertTrainParity(result), tp.CoverageResult)
