"""The pytest plugin, loaded automatically where trainparity is installed (entry point `pytest11`).

- `--trainparity-isolation`, `--trainparity-timeout`, `--trainparity-precision`: defaults for
  every check of the run; an argument passed to a check wins.
- A header line with the versions and those defaults; a terminal summary of the checks run,
  by outcome.
- Under pytest-xdist each worker is a process of its own with its own fork server, stopped
  when the worker ends; the workers' counts reach the controller's summary.

`-p no:trainparity` turns it off.
"""

from __future__ import annotations

import platform
import sys
from collections import Counter
from typing import Any

import pytest

from trainparity._process import _session
from trainparity._results._result import Result
from trainparity._results._violation import Outcome
from trainparity._version import __version__

#: where an xdist worker leaves its counts for the controller
WORKER_OUTPUT_KEY = "trainparity_checks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trainparity", "trainparity: defaults for every check of the run (an argument wins)")
    group.addoption("--trainparity-isolation", choices=("process", "spawn", "inprocess"), default=None,
                    help="where the checks' runs execute: children of the warmed fork server (process), fresh "
                         "interpreters (spawn) or the test process (inprocess) (default: each check's own; a check "
                         "that cannot run in-process keeps its own)")
    group.addoption("--trainparity-timeout", type=float, default=None, metavar="SECONDS",
                    help="seconds a whole check may take, all its runs included, before it ends in ERROR "
                         f"(default: {_session.BUILTIN.timeout:g})")
    group.addoption("--trainparity-precision", choices=("float64", "native"), default=None,
                    help="precision of the accumulation, parallel and equivalence checks (default: float64)")


class Tally:
    """Counts the checks of the run by check and outcome, and reports them."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def record(self, result: Result) -> None:
        self.counts[result.check, result.outcome.value] += 1

    def pytest_report_header(self) -> str:
        import torch

        defaults = _session.defaults()
        return (f"trainparity {__version__} (torch {torch.__version__}, Python {platform.python_version()}); "
                f"check defaults: isolation={defaults.isolation or 'per check'}, timeout={defaults.timeout:g}s, "
                f"precision={defaults.precision}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        worker_output = getattr(session.config, "workeroutput", None)
        if worker_output is not None:  # an xdist worker: the controller sums the counts
            worker_output[WORKER_OUTPUT_KEY] = [[check, outcome, n] for (check, outcome), n in self.counts.items()]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """xdist's controller: a worker ended; add its counts."""
        for check, outcome, n in getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY, []):
            self.counts[check, outcome] += n

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.counts:
            return
        terminalreporter.write_sep("-", "trainparity")
        total = sum(self.counts.values())
        terminalreporter.write_line(f"{total} check{'s' if total != 1 else ''}: {self._by_outcome(None)}")
        for check in sorted({check for check, _ in self.counts}):
            terminalreporter.write_line(f"  {check}: {self._by_outcome(check)}")

    def _by_outcome(self, check: str | None) -> str:
        counts = Counter[str]()
        for (name, outcome), n in self.counts.items():
            if check is None or name == check:
                counts[outcome] += n
        return ", ".join(f"{counts[o.value]} {o.value}" for o in Outcome if counts[o.value])


_TALLY = "trainparity-tally"


def pytest_configure(config: pytest.Config) -> None:
    timeout = config.getoption("trainparity_timeout")
    try:
        defaults = _session.Defaults(
            isolation=config.getoption("trainparity_isolation"),
            timeout=_session.BUILTIN.timeout if timeout is None else _session.timeout(timeout),
            precision=config.getoption("trainparity_precision") or _session.BUILTIN.precision,
        )
    except ValueError as error:
        raise pytest.UsageError(f"--trainparity-timeout: {error}") from None
    _session.set_defaults(defaults)
    tally = Tally()
    config.pluginmanager.register(tally, _TALLY)
    _session.add_listener(tally.record)


def pytest_unconfigure(config: pytest.Config) -> None:
    tally = config.pluginmanager.get_plugin(_TALLY)
    if isinstance(tally, Tally):
        _session.remove_listener(tally.record)
        config.pluginmanager.unregister(tally, _TALLY)
    _session.set_defaults(_session.BUILTIN)
    launchers = sys.modules.get("trainparity._process._launchers")
    if launchers is not None:  # each process (an xdist worker too) stops its own fork server; nothing stays running
        launchers.shutdown()
