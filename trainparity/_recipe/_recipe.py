"""`Recipe`: the user's training semantics, and how every check calls it.

The checks call a recipe only through what is here: its batches (closed on exit), one step's
loss read as a number, and the State its `setup()` or `load()` returned, so that a recipe that
breaks its contract fails the same way in every check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, Generic, Self

import numpy as np
import torch
from typing_extensions import TypeVar

from trainparity._state._checkpoint import load_state, save_state
from trainparity._state._entries import State


@dataclasses.dataclass(frozen=True)
class LossAccounting:
    """What `Recipe.step` may return instead of a bare loss, declaring how it was normalized.

    `numerator` is, say, the masked token-loss sum of the micro-batch and `denominator`
    the token count; only when a recipe returns this is the `loss_accounting` phase of
    the accumulation check judged.
    """

    value: torch.Tensor | float
    numerator: torch.Tensor | float | None = None
    denominator: torch.Tensor | float | None = None


#: the State type of a recipe: `tp.Recipe[MyState]` types `setup`, `step`, `batches`, `save` and `load`
S = TypeVar("S", bound=State, default=State)


class Recipe(Generic[S]):
    """Subclass this to state your training semantics (see docs/api.md).

    The constructor takes configuration only (picklable values): the harness rebuilds the
    recipe in fresh processes from its class and these arguments. `tp.Recipe[MyState]`,
    with `MyState` a `tp.State` subclass that annotates its entries, types the state that
    `setup` returns and the other methods receive.
    """

    _tp_init_args: tuple[tuple[Any, ...], dict[str, Any]]
    #: the dtype the recipe means its matmuls, convolutions and attention to run in under autocast
    #: (`torch.bfloat16` or `torch.float16`), or None; `check_mixed_precision` fails a run in which none did
    autocast_dtype: ClassVar[torch.dtype | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        self = super().__new__(cls)
        self._tp_init_args = (args, kwargs)
        return self

    def setup(self) -> S:
        """Build everything from scratch; the harness has seeded torch, numpy and random."""
        raise NotImplementedError(f"{type(self).__name__} must define setup(self) -> tp.State")

    def batches(self, state: S) -> Iterable[Any]:
        """The batches to train on; by default `state.loader`, epoch after epoch.

        A sampler with `set_epoch` (DistributedSampler, also behind a batch sampler) is told each
        epoch's number.
        """
        if "loader" not in state:
            raise NotImplementedError(
                f"{type(self).__name__} has no State entry 'loader': define batches(self, state)"
            )
        return _epochs(state.loader)

    def step(self, state: S, batch: Any) -> torch.Tensor | float | LossAccounting | None:
        """Train on one batch and return its loss; None on the ranks of a pipeline that compute none (the parallel
        check compares no losses; the checks that do ask for one)."""
        raise NotImplementedError(f"{type(self).__name__} must define step(self, state, batch)")

    def sample_ids(self, batch: Any) -> Sequence[int | str] | torch.Tensor | None:
        """The IDs of the samples in `batch`; None (the default) leaves the data stream unchecked."""
        return None

    def save(self, state: S, path: pathlib.Path) -> None:
        """Your checkpoint code; by default `tp.save_state`, one file per rank in a world of ranks."""
        save_state(state, _rank_file(path))

    def load(self, path: pathlib.Path) -> S:
        """Your resume code; by default `setup()` then `tp.load_state` (in a world of ranks, the rank's own file)."""
        return load_state(self.setup(), _rank_file(path))


def _rank_file(path: pathlib.Path) -> pathlib.Path:
    """The default checkpoint's file: `path`, or `path.rank<r>` in an initialized world of several ranks (whose
    ranks each hold their own loader position and RNG state)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return path.with_name(f"{path.name}.rank{dist.get_rank()}")
    return path


def set_sampler_epoch(source: object, epoch: int) -> None:
    """Call `set_epoch(epoch)` on the first of `source`, its `.sampler`, its `.batch_sampler` or its
    `.batch_sampler.sampler` that has one (a DistributedSampler behind a DataLoader), as a training loop does."""
    batch_sampler = getattr(source, "batch_sampler", None)
    for target in (source, getattr(source, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        set_epoch = getattr(target, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """`set_sampler_epoch`, then `set_epoch(epoch)` on the loader's dataset where it has one, as a training loop
    over a DataLoader whose dataset draws per epoch does."""
    set_sampler_epoch(loader, epoch)
    set_epoch = getattr(getattr(loader, "dataset", None), "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def _epochs(loader: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        set_sampler_epoch(loader, epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return
        epoch += 1


@contextlib.contextmanager
def batch_iterator(recipe: Recipe[Any], state: State) -> Iterator[Iterator[Any]]:
    """`iter(recipe.batches(state))`, closed on exit: a generator over a DataLoader stops its workers now,
    not at garbage collection."""
    batches = iter(recipe.batches(state))
    try:
        yield batches
    finally:
        close = getattr(batches, "close", None)
        if callable(close):
            close()


def loss_value(loss: Any, where: str) -> float | None:
    if isinstance(loss, LossAccounting):
        loss = loss.value
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise TypeError(f"{where}: step() must return a scalar loss, got a tensor of shape {list(loss.shape)}")
        if loss.is_complex():
            raise TypeError(f"{where}: step() must return a real loss, got a {loss.dtype} tensor")
        return float(loss.detach().reshape(()).item())
    if isinstance(loss, (int, float, np.floating, np.integer)) and not isinstance(loss, bool):
        return float(loss)
    raise TypeError(
        f"{where}: step() must return a loss (tensor or float) or tp.LossAccounting, got {type(loss).__name__}"
    )


def require_state(state: Any, recipe: Recipe, method: str) -> State:
    if not isinstance(state, State):
        raise TypeError(f"{type(recipe).__name__}.{method}() must return a tp.State, got {type(state).__name__}")
    return state


def next_batch(batches: Iterator[Any], recipe: Recipe, at: str) -> Any:
    """The next batch; a recipe whose batches() runs out before the check is done raises, saying where."""
    try:
        return next(batches)
    except StopIteration:
        raise RuntimeError(f"{type(recipe).__name__}.batches() ran out of batches at {at}") from None
