"""Inside a script under `tp.check_resume_script`: observe its training through hooks, write a `RunTrace`.

Installed by `site/sitecustomize.py` before the script's first line. The clock is the first
optimizer that steps: at each of its steps the pre-hook records the RNG streams (and, in a
resumed run, the state the script restored), the post-hook the step's sample IDs (from
`trainparity.probe`), the loss (the scalars `backward()` was called on since the last step) and
the live state: the modules that own the optimized parameters, the optimizers, the LR schedulers
and GradScalers the script built, and what it passed to `probe.track`, through the same leaf
walk as recipes (large tensors as digests). `torch.save`, safetensors' `save_file`/`save_model`
and `torch.distributed.checkpoint.save`/`async_save` mark the script's own checkpoints (the last
two patched as the script imports them: importing them first would cost every run a second).

A run ends by a real process exit: a baseline or resumed run after optimizer step `steps`, the
interrupted run once the script's first checkpoint written at or after `resume_at` is whole. The
state is taken at that checkpoint's first file; the process ends when the script next steps its
optimizer (or exits), after its asynchronous saves have completed: a checkpoint of several files
(the model as safetensors or DCP, then the optimizer, then the RNG states) is written entirely,
as it is when a real job is preempted after saving. Under `torchrun` each worker is observed so, as
`rank-<RANK>` of the launch, and the launcher writes the launch's one trace (`_launch`).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.optim.lr_scheduler
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from trainparity._batches._sample_ids import normalize_sample_ids
from trainparity._compat import GradScaler
from trainparity._observe._hooks import creates_state, step_closure
from trainparity._process import _wire as wire
from trainparity._process._child import ERROR_FILE, JOB_DIRECTORY, RAISED_EXIT, RESULT_FILE, error_record
from trainparity._records import fields_of, read
from trainparity._resume._trace import GRADIENTS, Boundary, RunTrace, StepRecord
from trainparity._script._frameworks import FrameworkObjects
from trainparity._script._launch import (
    install_launcher,
    is_launcher,
    mark_saved,
    rank_directory,
    saved_after,
    wait_for_peers,
    worker_rank,
)
from trainparity._state._entries import State, parameter_names
from trainparity._state._snapshot import Digesting, flatten, snapshot_rng, snapshot_state

#: the environment variable holding the run's `ScriptRun` as JSON
ENVIRONMENT = "TRAINPARITY_SCRIPT"


def _is_module(obj: object) -> bool:
    """`isinstance(obj, nn.Module)`, False for a dead `weakref.proxy` (torch.compile leaves some on the heap), on
    which isinstance raises ReferenceError."""
    try:
        return isinstance(obj, nn.Module)
    except ReferenceError:
        return False


@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """What one run of the script is for."""

    #: "baseline", "interrupted" or "resumed"
    mode: str
    steps: int
    resume_at: int
    #: the number of the first optimizer step this run takes; 0: one after the step at which the
    #: interrupted run saved, read from `handoff`
    first: int
    #: record the gradients at each optimizer step too (as `gradients.<param>` in the state)
    gradients: bool = False
    #: the file in which the interrupted run leaves the number of the step after which it saved
    handoff: str | None = None
    #: paths shipped whole all the same: at a step (by number), or at the load and the save (key 0)
    whole: tuple[tuple[int, tuple[str, ...]], ...] = ()
    #: a step's tensors travel as digests but for a few small ones (`Digesting.at`); the resume check fetches the
    #: values its report shows
    step_digests: bool = False

    def to_json(self) -> str:
        return json.dumps(fields_of(self))

    @classmethod
    def from_json(cls, text: str) -> ScriptRun:
        return read(cls, json.loads(text), "the script run")

    def digesting(self, step: int) -> Digesting:
        """How the snapshot of `step` (0: at the load and the save) is taken."""
        return Digesting.at(self.whole, step, every_step=self.step_digests)


class Recorder:
    def __init__(self, run: ScriptRun, workdir: pathlib.Path, launch: pathlib.Path | None = None) -> None:
        self.run = run
        self.workdir = workdir
        #: the torchrun launch this process is a worker of: the checkpoint of any of its ranks ends the interrupted run
        self.launch = launch
        self.step = run.first - 1
        if run.first == 0:
            assert run.handoff is not None, "a resumed run without a first step reads it from the handoff"
            self.step = int(pathlib.Path(run.handoff).read_text())
        self.clock: torch.optim.Optimizer | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.schedulers: list[Any] = []
        self.scalers: list[Any] = []
        self.modules: list[nn.Module] | None = None
        self.tracked: dict[str, Any] = {}
        self.ids: list[Any] = []
        self.losses: list[float] = []
        self.rng: dict[str, Any] = {}
        self.gradients: dict[str, Any] = {}
        #: a running `step(closure)` of the clock: its gradients are read after it, once the closure made them
        self.closure = False
        #: in a resumed run, each RNG stream the script restored (`torch.set_rng_state`, ...), as it was right after
        self.restored_rng: dict[str, Any] = {}
        #: the last step whose start (its first backward or optimizer step) was taken
        self.started = 0
        #: in a baseline, the State at the start of each step after `resume_at` (see `take_start`)
        self.starts: dict[int, dict[str, Any]] = {}
        #: what the script's framework checkpoints (Ignite's to_save, Accelerate's prepared objects)
        self.frameworks = FrameworkObjects()
        self.records: list[StepRecord] = []
        self.loaded: Boundary | None = None
        self.saved: Boundary | None = None
        #: the script's asynchronous saves (DCP `async_save` futures), waited for before the exit
        self.pending: list[Any] = []
        #: an optimizer whose `step()` only creates its state (see `trainparity._observe._hooks.creates_state`)
        self.creating_state: torch.optim.Optimizer | None = None
        self.finished = False

    # -- what the script's objects are -------------------------------------------------------------

    def _find_modules(self) -> list[nn.Module]:
        """The outermost modules that own parameters the optimizers step (found once, by walking the heap)."""
        optimized = {id(p) for o in self.optimizers for group in o.param_groups for p in group["params"]}
        with warnings.catch_warnings():  # isinstance() on deprecated module attributes warns
            warnings.simplefilter("ignore")
            modules = [m for m in gc.get_objects() if _is_module(m)]
        owners = {id(m) for m in modules if any(id(p) in optimized for p in m.parameters(recurse=False))}
        candidates = [m for m in modules if any(id(sub) in owners for sub in m.modules())]
        inner = {id(sub) for m in candidates for sub in m.modules() if sub is not m}
        return [m for m in candidates if id(m) not in inner]

    def state(self) -> State:
        if self.modules is None:
            self.modules = self._find_modules()
        entries: dict[str, Any] = {}
        for name, objects in (("model", self.modules), ("optimizer", self.optimizers),
                              ("scheduler", self.schedulers), ("scaler", self.scalers)):
            if objects:
                entries[name] = objects[0] if len(objects) == 1 else list(objects)
        entries.update(self.tracked)
        return State(**entries)

    def add_sample_ids(self, ids: Any) -> None:
        self.ids.extend(normalize_sample_ids(ids, "probe.sample_ids()") or [])

    # -- hooks -----------------------------------------------------------------------------------------

    def before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if creates_state(optimizer):
            self.creating_state = optimizer
            return
        if all(optimizer is not o for o in self.optimizers):
            self.optimizers.append(optimizer)
        if self.clock is None:
            self.clock = optimizer
        if optimizer is not self.clock or self.finished:
            return
        if self.run.mode == "interrupted" and self.saved is None and self.launch is not None:
            saved_at = saved_after(self.launch)
            # another rank saved after a step this one has taken too (not one it has yet to finish): this rank's
            # state is the one it had after that step
            if saved_at is not None and self.step >= saved_at:
                self.take_saved()
        if self.saved is not None:  # the checkpoint taken after the last step is whole: end here
            self.finish()
        self.take_start()
        self.rng = snapshot_rng(self.run.digesting(self.step + 1))
        self.closure = step_closure(optimizer, args, kwargs) is not None
        if self.run.gradients and not self.closure:
            self.gradients = self._gradients()

    def take_start(self) -> None:
        """The State at the start of the coming step: at its first backward or optimizer step, whichever comes
        first. Code runs between a resume's load and that point (a scheduler or a handler at the top of the
        iteration, callbacks of the micro-batches before the first step), as it runs at the same point of the
        uninterrupted run: so the resumed run's State there (what it restored) is held against the baseline's
        State at the start of the same step, which each baseline takes after `resume_at`."""
        coming = self.step + 1
        if self.finished or self.started == coming:
            return
        self.started = coming
        if self.run.mode == "resumed" and self.loaded is None:
            self.loaded = Boundary(snapshot_state(self.state(), self.run.digesting(0)), dict(self.restored_rng))
        elif self.run.mode == "baseline" and coming == self.run.resume_at + 1:  # what the resumed run restores
            self.starts[coming] = snapshot_state(self.state(), self.run.digesting(0))

    def rng_restored(self, stream: str) -> None:
        """The script set `stream` (`rng.torch`, ...) from its checkpoint: remember it as restored, before the
        resumed run's first step."""
        if self.run.mode == "resumed" and self.loaded is None:
            self.restored_rng[stream] = snapshot_rng()[stream]

    def _gradients(self) -> dict[str, Any]:
        """The gradients the optimizers are about to step on, by parameter name."""
        names = parameter_names(self.state())
        out: dict[str, Any] = {}
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    if parameter.grad is not None and id(parameter) in names:
                        flatten(f"{GRADIENTS}{names[id(parameter)]}", parameter.grad, out,
                                self.run.digesting(self.step + 1))
        return out

    def after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer is self.creating_state:
            self.creating_state = None
            return
        if optimizer is not self.clock or self.finished:
            return
        if self.run.gradients and self.closure:
            self.gradients = self._gradients()
        self.step += 1
        loss = sum(self.losses) if self.losses else None
        state = {**self.gradients, **snapshot_state(self.state(), self.run.digesting(self.step))}
        self.records.append(StepRecord(self.step, self.rng, list(self.ids) if self.ids else None, loss, state,
                                       self.starts.pop(self.step, None)))
        self.ids, self.losses = [], []
        if self.run.mode != "interrupted" and self.step >= self.run.steps:
            self.finish()

    def after_save(self) -> None:
        """A file of a checkpoint was written: the first at or after `resume_at` fixes the saved state."""
        if self.run.mode == "interrupted" and self.step >= self.run.resume_at and self.saved is None:
            self.take_saved()
            if self.launch is not None:
                mark_saved(self.launch, self.step)

    def take_saved(self) -> None:
        self.saved = Boundary(snapshot_state(self.state(), self.run.digesting(0)), snapshot_rng())
        if self.run.handoff is not None:
            pathlib.Path(self.run.handoff).write_text(str(self.step))

    def write(self) -> None:
        for future in self.pending:
            future.result()
        state = self.state()
        trace = RunTrace(self.records, self.loaded, self.saved, [],
                         holders=self.frameworks.holders({name: state[name] for name in state}))
        wire.dump(trace, self.workdir / RESULT_FILE)

    def finish(self) -> None:
        """Write the trace and end the process: a real exit, as a job killed after its checkpoint."""
        self.finished = True
        self.write()
        if self.launch is not None:
            wait_for_peers()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


