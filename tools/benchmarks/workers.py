"""The worker randomness check against iterating the same loader for the same epochs (target: the check <= 1.5x):
`examples/augment.py`'s map-style loader (2 workers, 64 augmented images in batches of 8, each worker's generators
seeded by its worker_init_fn) and its streaming loader (an IterableDataset sharded by worker), 2 epochs each, a
new loader per round (so both pay the workers' start). Prints the median of 9 rounds of each, measured
alternately so that the machine's load drifts alike over both, with torch's default intra-op threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

from benchmarks._timing import ROOT, machine, seconds


def _iterate(make: Callable[[], Any], epochs: int) -> Callable[[], None]:
    """What a training loop does with the loader, without training: set_epoch, then every batch."""

    from trainparity._recipe._recipe import set_loader_epoch

    def iterate() -> None:
        loader = make()
        for epoch in range(epochs):
            set_loader_epoch(loader, epoch)  # as the check does
            for _ in loader:
                pass

    return iterate


def _check(make: Callable[[], Any], epochs: int) -> Callable[[], None]:
    import trainparity as tp

    def check() -> None:
        result = tp.check_worker_randomness(make(), epochs=epochs)
        assert result.passed, result.report()

    return check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=9, help="rounds of each measurement (default: 9)")


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    import augment

    epochs = 2
    print(f"worker randomness check against iterating the loader, {epochs} epochs (target: check <= 1.5x); "
          f"{machine()}")
    for name, make in (("map-style, 2 workers", augment.loader), ("streaming, 2 workers", augment.stream_loader)):
        _check(make, epochs)()  # warm: the first DataLoader start, the first check
        plain: list[float] = []
        checked: list[float] = []
        for _ in range(args.rounds):
            plain.append(seconds(_iterate(make, epochs)))
            checked.append(seconds(_check(make, epochs)))
        loop, check = statistics.median(plain), statistics.median(checked)
        ratio = check / loop
        print(f"  {name}: iterating the loader {loop * 1e3:.1f} ms, the check {check * 1e3:.1f} ms, {ratio:.2f}x "
              f"({'pass' if ratio <= 1.5 else 'FAIL'})")
