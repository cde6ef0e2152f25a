"""The activation-checkpoint regions of a run (`torch.utils.checkpoint`), as the equivalence check's diagnoses read
them: how each region was entered (reentrant, RNG state preserved, inputs that need a gradient), which modules ran
inside it, whether its forward drew random numbers, and which modules ran again, in training mode, when backward
recomputed it.

`checkpoint()` is seen through what it calls, not itself: a model that bound it before the run (transformers keeps
`functools.partial(checkpoint, ...)` from `gradient_checkpointing_enable()`) calls the same function, which looks
up `CheckpointFunction` (reentrant) and `_checkpoint_without_reentrant_generator` (`..._impl` from torch 2.15 on)
in its module at each call. Where a torch has none of these names, nothing is observed and the divergence is
reported without a checkpoint cause.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from trainparity._observe._hooks import Watch
from trainparity._observe._watches import named_modules
from trainparity._state._entries import State, parameter_names


@dataclasses.dataclass
class CheckpointRegion:
    """One activation-checkpointed region, as often as it was entered alike (the same modules, entered the same way)."""

    #: module paths (`model.blocks.0`) whose forward ran inside the region
    modules: list[str]
    reentrant: bool
    preserve_rng_state: bool
    #: some tensor input of the region needed a gradient (a reentrant region whose inputs need none gives its
    #: parameters no gradient)
    inputs_need_grad: bool
    #: the region's forward advanced the global torch generator (it drew dropout masks)
    drew_random: bool = False
    #: buffer paths (`model.bn.running_mean`) of modules that ran again in training mode when backward recomputed
    #: the region: their updates happened twice
    recomputed_buffers: list[str] = dataclasses.field(default_factory=list)
    #: names of the parameters of the modules inside and of their submodules, in the vocabulary of `parameter_names`
    #: (`gradients.<name>`)
    parameters: list[str] = dataclasses.field(default_factory=list)


def _tensors(values: Iterator[Any]) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(iter(value))
        elif isinstance(value, dict):
            yield from _tensors(iter(value.values()))


def _graph_task() -> int:
    """The running backward's graph task, -1 outside backward (a recomputation runs inside one)."""
    current: Callable[[], int] | None = getattr(torch._C, "_current_graph_task_id", None)
    return current() if current is not None else -1


