"""Tiny models train faster on one thread than on two: set it before the checks start their processes.

The checks' fresh processes inherit the environment of the process that starts them.
"""

import os
import pathlib

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the environment variable, which torch reads when it loads)

torch.set_num_threads(1)

EXAMPLES = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every example trains and judges numbers: the trainparity suite reruns them under each instruction set.
    for item in items:
        if item.path.is_relative_to(EXAMPLES):
            item.add_marker(pytest.mark.numeric)
