"""What runs inside a child process: read a request, run one task, write its output.

Used by both launchers of the process engine: the warmed fork server forks and calls
`run_request`; `isolation="spawn"` starts `python -m trainparity._child REQUEST`.

The child writes its output in the `_wire` format (JSON plus raw tensor bytes), so the parent
reads it back without unpickling anything a child wrote.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any

from trainparity import _wire as wire

RESULT_FILE = "result.bin"
ERROR_FILE = "error.bin"
#: exit status of a child whose task raised (its error file says what)
RAISED_EXIT = 17


@dataclasses.dataclass(frozen=True)
class Request:
    """Everything a child needs: which task, its input, and the parent's import context."""

    #: "package.module:function" of a task in trainparity: `task(payload, workdir) -> dict`
    task: str
    payload: Any
    workdir: str
    sys_path: list[str]
    cwd: str
    environ: dict[str, str]


def load_task(reference: str) -> Callable[[Any, pathlib.Path], dict[str, Any]]:
    module_name, _, function = reference.partition(":")
    task: Callable[[Any, pathlib.Path], dict[str, Any]] = getattr(importlib.import_module(module_name), function)
    return task


def error_record(error: BaseException) -> dict[str, str]:
    """The user's exception as plain strings (type, message, traceback)."""
    return {
        "exc_type": type(error).__qualname__,
        "exc_module": type(error).__module__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
    }


def run_request(request_path: str) -> int:
    """Run the task described in `request_path`; return the exit status for the process."""
    with open(request_path, "rb") as file:
        request: Request = pickle.load(file)
    os.environ.clear()
    os.environ.update(request.environ)
    sys.path[:] = request.sys_path
    os.chdir(request.cwd)
    workdir = pathlib.Path(request.workdir)
    try:
        output = load_task(request.task)(request.payload, workdir)
        wire.dump(output, workdir / RESULT_FILE)
    except BaseException as error:  # noqa: BLE001 - everything the user's code raises is reported
        wire.dump(error_record(error), workdir / ERROR_FILE)
        return RAISED_EXIT
    return 0


def main() -> None:
    import gc

    # As in the fork server: collection during torch's import is a third of its cost.
    gc.disable()
    import torch  # noqa: F401

    gc.enable()
    code = 1
    try:
        code = run_request(sys.argv[1])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: user threads or atexit hooks must not hang a finished child.
        os._exit(code)


if __name__ == "__main__":
    main()
