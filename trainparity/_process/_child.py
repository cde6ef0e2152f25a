"""What runs inside a child process: read a request, run one task, write its output.

Used by both launchers of the process engine: the warmed fork server forks and calls
`run_request` with the request it received through its pipe; `isolation="spawn"` starts
`python -c "from trainparity._process._child import main; main()"` and writes the request to its stdin.
Either way the request (which holds the parent's environment) never rests on disk.

Every child writes faulthandler's stacks to `STACKS_FILE` when it crashes on a fatal signal
and shortly before its deadline (the kill on timeout cannot be caught), so that hangs and
crashes are reported with the stack of every thread.

The child writes its output in the `_wire` format (JSON plus raw tensor bytes), so the parent
reads it back without unpickling anything a child wrote.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import os
import pathlib
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TextIO

from trainparity._process import _wire as wire
from trainparity._process._scratch import make_scratch_directories_in
from trainparity._process._tree import JOB_MARKER

RESULT_FILE = "result.bin"
ERROR_FILE = "error.bin"
#: the environment variable telling a command job (`Job.command`) where to write its output files
JOB_DIRECTORY = "TRAINPARITY_JOB_DIR"
STACKS_FILE = "stacks.txt"
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
    #: the job's name, set as the environment marker that `_tree.kill_tree` finds descendants by
    job: str
    #: time.monotonic() (system-wide on Linux) at which to dump every thread's stack, just before the kill
    dump_stacks_at: float
    #: torch's intra-op threads: the cores shared among the jobs that run at once
    threads: int


def load_task(reference: str) -> Callable[[Any, pathlib.Path], dict[str, Any]]:
    module_name, _, function = reference.partition(":")
    task: Callable[[Any, pathlib.Path], dict[str, Any]] = getattr(importlib.import_module(module_name), function)
    return task


#: the trainparity package, whose private modules hold the engine's own frames
_PACKAGE = pathlib.Path(__file__).resolve().parents[1]


def engine_frame(filename: str) -> bool:
    """Whether a frame is trainparity's own: a private module (`_*.py`, `_*/`) of the package, or the
    `python -c` line that started the fork server or a spawned child."""
    if filename == "<string>":
        return True
    path = pathlib.Path(os.path.abspath(filename))
    return path.is_relative_to(_PACKAGE) and path.relative_to(_PACKAGE).parts[0].startswith("_")


def _without_engine_frames(stack: traceback.StackSummary) -> traceback.StackSummary:
    return traceback.StackSummary.from_list([frame for frame in stack if not engine_frame(frame.filename)])


def format_user_traceback(error: BaseException) -> str:
    """The traceback without trainparity's own frames, which differ between isolations."""
    formatted = traceback.TracebackException.from_exception(error)
    seen: set[int] = set()
    pending = [formatted]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = _without_engine_frames(current.stack)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return "".join(formatted.format())


#: characters kept of an exception's message and of its traceback; a report stays readable
MAX_ERROR_TEXT = 10_000


def bounded(text: str) -> str:
    """`text`, cut to MAX_ERROR_TEXT characters with a line saying how much was left out."""
    if len(text) <= MAX_ERROR_TEXT:
        return text
    return f"{text[:MAX_ERROR_TEXT]}\n... ({len(text) - MAX_ERROR_TEXT:,} more characters cut)"


def recipe_exception(error: BaseException) -> BaseException:
    """The exception the user's code raised: a StopIteration out of `step()` (an exhausted iterator read in the
    loop) that a generator of the engine turned into 'RuntimeError: generator raised StopIteration' (PEP 479) is
    the StopIteration itself; one of the user's own generators keeps its RuntimeError."""
    if isinstance(error, RuntimeError) and isinstance(error.__cause__, StopIteration):
        frames = traceback.extract_tb(error.__cause__.__traceback__)  # from the generator the StopIteration left
        if frames and engine_frame(frames[0].filename):
            return error.__cause__
    return error


def error_record(error: BaseException) -> dict[str, Any]:
    """The user's exception (`recipe_exception`) as plain strings (type, message, traceback), each bounded in
    length, and `raised_at`: when it was caught, on the machine-wide monotonic clock, so that the engine can tell
    which of several processes failed first."""
    error = recipe_exception(error)
    try:
        message = str(error)
    except Exception as failure:  # noqa: BLE001 - a broken __str__ must not hide the error itself
        message = f"<str() of the exception raised {type(failure).__name__}>"
    return {
        "exc_type": type(error).__qualname__,
        "exc_module": type(error).__module__,
        "message": bounded(message),
        "traceback": bounded(format_user_traceback(error)),
        "raised_at": time.monotonic(),
    }


def run_request(data: bytes) -> int:
    """Run the task of the pickled `Request` in `data`; return the exit status for the process."""
    request: Request = pickle.loads(data)
    os.environ.clear()
    os.environ.update(request.environ)
    os.environ[JOB_MARKER] = request.job
    sys.path[:] = request.sys_path
    os.chdir(request.cwd)
    import torch

    torch.set_num_threads(request.threads)  # jobs side by side must not oversubscribe the cores
    workdir = pathlib.Path(request.workdir)
    make_scratch_directories_in(workdir)  # the parent removes them even after killing this process
    stacks = open(workdir / STACKS_FILE, "w")  # noqa: SIM115 - open until the process ends
    faulthandler.enable(stacks, all_threads=True)
    cancel_dump = _dump_stacks_at(request.dump_stacks_at, stacks)
    try:
        output = load_task(request.task)(request.payload, workdir)
        wire.dump(output, workdir / RESULT_FILE)
    except BaseException as error:  # noqa: BLE001 - everything the user's code raises is reported
        wire.dump(error_record(error), workdir / ERROR_FILE)
        return RAISED_EXIT
    finally:
        cancel_dump()
    return 0


def _dump_stacks_at(when: float, stacks: TextIO) -> Callable[[], None]:
    """Dump every thread's stack to `stacks` at `time.monotonic()` `when`; returns what cancels the dump.

    The dump runs in a Python thread, holding the GIL, so no other thread's frames change under it:
    faulthandler's own watchdog (`dump_traceback_later`) reads them while they run and can crash the
    child with SIGSEGV (CPython issues 140815 and 131580), which turned hangs into false crashes. A
    thread that never releases the GIL therefore gets no dump; its kill is reported all the same.
    """
    cancelled = threading.Event()
    thread = threading.Thread(target=_dump_stacks_when_due, args=(when, cancelled, stacks),
                              name="trainparity-stacks", daemon=True)
    thread.start()

    def cancel() -> None:
        cancelled.set()
        thread.join()

    return cancel


def _dump_stacks_when_due(when: float, cancelled: threading.Event, stacks: TextIO) -> None:
    if not cancelled.wait(max(when - time.monotonic(), 0.0)):
        faulthandler.dump_traceback(stacks, all_threads=True)


#: the dumping thread's own stack is left out of reports by this name
STACKS_DUMPER = _dump_stacks_when_due.__name__


def main() -> None:
    """Entry point of a spawned child: the pickled request arrives on stdin."""
    import gc

    # As in the fork server: collection during torch's import is a third of its cost.
    gc.disable()
    import torch  # noqa: F401

    gc.enable()
    code = 1
    try:
        data = sys.stdin.buffer.read()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # what the user's code reads from stdin is end of file, as in a forked child
        os.close(devnull)
        code = run_request(data)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: user threads or atexit hooks must not hang a finished child.
        os._exit(code)
