"""Coverage policies: what each observation window must satisfy, and the universe of IDs they declare.

A policy only states the rule; `Universe` (`_universe.py`) turns its declared universe into
arrays once per check, and the audit (`_audit.py`) judges every policy in one pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import ClassVar

import numpy as np
import torch

from trainparity._coverage._universe import Universe, UniverseLike, describe_universe
from trainparity._validation import InvalidArgument, check_argument, check_int, check_type


class CoveragePolicy:
    """Base of the coverage policies; use the concrete ones (`tp.ExactlyOnce`, ...)."""

    #: whether this policy needs the universe of IDs (it ABSTAINs when that is None)
    needs_universe: ClassVar[bool] = False
    universe: UniverseLike = None

    def describe(self) -> str:
        return f"{type(self).__name__}()"

    def __repr__(self) -> str:
        return self.describe()


class _UniversePolicy(CoveragePolicy):
    needs_universe = True

    def __init__(self, universe: UniverseLike) -> None:
        self.universe = _validated_universe(universe, type(self).__name__)

    def describe(self) -> str:
        return f"{type(self).__name__}({describe_universe(self.universe)})"


class ExactlyOnce(_UniversePolicy):
    """Every ID of `universe` is observed exactly once per window, across all ranks.

    Violations: `same_rank_duplicate`, `cross_rank_duplicate`, `unexpected_id`, `missing_id`.
    `universe=None` (unknown) makes the check ABSTAIN.
    """


class AtLeastOnce(_UniversePolicy):
    """Every ID of `universe` is observed at least once per window; repeats are allowed.

    Violations: `unexpected_id`, `missing_id`. `universe=None` (unknown) makes the check ABSTAIN.
    """


class ExpectedPadding(_UniversePolicy):
    """Every ID of `universe` at least once per window, plus exactly `padding` extra observations.

    The extra observations are those beyond one per ID of the universe: what
    `DistributedSampler(drop_last=False)` adds to make the window divisible by the world size.
    Violations: `unexpected_id`, `missing_id`, `padding_count`.
    """

    def __init__(self, universe: UniverseLike, *, padding: int) -> None:
        super().__init__(universe)
        self.padding = check_int("ExpectedPadding(padding=...)", padding, 0)

    def describe(self) -> str:
        return f"ExpectedPadding({describe_universe(self.universe)}, padding={self.padding})"


class NoCrossRankOverlap(CoveragePolicy):
    """No ID observed by one rank is observed by another rank in the same window.

    Repeats within one rank are allowed. Violation: `cross_rank_duplicate`.
    """


class DistinctEpochOrder(CoveragePolicy):
    """No rank observes the same sequence of IDs in two windows (epochs): the missing `set_epoch` bug.

    Streams of fewer than 2 IDs are not judged (they have only one order). Needs at least two
    windows, otherwise the check ABSTAINs. Violation: `repeated_epoch_order`.
    """


def _validated_universe(universe: object, policy: str) -> UniverseLike:
    if universe is None or isinstance(universe, (range, np.ndarray, torch.Tensor)):
        return universe
    if isinstance(universe, bool) or isinstance(universe, (int, np.integer)):
        raise InvalidArgument(f"{policy}(universe) takes a collection of IDs, got the int {universe!r}: "
                              f"pass range({universe}) for the IDs 0..{int(universe) - 1}")
    if isinstance(universe, (str, bytes)) or not isinstance(universe, Iterable):
        raise InvalidArgument(f"{policy}(universe) takes a collection of IDs (range, list, set, array, tensor) or "
                              f"None, got {type(universe).__name__}")
    # A one-shot iterator's IDs are kept for reuse; a mapping's IDs are its keys.
    if iter(universe) is universe or not isinstance(universe, Sized) or isinstance(universe, Mapping):
        return list(universe)
    return universe


def resolve_policies(policy: object) -> list[CoveragePolicy]:
    """Validate `policy=`: one policy or a non-empty list of them."""
    items = list(policy) if isinstance(policy, (list, tuple)) else [policy]
    policies: list[CoveragePolicy] = []
    check_argument(items, "policy= is an empty list: pass at least one policy, e.g. tp.ExactlyOnce(range(n))")
    for item in items:
        if isinstance(item, type) and issubclass(item, CoveragePolicy):
            raise InvalidArgument(f"policy= got the class {item.__name__}; pass an instance, e.g. tp.{item.__name__}"
                                  f"({'' if not item.needs_universe else 'range(n)'})")
        policies.append(check_type(item, CoveragePolicy, "policy= must be tp.ExactlyOnce(universe), "
                                   "tp.AtLeastOnce(universe), tp.NoCrossRankOverlap(), tp.ExpectedPadding(universe, "
                                   f"padding=n), tp.DistinctEpochOrder() or a list of them, got {type(item).__name__}"))
    return policies


def shared_universe(policies: Sequence[CoveragePolicy]) -> Universe | None:
    """The one declared universe of these policies (None if none declares one)."""
    found: Universe | None = None
    for policy in policies:
        if not policy.needs_universe or policy.universe is None:
            continue
        universe = Universe.build(policy.universe)
        check_argument(found is None or found.same_as(universe), f"the policies declare different universes "
                       f"({found and found.description} and {universe.description}); run one check per universe")
        found = found or universe
    return found
