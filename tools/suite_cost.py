"""What the test suite costs, by file: `python tools/suite_cost.py [LOG]`.

Without LOG it runs the README's test command with `--durations=0` (every test's setup, call and teardown time)
and sums the times by test file; with LOG it reads the output of such a run. The times are the tests' own
(summed over the pytest-xdist workers), so they add up to about twice the wall time on two workers.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys

LINE = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+?)::")


def main() -> None:
    if len(sys.argv) > 1:
        with open(sys.argv[1]) as log:
            text = log.read()
    else:
        text = subprocess.run([sys.executable, "-m", "pytest", "-q", "--durations=0"], capture_output=True,
                              text=True, check=False).stdout
    seconds: collections.Counter[str] = collections.Counter()
    tests: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
            tests[match.group(3)] += match.group(2) == "call"  # pytest hides calls under 5 ms
    total = sum(seconds.values())
    if not total:
        sys.exit("no --durations lines found: pass the output of `python -m pytest --durations=0`")
    print(f"{total:.0f} s of test time in {len(seconds)} files")
    for path, spent in seconds.most_common(15):
        print(f"{spent:7.0f} s  {100 * spent / total:5.1f}%  {tests[path]:4d} tests over 5 ms  {path}")


if __name__ == "__main__":
    main()