class _Reentrant:
    """Stands in for `torch.utils.checkpoint.CheckpointFunction` while observed: `apply` enters a region."""

    def __init__(self, original: Any, watch: CheckpointRegions) -> None:
        self.original, self.watch = original, watch

    def apply(self, function: Any, preserve: bool, *args: Any) -> Any:
        with self.watch.region(True, bool(preserve), args):
            return self.original.apply(function, preserve, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


class CheckpointRegions(Watch):
    """Watch: the State's activation-checkpoint regions (`regions`), merged across calls."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.modules = named_modules(state)
        names = parameter_names(state)
        # a module's submodules' parameters too: nn.MultiheadAttention uses out_proj's weight without calling it
        self._parameters = {id(m): [names[id(p)] for p in m.parameters() if id(p) in names] for _, m in self.modules}
        self._paths = {id(m): path for path, m in self.modules}
        self.regions: list[CheckpointRegion] = []
        #: the module paths of each region whose forward is running (nested regions each get them)
        self.open: list[set[str]] = []
        #: module id -> the regions it ran inside (a recomputation is that module running again in backward)
        self._inside: dict[int, list[CheckpointRegion]] = {}
        self._hooked = False

    def _install(self) -> None:
        reentrant = getattr(torch_checkpoint, "CheckpointFunction", None)
        if reentrant is not None:
            self._replace("CheckpointFunction", reentrant, _Reentrant(reentrant, self))
        # torch 2.15 calls `_checkpoint_without_reentrant_generator_impl(fn, args, kwargs, *, preserve_rng_state)`;
        # earlier releases `_checkpoint_without_reentrant_generator(fn, preserve_rng_state, ..., *args, **kwargs)`
        generator = getattr(torch_checkpoint, "_checkpoint_without_reentrant_generator_impl", None)
        if generator is not None:
            self._replace("_checkpoint_without_reentrant_generator_impl", generator,
                          functools.partial(self._non_reentrant_impl, generator))
            return
        generator = getattr(torch_checkpoint, "_checkpoint_without_reentrant_generator", None)
        if generator is not None:
            self._replace("_checkpoint_without_reentrant_generator", generator,
                          functools.partial(self._non_reentrant, generator))

    def _replace(self, name: str, original: object, replacement: object) -> None:
        setattr(torch_checkpoint, name, replacement)
        self._stack.callback(setattr, torch_checkpoint, name, original)

    def _non_reentrant(self, original: Callable[..., Iterator[None]], function: Any, preserve: bool = True,
                       *args: Any, **kwargs: Any) -> Iterator[None]:
        # checkpoint() runs the region's forward between the generator's first and second step
        with self.region(False, bool(preserve), (*args, *kwargs.values())):
            yield from original(function, preserve, *args, **kwargs)

    def _non_reentrant_impl(self, original: Callable[..., Iterator[None]], function: Any, args: tuple[Any, ...],
                            kwargs: dict[str, Any], **options: Any) -> Iterator[None]:
        with self.region(False, bool(options.get("preserve_rng_state", True)), (*args, *kwargs.values())):
            yield from original(function, args, kwargs, **options)

    def _hook_modules(self) -> None:
        """Forward pre-hooks on the State's modules, from the first region on (a run that checkpoints nothing keeps
        its modules unhooked, as torch.compile sees them)."""
        self._hooked = True
        for _, module in self.modules:
            self._stack.callback(module.register_forward_pre_hook(self._forward).remove)

    def region(self, reentrant: bool, preserve: bool, args: tuple[Any, ...]) -> _Region:
        """A region being entered, as a context manager around its forward."""
        if not self._hooked:
            self._hook_modules()
        needs_grad = any(t.requires_grad for t in _tensors(iter(args)))
        return _Region(self, CheckpointRegion([], reentrant, preserve, needs_grad))

    def _forward(self, module: nn.Module, args: Any) -> None:
        path = self._paths[id(module)]
        if self.open:
            for paths in self.open:
                paths.add(path)
        elif module.training and _graph_task() != -1:  # backward recomputes a region
            for region in self._inside.get(id(module), []):
                region.recomputed_buffers += [f"{path}.{name}" for name, _ in module.named_buffers(recurse=False)
                                              if f"{path}.{name}" not in region.recomputed_buffers]

    def close(self, region: CheckpointRegion, paths: set[str], drew: bool) -> None:
        """A region's forward ended: recorded, or merged into a region entered alike before."""
        region.modules, region.drew_random = sorted(paths), drew
        region.parameters = sorted({name for path, m in self.modules if path in paths
                                    for name in self._parameters[id(m)]})
        same = next((r for r in self.regions if (r.modules, r.reentrant, r.preserve_rng_state, r.inputs_need_grad)
                     == (region.modules, region.reentrant, region.preserve_rng_state, region.inputs_need_grad)), None)
        if same is None:
            self.regions.append(region)
            same = region
        same.drew_random = same.drew_random or drew
        for path, m in self.modules:
            if path in paths and same not in self._inside.setdefault(id(m), []):
                self._inside[id(m)].append(same)


class _Region:
    """One entry of a region: the modules that run inside it, and whether it draws from the global generator."""

    def __init__(self, watch: CheckpointRegions, record: CheckpointRegion) -> None:
        self.watch, self.record = watch, record
        self.paths: set[str] = set()
        self.rng = torch.empty(0)

    def __enter__(self) -> None:
        self.rng = torch.random.get_rng_state()
        self.watch.open.append(self.paths)

    def __exit__(self, *exc_info: object) -> None:
        self.watch.open.pop()  # regions nest: the last one entered ends first
        self.watch.close(self.record, self.paths, not torch.equal(torch.random.get_rng_state(), self.rng))
