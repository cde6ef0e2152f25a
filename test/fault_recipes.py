"""One recipe that injects a fault into one phase: the reliability tests' and `tools/faults.py`'s.

`Faulty(fault, phase)` trains a float64 linear model with SGD and works under the resume,
accumulation and parallel checks (wrapped in DDP when a process group is up, where only
rank 1 misbehaves). `phase` is setup, batches, step, save, load or sample_ids; the faults are
listed in FAULTS. With `pid_dir`, the processes a fault leaves behind write their PIDs there,
one file per process, so that tests can check that nothing is left running.
"""

from __future__ import annotations

import faulthandler
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainparity as tp

PHASES = ("setup", "batches", "step", "save", "load", "sample_ids")
FAULTS = (
    "raise", "hang", "exit", "sigkill", "sigsegv", "sys_exit_0", "grandchild_hangs", "grandchild_left",
    "ignores_sigterm", "huge_message", "escape_codes", "huge_output", "reads_stdin", "secret_on_disk",
)
#: faults after which the run goes on normally (the check can PASS)
BENIGN = ("grandchild_left", "huge_output", "reads_stdin", "secret_on_disk")
#: faults that never end by themselves (the check's timeout ends them)
HANGING = ("hang", "grandchild_hangs", "ignores_sigterm")
#: the environment variable whose value must never be found in a file under the temporary directory
SECRET_VARIABLE = "TRAINPARITY_TEST_SECRET"


def _record(pid_dir: str | None, *pids: int) -> None:
    if pid_dir is not None:
        with open(pathlib.Path(pid_dir) / f"{os.getpid()}.pids", "a") as file:
            file.write(" ".join(map(str, pids)) + "\n")


def recorded_pids(pid_dir: str | pathlib.Path) -> list[int]:
    """Every PID that the recipe's processes recorded in `pid_dir`."""
    return [int(pid) for path in pathlib.Path(pid_dir).glob("*.pids") for pid in path.read_text().split()]


def _secret_in_temporary_files() -> bool:
    secret = os.environ.get(SECRET_VARIABLE, "").encode()
    if not secret:
        return False
    # Other checks' scratch directories come and go while this walks them: os.walk skips
    # a directory that vanished (rglob raised FileNotFoundError from a parallel job).
    for directory in pathlib.Path(tempfile.gettempdir()).glob("trainparity-*"):
        for root, _, names in os.walk(directory):
            for name in names:
                try:
                    if secret in (pathlib.Path(root) / name).read_bytes():
                        return True
                except OSError:
                    continue
    return False


def inject(fault: str, pid_dir: str | None) -> None:
    """Do what `fault` says, in this process."""
    if fault == "raise":
        raise RuntimeError("injected fault")
    if fault == "hang":
        _record(pid_dir, os.getpid())
        time.sleep(3600)
    if fault == "exit":
        os._exit(3)
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "sigsegv":
        faulthandler._sigsegv()
    if fault == "sys_exit_0":
        sys.exit(0)
    if fault in ("grandchild_hangs", "grandchild_left"):
        # in a session of its own, so that killing the child's process group does not reach it
        grandchild = subprocess.Popen(["sleep", "600"], start_new_session=True)
        _record(pid_dir, os.getpid(), grandchild.pid)
        if fault == "grandchild_hangs":
            time.sleep(3600)
    if fault == "ignores_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _record(pid_dir, os.getpid())
        time.sleep(3600)
    if fault == "huge_message":
        raise ValueError("x" * 5_000_000)
    if fault == "escape_codes":
        raise ValueError("\x1b[31mred\x1b[0m and a bell\x07")
    if fault == "huge_output":
        sys.stdout.write("x" * 5_000_000 + "\n")
        sys.stdout.flush()
    if fault == "reads_stdin":
        if sys.stdin.read() != "":
            raise RuntimeError("stdin held data")
    if fault == "secret_on_disk" and _secret_in_temporary_files():
        raise RuntimeError("the environment was found in a temporary file")


