"""Recipes for the resume tests: one clean training loop and its faults, written for this project.

`ResumeRecipe(fault=...)` trains a small MLP with AdamW, a warmup scheduler, a CPU
GradScaler, dropout (torch RNG), numpy noise and python-random feature flips, an EMA
tensor, a step counter and a module attribute outside the state_dict, in float64 so that the
values its reports print are the same under every CPU's kernels. Its `save`/`load`
use `tp.save_state`/`tp.load_state`; each fault then loses exactly one thing on load.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from typing import Any

import numpy as np
import torch
from torch import nn

import trainparity as tp

DATASET = 40
BATCH = 4
#: set in the parent by the isolation test; a fresh child must see the initial value
IMPORT_MARKER = {"value": "initial"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.dropout = nn.Dropout(0.25)
        self.head = nn.Linear(8, 1)
        #: a plain attribute outside the state_dict that the forward pass depends on
        self.temperature = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.relu(self.body(x)))) / self.temperature


class ResumeRecipe(tp.Recipe):
    FAULTS = (
        None, "model", "optimizer", "scheduler", "scaler", "rng.torch", "rng.numpy", "rng.python", "counter",
        "ema", "attribute", "optimizer2", "data_replay", "data_skip", "rng_consumed", "nondeterministic",
        "raises", "hangs", "dies", "load_returns_dict", "eval_after_load", "eval_after_load_train_in_step",
    )

    def __init__(
        self,
        fault: str | None = None,
        use_python_random: bool = True,
        two_optimizers: bool = False,
        pid_dir: str | None = None,
    ):
        if fault not in self.FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        self.fault = fault
        self.use_python_random = use_python_random
        self.two_optimizers = two_optimizers or fault == "optimizer2"
        #: where "hangs" writes the PIDs of its process and of a grandchild, for the leak test
        self.pid_dir = pid_dir

    def setup(self) -> tp.State:
        model = Net().double()
        if self.fault == "nondeterministic":
            with torch.no_grad():
                model.head.bias.fill_(int.from_bytes(os.urandom(4), "little") / 2**32)  # differs every run
        if self.two_optimizers:
            optimizer: torch.optim.Optimizer = torch.optim.SGD(model.body.parameters(), lr=0.05, momentum=0.9)
            extra = {"optimizer2": torch.optim.AdamW(model.head.parameters(), lr=0.01)}
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
            extra = {}
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
        return tp.State(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2),
            ema=torch.zeros(1, dtype=torch.float64),
            global_step=0,
            **extra,
        )

    def batches(self, state: tp.State) -> Any:
        generator = torch.Generator().manual_seed(7)
        features = torch.randn(DATASET, 6, generator=generator, dtype=torch.float64)
        targets = torch.randn(DATASET, 1, generator=generator, dtype=torch.float64)
        if self.fault == "rng_consumed":
            torch.randint(0, 10, (1,))  # like a new DataLoader iterator drawing its base seed
        cursor = state.global_step
        if self.fault == "data_replay":
            cursor = 0
        elif self.fault == "data_skip" and cursor > 0:
            cursor += 1
        while True:
            ids = torch.arange(cursor * BATCH, cursor * BATCH + BATCH) % DATASET
            yield ids, features[ids], targets[ids]
            cursor += 1

    def sample_ids(self, batch: Any) -> torch.Tensor:
        ids: torch.Tensor = batch[0]
        return ids

    def step(self, state: tp.State, batch: Any) -> torch.Tensor:
        _, x, y = batch
        if self.fault == "eval_after_load_train_in_step":
            state.model.train()  # as loops over a model loaded in eval (transformers' from_pretrained) do
        if self.fault == "raises" and state.global_step == 1:
            raise ValueError("boom at step 2")
        if self.fault == "hangs" and state.global_step == 1:
            grandchild = subprocess.Popen(["sleep", "600"])
            if self.pid_dir is not None:
                with open(os.path.join(self.pid_dir, f"{os.getpid()}.pids"), "w") as file:
                    file.write(f"{os.getpid()} {grandchild.pid}\n")
            time.sleep(600)
        if self.fault == "dies" and state.global_step == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        x = x + torch.from_numpy(np.random.normal(0.0, 0.1, size=tuple(x.shape)))
        flip = random.random() < 0.5  # drawn always; used only when use_python_random
        if self.use_python_random and flip:
            x = -x
        optimizers = [state.optimizer] + ([state.optimizer2] if "optimizer2" in state else [])
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss = nn.functional.mse_loss(state.model(x), y)
        state.scaler.scale(loss).backward()
        for optimizer in optimizers:
            state.scaler.step(optimizer)
        state.scaler.update()
        state.scheduler.step()
        with torch.no_grad():
            state.ema.mul_(0.9).add_(0.1 * loss.detach())
        state.model.temperature = 1.0 + 0.1 * state.global_step
        state.global_step += 1
        return loss

    def load(self, path: Any) -> Any:
        if self.fault == "load_returns_dict":
            return {"model": None}
        state = self.setup()
        fresh = {
            "model": {k: v.clone() for k, v in state.model.state_dict().items()},
            "rng.torch": torch.get_rng_state(),
            "rng.numpy": np.random.get_state(),
            "rng.python": random.getstate(),
        }
        lost = {
            "optimizer": lambda: state.optimizer.state_dict(),
            "optimizer2": lambda: state.optimizer2.state_dict(),
            "scheduler": lambda: state.scheduler.state_dict(),
            "scaler": lambda: state.scaler.state_dict(),
        }
        kept = lost[self.fault]() if self.fault in lost else None
        tp.load_state(state, path)
        if self.fault == "model":
            state.model.load_state_dict(fresh["model"])
        elif self.fault in lost:
            getattr(state, self.fault).load_state_dict(kept)
        elif self.fault == "rng.torch":
            torch.set_rng_state(fresh["rng.torch"])
        elif self.fault == "rng.numpy":
            np.random.set_state(fresh["rng.numpy"])
        elif self.fault == "rng.python":
            random.setstate(fresh["rng.python"])
        elif self.fault == "counter":
            state.global_step = 0
        elif self.fault == "ema":
            state.ema.zero_()
        elif self.fault == "attribute":
            state.model.temperature = 1.0
        if self.fault in ("eval_after_load", "eval_after_load_train_in_step"):
            state.model.eval()
        return state


def report_identity(payload: Any, workdir: Any) -> dict[str, Any]:
    """An engine task: what a child sees of its process and of this module's state."""
    import sys

    return {
        "pid": os.getpid(),
        "marker": IMPORT_MARKER["value"],
        "main_imported": "resume_recipes" in sys.modules,
        "workdir": str(workdir),
    }


class ForgetsScheduler(ResumeRecipe):
    """For the command line, which names recipes by class: loses the scheduler on load."""

    def __init__(self) -> None:
        super().__init__(fault="scheduler")


class Nondeterministic(ResumeRecipe):
    def __init__(self) -> None:
        super().__init__(fault="nondeterministic")


class Raises(ResumeRecipe):
    def __init__(self) -> None:
        super().__init__(fault="raises")
