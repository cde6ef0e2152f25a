"""The walk over State entries: snapshots and the reference checkpoint see the same components."""

from __future__ import annotations

import pathlib
import random

import numpy as np
import pytest
import torch

import trainparity as tp
from trainparity._state._compare import EXACT, compare_snapshots
from trainparity._state._snapshot import snapshot_rng, snapshot_state

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


class Counter:
    """A user object without state_dict(): its public plain attributes and generators are state."""

    def __init__(self) -> None:
        self.n = 0
        self.history = [torch.zeros(2)]
        self.generator = torch.Generator().manual_seed(1)


def make_state() -> tp.State:
    student, teacher = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    optimizers = [torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9), torch.optim.Adam(teacher.parameters())]
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2, shuffle=True,
                                         generator=torch.Generator().manual_seed(3))
    return tp.State(models=[student, teacher], optimizers=optimizers, counter=Counter(), loader=loader,
                    array=np.arange(3), meta={"lr": 0.1}, ema=torch.zeros(2), step=0)


def train_a_little(state: tp.State) -> None:
    for optimizer in state.optimizers:
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                parameter.grad = torch.ones_like(parameter)
        optimizer.step()
    state.counter.n = 5
    state.counter.history[0] += 1
    torch.rand(1, generator=state.counter.generator)
    next(iter(state.loader))
    state.array[0] = 7
    state.meta["lr"] = 0.2
    state.ema += 1
    state.step = 3
    state.models[0].temperature = 0.5


def test_snapshot_paths() -> None:
    state = make_state()
    train_a_little(state)
    paths = set(snapshot_state(state))
    assert {
        "models.0.weight", "models.0.temperature", "optimizers.0.state.models.0.weight.momentum_buffer",
        "optimizers.1.state.models.1.bias.exp_avg", "optimizers.0.param_groups.0.lr", "counter.n",
        "counter.history.0", "counter.generator", "loader.generator", "array", "meta.lr", "ema", "step",
    } <= paths
    assert not any(path.startswith(("loader.dataset", "loader.sampler.data_source")) for path in paths)
    assert not any(path.startswith("rng.") for path in paths)
    assert {"rng.torch", "rng.numpy", "rng.python"} <= set(snapshot_rng())


def test_save_and_load_restore_every_component(tmp_path: pathlib.Path) -> None:
    state = make_state()
    train_a_little(state)
    random.random()
    np.random.rand()
    saved = {**snapshot_state(state), **snapshot_rng()}
    tp.save_state(state, tmp_path / "checkpoint")
    torch.manual_seed(99)
    fresh = make_state()
    ema = fresh.ema
    loaded = tp.load_state(fresh, tmp_path / "checkpoint")
    assert loaded is fresh and fresh.ema is ema  # tensors are restored in place
    assert [m.path for m in compare_snapshots(saved, {**snapshot_state(fresh), **snapshot_rng()}, EXACT)] == []


def test_checkpoint_needs_no_unpickling(tmp_path: pathlib.Path) -> None:
    state = make_state()
    tp.save_state(state, tmp_path / "checkpoint")
    document = torch.load(tmp_path / "checkpoint", weights_only=True)
    assert document["format"] == "trainparity.save_state/2"


def test_misuse() -> None:
    with pytest.raises(ValueError, match="must not start with '_'"):
        tp.State(_hidden=1)
    with pytest.raises(AttributeError, match=r"State has no entry 'loader'; it has \['model'\]"):
        tp.State(model=1).loader  # noqa: B018
    with pytest.raises(TypeError, match="takes a tp.State"):
        tp.save_state({"model": 1}, "x")  # type: ignore[arg-type]
    state = tp.State(model=torch.nn.Linear(1, 1))
    assert list(state) == ["model"] and "model" in state and len(state) == 1
    assert repr(state) == "State(model=Linear)"


def test_load_rejects_foreign_files(tmp_path: pathlib.Path) -> None:
    torch.save({"something": 1}, tmp_path / "other")
    with pytest.raises(ValueError, match="was not written by tp.save_state"):
        tp.load_state(tp.State(x=1), tmp_path / "other")


def test_default_batches_set_the_epoch_on_a_sampler_behind_a_batch_sampler() -> None:
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    dataset = list(range(16))
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_sampler=BatchSampler(sampler, batch_size=16, drop_last=False))
    batches = iter(tp.Recipe().batches(tp.State(loader=loader)))
    first, second = next(batches).tolist(), next(batches).tolist()
    assert sorted(first) == sorted(second) == dataset
    assert first != second  # epoch 1 was shuffled with seed + 1, as a training loop's set_epoch(1) asks
