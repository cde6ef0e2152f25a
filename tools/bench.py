"""Benchmarks: `python tools/bench.py NAME`, NAME one of `benchmarks.MODULES` (resume, scale, preflight, workers, ...).

Speed goals live here, never in timed unit tests. Each benchmark (a module of `tools/benchmarks/`) prints its
figures and, where a goal is a ratio, the reference measured in the same run.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import benchmarks  # noqa: E402


def main() -> None:
    choosing = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help="-h" in sys.argv[1:2])
    choosing.add_argument("benchmark", choices=sorted(benchmarks.MODULES))
    chosen, _ = choosing.parse_known_args()
    module = benchmarks.load(chosen.benchmark)  # only the benchmark that runs is imported
    parser = argparse.ArgumentParser(prog=f"bench.py {chosen.benchmark}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=[chosen.benchmark], help=argparse.SUPPRESS)
    add_arguments = getattr(module, "add_arguments", None)
    if add_arguments is not None:
        add_arguments(parser)
    module.run(parser.parse_args())


if __name__ == "__main__":
    main()
