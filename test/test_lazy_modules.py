"""Lazy modules (nn.LazyLinear and friends): the optimizer holds parameters that have no size until the first
forward pass, which every check must accept, and judge once they have one."""

from __future__ import annotations

import copy
from collections.abc import Callable

import preflight_recipes as recipes
import pytest
import torch

import trainparity as tp

pytestmark = pytest.mark.torch_internals


def found(result: tp.Result) -> list[tuple[str, str, int | None, str | None]]:
    return [(v.kind, v.path, v.step, v.cause) for v in result.violations]


@pytest.mark.numeric
@pytest.mark.parametrize("check", [
    lambda: tp.check_optimizer_coverage(recipes.LazyModel),
    lambda: tp.check_mixed_precision(recipes.LazyModel),
    lambda: tp.check_train_mode(recipes.LazyModel),
    lambda: tp.check_frozen(recipes.LazyModel, frozen="aux.*"),
    lambda: tp.check_training(recipes.LazyModel),
    lambda: tp.check_resume(recipes.LazyModel),
    lambda: tp.check_accumulation(recipes.LazyModel, microbatches=2),
], ids=["optimizer_coverage", "mixed_precision", "train_mode", "frozen", "training", "resume", "accumulation"])
def test_every_check_passes_a_recipe_whose_optimizer_holds_lazy_parameters(check: Callable[[], tp.Result]) -> None:
    result = check()
    assert result.passed, result.report()


@pytest.mark.exact
def test_a_lazy_parameter_that_never_reaches_the_loss_is_found_once_it_has_a_size() -> None:
    result = tp.check_optimizer_coverage(recipes.LazyUnusedHead)
    assert found(result) == [("param_without_grad", "gradients.aux.weight", 1, "param_without_grad"),
                             ("param_without_grad", "gradients.aux.bias", 1, "param_without_grad")]


class LazyOptimizerForACopy(recipes.LazyUnusedHead):
    """The optimizer is built for a deep copy of the lazy model."""

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return super().optimizer(copy.deepcopy(model))


@pytest.mark.exact
def test_an_optimizer_of_lazy_parameters_built_for_another_copy_names_them_without_a_shape() -> None:
    result = tp.check_optimizer_coverage(LazyOptimizerForACopy)
    first = result.violations[0]
    assert (first.kind, first.path, first.step) == ("optimizer_for_other_model", "optimizer", 0), result.report()
    assert ("shapes not materialized yet, not materialized yet, [1, 16], [1], not materialized yet, not materialized "
            "yet)") in first.message, first.message


@pytest.mark.exact
def test_declaring_lazy_parameters_frozen_before_they_have_values_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"frozen=: body\.0\.weight, body\.0\.bias belong to a lazy module that no "
                                         r"forward pass has given values yet.*forward pass of a dummy batch"):
        tp.check_frozen(recipes.LazyModel, frozen="body.0.*")


class LazyHeadNotOptimized(recipes.LazyUnusedHead):
    """The optimizer holds the body only; the lazy auxiliary head runs (which sizes it)."""

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return super().optimizer(model.body)  # type: ignore[arg-type]


@pytest.mark.exact
def test_a_lazy_parameter_no_optimizer_holds_is_found_after_the_forward_that_sizes_it() -> None:
    result = tp.check_optimizer_coverage(LazyHeadNotOptimized)
    assert found(result) == [("param_not_optimized", "parameters.aux.weight", 1, "param_not_optimized"),
                             ("param_not_optimized", "parameters.aux.bias", 1, "param_not_optimized")]
    assert "(shape [3, 8]) requires grad, but no optimizer of the State holds it after step 1" in \
        result.violations[0].message