RECORDER: Recorder | None = None


def install_from_environment() -> None:
    """Observe this process; torchrun's launcher leaves the check's environment to its workers, each observed as
    `rank-<RANK>` of the launch (`_launch`)."""
    if is_launcher():
        install_launcher(pathlib.Path(os.environ[JOB_DIRECTORY]))
        return
    run = ScriptRun.from_json(os.environ.pop(ENVIRONMENT))
    workdir = pathlib.Path(os.environ.pop(JOB_DIRECTORY))
    rank = worker_rank()
    install(run, workdir if rank is None else rank_directory(workdir, rank), None if rank is None else workdir)


def install(run: ScriptRun, workdir: pathlib.Path, launch: pathlib.Path | None = None) -> None:
    """Observe the script in this process, writing its trace to `workdir`; `launch`: the directory of the torchrun
    launch this process is a worker of."""
    global RECORDER
    if run.handoff is not None and run.mode == "resumed" and not pathlib.Path(run.handoff).exists():
        # The interrupted run ended without a checkpoint (its own ERROR says so): nothing to resume.
        wire.dump(error_record(RuntimeError("the interrupted run wrote no checkpoint to resume from")),
                  workdir / ERROR_FILE)
        os._exit(RAISED_EXIT)
    recorder = RECORDER = Recorder(run, workdir, launch)
    register_optimizer_step_pre_hook(recorder.before_step)
    register_optimizer_step_post_hook(recorder.after_step)

    _observe_saves(torch, ("save",), recorder)
    sys.meta_path.insert(0, _PatchOnImport({
        "safetensors.torch": functools.partial(_observe_saves, names=("save_file", "save_model"), recorder=recorder),
        "torch.distributed.checkpoint": functools.partial(_observe_saves, names=("save", "async_save"),
                                                          recorder=recorder),
        **recorder.frameworks.patches(),
    }))

    backward = torch.Tensor.backward

    def observed_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        recorder.take_start()
        if self.numel() == 1:
            recorder.losses.append(float(self.detach()))
        backward(self, *args, **kwargs)  # type: ignore[no-untyped-call]

    torch.Tensor.backward = observed_backward  # type: ignore[method-assign]
    _observe_rng_restores(recorder)
    # Optimizers in the order they are built (the same in every run, whichever steps first); a
    # wrapper that does not run Optimizer.__init__ (Lightning's, accelerate's) is not one of them.
    for cls, registry in ((torch.optim.Optimizer, recorder.optimizers),
                          (torch.optim.lr_scheduler.LRScheduler, recorder.schedulers),
                          (GradScaler, recorder.scalers)):
        _register_instances(cls, registry)

    def excepthook(kind: type[BaseException], error: BaseException, tb: types.TracebackType | None) -> None:
        wire.dump(error_record(error.with_traceback(tb)), workdir / ERROR_FILE)
        sys.stderr.flush()
        os._exit(RAISED_EXIT)

    sys.excepthook = excepthook
    atexit.register(lambda: None if recorder.finished else recorder.write())


