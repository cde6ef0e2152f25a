"""Recipes whose State holds a random stream object (numpy's or Python's) that `step()` draws from, or a numpy
array of a dtype torch lacks."""

from __future__ import annotations

import pathlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

import trainparity as tp

#: a stream object as a recipe builds it, and one draw from it as a float
STREAMS: dict[str, tuple[Any, Any]] = {
    "numpy_generator": (lambda: np.random.default_rng(0), lambda rng: rng.normal()),
    "numpy_philox": (lambda: np.random.Generator(np.random.Philox(0)), lambda rng: rng.normal()),
    "numpy_random_state": (lambda: np.random.RandomState(0), lambda rng: rng.normal()),
    "python_random": (lambda: random.Random(0), lambda rng: rng.gauss(0.0, 1.0)),
}


class Noisy(tp.Recipe):
    """A linear model trained on inputs with noise drawn from `state.rng` (`stream=` one of STREAMS), beside
    arrays of strings and of objects; the default checkpoint (`tp.save_state`)."""

    def __init__(self, stream: str = "numpy_generator") -> None:
        self.stream = stream

    def setup(self) -> tp.State:
        model = nn.Linear(4, 1)
        build, _ = STREAMS[self.stream]
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), rng=build(),
                        labels=np.array(["cat", "dog"]), tags=np.array([{"a": 1}, None, [2, 3]], dtype=object),
                        step=0)

    def batches(self, state: tp.State) -> Iterator[torch.Tensor]:
        while True:
            yield torch.randn(8, 4, generator=torch.Generator().manual_seed(state.step))

    def step(self, state: tp.State, batch: torch.Tensor) -> torch.Tensor:
        _, draw = STREAMS[self.stream]
        loss = state.model(batch + float(draw(state.rng))).pow(2).mean()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.step += 1
        return loss.detach()


class ForgetsStream(Noisy):
    """Its own checkpoint: the model, the optimizer and the step, not the stream."""

    def save(self, state: tp.State, path: pathlib.Path) -> None:
        torch.save({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
                    "step": state.step}, path)

    def load(self, path: pathlib.Path) -> tp.State:
        state = self.setup()
        checkpoint = torch.load(path)
        state.model.load_state_dict(checkpoint["model"])
        state.optimizer.load_state_dict(checkpoint["optimizer"])
        state.step = checkpoint["step"]
        return state
