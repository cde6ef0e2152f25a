"""Benchmarks: `python tools/bench.py {resume,accumulation,coverage,data-parallel}`.

Speed goals live here, never in timed unit tests. Each benchmark prints its figures and,
where a goal is a ratio, the reference measured in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable


def torch_import_seconds(repeats: int = 3) -> float:
    """Median wall time of `python -c "import torch"` in a new interpreter, measured now."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


BENCHMARKS: dict[str, Callable[[argparse.Namespace], None]] = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    args = parser.parse_args()
    BENCHMARKS[args.benchmark](args)


if __name__ == "__main__":
    main()
