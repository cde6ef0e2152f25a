"""Suite-wide hooks."""

from __future__ import annotations

import argparse
import faulthandler
import os
import shutil
import sys
import tempfile

import pytest
from process_helpers import SESSION

# Every child of this test process carries it: "nothing left running" means nothing of ours.
os.environ[SESSION] = str(os.getpid())  # each xdist worker its own

#: seconds the test process may take to exit after its last test
EXIT_BOUND = 120

#: environment variable: where the suite's interpreters share their bytecode
BYTECODE = "PYTHONPYCACHEPREFIX"


def _share_bytecode() -> str | None:
    """Under PYTHONDONTWRITEBYTECODE (usual in containers and CI) each of the suite's ~460 fresh interpreters
    (script runs, the command line, pytest within pytest, spawned children) compiled an editable install of
    trainparity from source again, 0.2-0.3 s each: they share one bytecode directory of this run instead, which
    the process that made it removes at its end (the xdist workers inherit it). The fork server's own answer to
    the variable is tested with the variable set on purpose (test_engine.py). The directory, if made here."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or BYTECODE in os.environ:
        return None
    directory = tempfile.mkdtemp(prefix="suite-bytecode-")
    os.environ[BYTECODE] = directory
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    return directory


SHARED_BYTECODE = _share_bytecode()


def pytest_unconfigure(config: pytest.Config) -> None:
    # Nothing may keep the process from exiting (a child joined at exit, a thread, a fork server):
    # past the bound, every thread's stack is printed and the process exits with status 1, instead
    # of hanging the run that called it. Not in an xdist worker: it waits there, by design, until the
    # controller (which has this bound) is done with the other workers.
    if SHARED_BYTECODE is not None:
        shutil.rmtree(SHARED_BYTECODE, ignore_errors=True)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        faulthandler.dump_traceback_later(EXIT_BOUND, exit=True, file=sys.__stderr__)


@pytest.fixture
def cli_commands() -> dict[str, argparse.ArgumentParser]:
    """The command line's commands by name, as `python -m trainparity <name>` parses them."""
    from trainparity._cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)