def _observe_rng_restores(recorder: Recorder) -> None:
    """Tell the recorder when the script sets an RNG stream's state (as checkpoint code restores it): torch's
    `set_rng_state` (also as `torch.random.set_rng_state`), numpy's global `set_state`, Python's `setstate`."""
    import random

    import numpy as np

    def observed(restore: Callable[..., Any], stream: str) -> Callable[..., Any]:
        @functools.wraps(restore)
        def observed_restore(*args: Any, **kwargs: Any) -> Any:
            done = restore(*args, **kwargs)
            recorder.rng_restored(stream)
            return done

        return observed_restore

    torch.set_rng_state = torch.random.set_rng_state = observed(torch.random.set_rng_state, "rng.torch")
    np.random.set_state = observed(np.random.set_state, "rng.numpy")
    random.setstate = observed(random.setstate, "rng.python")


def _register_instances(cls: type, registry: list[Any]) -> None:
    init = getattr(cls, "__init__")  # noqa: B009 - mypy refuses cls.__init__ on a type

    def observed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if all(self is not known for known in registry):
            registry.append(self)

    setattr(cls, "__init__", observed_init)  # noqa: B010


def _observe_saves(module: types.ModuleType, names: tuple[str, ...], recorder: Recorder) -> None:
    """Make each `module.<name>`, a function that writes a checkpoint, tell the recorder when it has."""
    for name in names:
        setattr(module, name, _observed(getattr(module, name), recorder, waits=name == "async_save"))


def _observed(save: Callable[..., Any], recorder: Recorder, waits: bool) -> Callable[..., Any]:
    def observed_save(*args: Any, **kwargs: Any) -> Any:
        written = save(*args, **kwargs)
        if waits:  # a future: the checkpoint is whole when it resolves
            recorder.pending.append(written)
        recorder.after_save()
        return written

    return observed_save


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Calls `patches[name](module)` right after the script imports `name`, and imports nothing itself."""

    def __init__(self, patches: dict[str, Callable[[types.ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        spec = importlib.util.find_spec(name)  # the other finders' spec (this one no longer knows `name`)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[types.ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)