class Faulty(tp.Recipe):
    def __init__(self, fault: str | None = None, phase: str = "step", pid_dir: str | None = None,
                 accumulation_steps: int = 1) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        self.fault = fault
        self.phase = phase
        self.pid_dir = pid_dir
        self.accumulation_steps = accumulation_steps

    def _maybe(self, phase: str) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        if self.fault is not None and phase == self.phase and (not distributed or dist.get_rank() == 1):
            inject(self.fault, self.pid_dir)

    def setup(self) -> tp.State:
        self._maybe("setup")
        model: nn.Module = nn.Linear(3, 1).double()
        if dist.is_available() and dist.is_initialized():
            model = DistributedDataParallel(model)
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), micro=0)

    def batches(self, state: tp.State) -> Iterator[Any]:
        self._maybe("batches")
        generator = torch.Generator().manual_seed(3)
        features = torch.randn(64, 3, generator=generator, dtype=torch.float64)
        targets = torch.randn(64, 1, generator=generator, dtype=torch.float64)
        world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
        cursor = state.micro  # a resumed run goes on where the checkpoint was taken
        while True:
            ids = ((torch.arange(8) + 8 * cursor) % 64)[rank::world]
            yield ids, features[ids], targets[ids]
            cursor += 1

    def sample_ids(self, batch: Any) -> torch.Tensor:
        self._maybe("sample_ids")
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        self._maybe("step")
        _, x, y = batch
        loss = nn.functional.mse_loss(state.model(x), y) / self.accumulation_steps
        loss.backward()  # type: ignore[no-untyped-call]
        state.micro += 1
        if state.micro % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
        return loss.detach()

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        self._maybe("save")
        super().save(state, path)

    def load(self, path: pathlib.Path) -> tp.State:
        self._maybe("load")
        return super().load(path)


class TwoFaults(Faulty):
    """`fault`, then `then`, where and when Faulty would inject each: one check serves the tests of both faults
    (a check under spawn costs seconds of interpreters importing torch)."""

    def __init__(self, fault: str, then: str, phase: str = "step", pid_dir: str | None = None) -> None:
        super().__init__(fault, phase, pid_dir)
        self.then = Faulty(then, phase, pid_dir)

    def _maybe(self, phase: str) -> None:
        super()._maybe(phase)
        self.then._maybe(phase)


class WithRngEntry(Faulty):
    """A State entry named `rng` (a tensor), which `forget=True` does not restore on load."""

    def __init__(self, forget: bool = False) -> None:
        super().__init__()
        self.forget = forget

    def setup(self) -> tp.State:
        state = super().setup()
        state.rng = torch.zeros(2, dtype=torch.float64)
        return state

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        state.rng += 1
        return super().step(state, batch)

    def load(self, path: pathlib.Path) -> tp.State:
        state = super().load(path)
        if self.forget:
            state.rng = torch.zeros(2, dtype=torch.float64)
        return state


class WithOpaqueEntry(Faulty):
    """A State entry trainparity cannot see into: a bare object()."""

    def setup(self) -> tp.State:
        state = super().setup()
        state.blob = object()
        return state

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        tp.save_state(tp.State(model=state.model, optimizer=state.optimizer, micro=state.micro), path)

    def load(self, path: pathlib.Path) -> tp.State:
        state = self.setup()
        loaded = tp.load_state(tp.State(model=state.model, optimizer=state.optimizer, micro=state.micro), path)
        state.micro = loaded.micro
        return state


class CorruptsItsTrace(Faulty):
    """Its child writes output the parent cannot decode (`kind`: "fields" or "nested")."""

    def __init__(self, kind: str = "fields") -> None:
        super().__init__()
        self.kind = kind

    def setup(self) -> tp.State:
        from trainparity._resume import _trace

        nested: list[Any] = []
        for _ in range(100_000):
            nested = [nested]
        bad = {"steps": [{"step": "one"}]} if self.kind == "fields" else {"steps": nested}
        _trace.RunTrace = lambda *args, **kwargs: bad  # type: ignore[misc, assignment]
        return super().setup()


def _first(iterator: Iterator[int]) -> Iterator[int]:
    yield next(iterator)


class StopsInStep(tp.Recipe):
    """`step()` reads an exhausted iterator at its second call (StopIteration); with `own_generator`, inside a
    generator of its own, which Python turns into 'RuntimeError: generator raised StopIteration'; with
    `in_batches`, `batches()` (a generator) does, at its second batch."""

    def __init__(self, own_generator: bool = False, in_batches: bool = False) -> None:
        self.own_generator, self.in_batches = own_generator, in_batches

    def setup(self) -> tp.State:
        model = nn.Linear(4, 1)
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=0)

    def batches(self, state: tp.State) -> Iterator[torch.Tensor]:
        yield torch.ones(8, 4)
        if self.in_batches:
            next(iter([]))
        while True:
            yield torch.ones(8, 4)

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        if state.step == 1 and not self.in_batches:
            empty: Iterator[int] = iter([])
            if self.own_generator:
                list(_first(empty))
            else:
                next(empty)
        loss = state.model(batch).pow(2).mean()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.step += 1
        return loss.detach()
