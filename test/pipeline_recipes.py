"""The pipeline recipe is the example `examples/pipeline_mlp.py`."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from pipeline_mlp import FAULTS, Pipeline  # noqa: E402  (the example's directory goes first)

__all__ = ["FAULTS", "Pipeline"]
