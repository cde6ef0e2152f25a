"""Reading a child's trace: the `_wire` format against `torch.load(weights_only=True)`.

The trace is that of the resume benchmark's 6-step run (recorded in this process); each
figure is the median of 20 writes and reads of the same file.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

from benchmarks._timing import median_seconds


def run(args: argparse.Namespace) -> None:
    import torch

    from trainparity._process import _wire
    from trainparity._recipe._reference import resolve_recipe
    from trainparity._resume._trace import TrainPayload, train_run
    from trainparity.quickstarts.resume import Regression

    with tempfile.TemporaryDirectory() as folder:
        directory = pathlib.Path(folder)
        trace = train_run(TrainPayload(resolve_recipe(Regression), 0, 1, 6, str(directory / "ck")), directory)
        tensors = sum(len(step["state"]) + len(step["rng"]) for step in trace["steps"])
        wire, pt = directory / "trace.bin", directory / "trace.pt"
        write_wire = median_seconds(lambda: _wire.dump(trace, wire), 20)
        write_pt = median_seconds(lambda: torch.save(trace, pt), 20)
        read_wire = median_seconds(lambda: _wire.load(wire), 20)
        read_pt = median_seconds(lambda: torch.load(pt, weights_only=True), 20)
    print(f"a 6-step resume trace ({tensors} leaves), median of 20")
    print(f"write: _wire {write_wire * 1e3:.2f} ms, torch.save {write_pt * 1e3:.2f} ms ({write_pt / write_wire:.1f}x)")
    print(f"read:  _wire {read_wire * 1e3:.2f} ms, torch.load(weights_only=True) {read_pt * 1e3:.2f} ms "
          f"({read_pt / read_wire:.1f}x)")
