"""The benchmarks of `python tools/bench.py NAME`, one module each, sharing the timing helpers of `_timing`.

Each module has a docstring (what it measures, against what, and the targets) and `run(args)`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: benchmark name -> module in this package
MODULES = {
    "accumulation": "accumulation",
    "coverage": "coverage",
    "data-parallel": "data_parallel",
    "equivalent": "equivalent",
    "overhead": "overhead",
    "parallel": "parallel",
    "preflight": "preflight",
    "resume": "resume",
    "scale": "scale",
    "script": "script",
    "training": "training",
    "wire": "wire",
    "workers": "workers",
}


def load(name: str) -> ModuleType:
    """The benchmark's module, imported only when it runs (most import torch)."""
    return importlib.import_module(f"benchmarks.{MODULES[name]}")
