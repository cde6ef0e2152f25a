"""Coverage inputs for `python -m trainparity coverage`: functions returning tp.check_coverage's arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trainparity as tp


def two_ranks(overlap: bool = False) -> tuple[dict[int, list[list[int]]], tp.ExactlyOnce]:
    """Two ranks reading 4 samples; with `overlap`, rank 1 reads rank 0's shard."""
    return {0: [[0, 1]], 1: [[0, 1]] if overlap else [[2, 3]]}, tp.ExactlyOnce(range(4))


def records() -> tuple[dict[int, list[dict[str, int]]], tp.ExactlyOnce, Callable[[Any], Any]]:
    """Batches of records: the third element extracts the IDs."""
    return {0: [{"idx": 0}], 1: [{"idx": 1}]}, tp.ExactlyOnce(range(2)), lambda batch: batch["idx"]


def raises() -> None:
    raise RuntimeError("the shards could not be listed")


def returns_a_list() -> list[int]:
    return [0, 1]


NOT_A_FUNCTION = 3
