"""The child of the data-parallel check: one rank of the world under test, or the reference (world size 1).

It joins the process group before the recipe's `setup()` (a file store in the check's scratch
directory), then records each step: the batch's sample IDs, the gradients at the optimizer step
(the one observer of optimizer steps), the parameters after the step, and what its modules
returned (forward hooks, removed afterwards), in the order the modules finished.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainparity._batches._sample_ids import normalize_sample_ids
from trainparity._observe._hooks import HookSet, patch_functions
from trainparity._observe._observer import Observer
from trainparity._observe._watches import BatchDependentModules, Float64Only
from trainparity._parallel._megatron import marked_slices
from trainparity._parallel._mesh import find_mesh, parallelism
from trainparity._parallel._trace import ModuleOutput, RankStep, RankTrace, Reduction, WorldTrace
from trainparity._process._child import error_record
from trainparity._process._threads import RankFailure, ThreadedWorld
from trainparity._process._world import World, join, leave
from trainparity._recipe._recipe import Recipe, next_batch, require_state
from trainparity._recipe._reference import RecipeRef
from trainparity._results._violation import ChildError
from trainparity._state._compare import Snapshot
from trainparity._state._entries import module_prefixes, state_objects
from trainparity._state._precision import cast_batch, convert_state, running_in
from trainparity._state._rng import seed_everything
from trainparity._state._snapshot import to_leaf
from trainparity._state._tensors import gathered

REFERENCE = "reference"


#: a recorded module output keeps every k-th element, at most this many: enough to see a partial sum
OUTPUT_SAMPLE = 4096


#: module outputs a process records over the whole run (the first ones in forward order, from step 1 on):
#: at most OUTPUT_LIMIT * OUTPUT_SAMPLE float64 values, 16 MiB, whatever the model's size. A count rather than
#: a size, so that every rank stops at the same output and gathers (collectives) the same DTensors.
OUTPUT_LIMIT = 512


@dataclasses.dataclass(frozen=True)
class RankPayload:
    """One process of the check: a rank of the world under test, or the reference (world size 1)."""

    recipe: RecipeRef
    seed: int
    steps: int
    backend: str
    rank: int
    world_size: int
    #: "rank 0", ..., or "reference": names this process's files in `scratch`
    tag: str
    #: the check's scratch directory (owned by the parent): the file stores
    scratch: str
    precision: str


def run_rank(payload: RankPayload, workdir: pathlib.Path) -> RankTrace:
    """Child task: join the process group, run the recipe, record each step. When a rank fails, the
    others' collectives break and they fail too: the engine reports the failure that came first."""
    store = pathlib.Path(payload.scratch) / ("store.reference" if payload.tag == REFERENCE else "store.ranks")
    join(World(payload.backend, payload.rank, payload.world_size, str(store)))
    with running_in(payload.precision):
        trace, kept = train_rank(payload)
    leave(*kept)
    return trace


def run_threads(payload: RankPayload, workdir: pathlib.Path) -> WorldTrace:
    """Child task: the whole world of `payload.world_size` ranks, each a thread of this process (the reference is a
    world of one thread), each rank as `run_rank` runs it."""

    def rank(number: int) -> RankTrace:
        world.join()
        trace, kept = train_rank(dataclasses.replace(payload, rank=number))
        leave(*kept)
        return trace

    world = ThreadedWorld(payload.world_size, rank)
    with running_in(payload.precision):  # process-wide: set once for every rank
        try:
            return WorldTrace(world.run(), None)
        except RankFailure as failure:
            reference = payload.tag == REFERENCE
            return WorldTrace([], ChildError.raised(error_record(failure.error), payload.tag if reference
                                                    else f"rank {failure.rank}", None if reference else failure.rank))


def train_rank(payload: RankPayload) -> tuple[RankTrace, tuple[object, ...]]:
    """Set the recipe up in the world joined, train and record it; the trace, and what must outlive the world
    (`leave`)."""
    recipe = payload.recipe.build()
    seed_everything(payload.seed)
    state = require_state(recipe.setup(), recipe, "setup")
    convert_state(state, payload.precision)
    batch_dependent_modules = BatchDependentModules(state)
    float64_only = [Float64Only(state)] if payload.precision == "float64" else []
    with Observer(state, type(recipe), [batch_dependent_modules, *float64_only]) as observer, \
            OutputRecorder(observer.modules) as outputs, GradientReductions(observer, type(recipe)) as reductions, \
            MicroBatches(type(recipe)) as microbatches:
        steps = list(record_steps(recipe, observer, outputs, reductions, microbatches, payload))
        batch_dependent = sorted(batch_dependent_modules.ran)
        optimizers = len(observer.optimizers)
        layers = owning_layers(observer)
        mesh = find_mesh(observer.modules)
        uses = parallelism(dict(state_objects(state, nn.Module)), mesh)
        slices = marked_slices(observer.parameters())
    return RankTrace(steps, optimizers, batch_dependent, layers, mesh, uses, slices, aliases(observer)), (recipe, state)


def record_steps(recipe: Recipe, observer: Observer, outputs: OutputRecorder, reductions: GradientReductions,
                 microbatches: MicroBatches, payload: RankPayload) -> Iterator[RankStep]:
    """Train `steps` steps; per step the sample IDs, the gradients at the optimizer step, the parameters after,
    the module outputs."""
    name = type(recipe).__name__
    batches = iter(recipe.batches(observer.state))
    for step in range(1, payload.steps + 1):
        batch = cast_batch(next_batch(batches, recipe, f"step {step}"), payload.precision)
        ids = normalize_sample_ids(recipe.sample_ids(batch), f"{name}.sample_ids() at step {step}")
        observer.begin_call(step)
        try:
            recipe.step(observer.state, batch)
        finally:
            call = observer.end_call()
        gradients: Snapshot = {}
        for events in observer.take_step_events().values():
            for event in events:
                gradients.update(event.grads)
        yield RankStep(step, ids, gradients, {n: to_leaf(p) for n, p in observer.parameters()}, outputs.take(),
                       call.clips, reductions.take(), microbatches.take())


def named_layers(modules: Mapping[str, nn.Module]) -> Iterator[tuple[str, str, nn.Module]]:
    """Every submodule of the State's modules: its path, the "path (Class)" reports name it by, and itself."""
    for entry, module in modules.items():
        for sub_name, sub in module.named_modules():
            path = f"{entry}.{sub_name}" if sub_name else entry
            yield path, f"{path} ({type(sub).__name__})", sub


def aliases(observer: Observer) -> dict[str, str]:
    """The other names of the State's parameters (a weight tied to another's) -> the name each is recorded under."""
    found: dict[str, str] = {}
    for _, prefix, module in module_prefixes(observer.state):
        for local, parameter in module.named_parameters(remove_duplicate=False):
            name = observer.names.get(id(parameter))
            if name is not None and prefix + local != name:
                found[prefix + local] = name
    return found


def owning_layers(observer: Observer) -> dict[str, str]:
    """Parameter name -> "path (Class)" of the module that holds it."""
    layers: dict[str, str] = {}
    for _, label, sub in named_layers(observer.modules):
        for parameter in sub.parameters(recurse=False):
            name = observer.names.get(id(parameter))
            if name is not None and name not in layers:
                layers[name] = label
    return layers


class OutputRecorder(HookSet):
    """Forward hooks on every submodule of the State's modules, removed on exit: each floating tensor a module
    returns, in the order the modules finish (inner before outer), until `OUTPUT_LIMIT` outputs are kept.

    A `DTensor` output is gathered with `full_tensor()` (every rank runs the same modules in the same order,
    so the collectives match); a plain tensor is kept as it is, a rank's local shard or partial sum.
    """

    def __init__(self, modules: Mapping[str, nn.Module]) -> None:
        super().__init__()
        self.modules = modules
        self.outputs: list[ModuleOutput] = []
        self.calls: Counter[str] = Counter()
        self.left = OUTPUT_LIMIT

    def _install(self) -> None:
        for path, label, sub in named_layers(self.modules):
            hook = functools.partial(self._record, path, label)
            self._stack.callback(sub.register_forward_hook(hook).remove)

    def _record(self, path: str, module: str, instance: nn.Module, args: Any, output: Any) -> None:
        self.calls[path] += 1
        call = self.calls[path]
        key = path if call == 1 else f"{path}#{call}"
        for suffix, tensor in _output_tensors(output):
            if self.left == 0:
                return
            self.left -= 1
            whole = gathered(tensor.detach())
            stride = max(1, -(-whole.numel() // OUTPUT_SAMPLE))
            values = whole.reshape(-1)[::stride].to("cpu", torch.float64, copy=True)
            self.outputs.append(ModuleOutput(key + suffix, module, list(whole.shape), stride,
                                             values.reshape(whole.shape) if stride == 1 else values))

    def take(self) -> list[ModuleOutput]:
        """The outputs recorded since the last call; module calls count from 1 again."""
        outputs, self.outputs = self.outputs, []
        self.calls.clear()
        return outputs


class GradientReductions(HookSet):
    """The recipe's own `dist.all_reduce` calls on a parameter's gradient (its local tensor for a DTensor), found by
    storage: which parameter, over which global ranks (`Reduction`). Collectives that torch's wrappers (DDP, FSDP)
    make are not seen: they do not go through `torch.distributed.all_reduce`."""

    def __init__(self, observer: Observer, recipe_type: type) -> None:
        super().__init__()
        self.observer, self.recipe_type = observer, recipe_type
        self.reductions: list[Reduction] = []
        #: where each parameter's gradient (a DTensor's local tensor) lives -> the parameter and its name
        self._gradients: dict[int, tuple[str, nn.Parameter]] = {}

    def _install(self) -> None:
        import torch.distributed as dist

        patch_functions(self._stack, self.recipe_type, {dist.all_reduce: "all_reduce"}, self._wrapper,
                        namespaces=[dist, dist.distributed_c10d])

    def _wrapper(self, original: Callable[..., Any], function: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.observer.call is not None and isinstance(tensor, torch.Tensor):
                self._record(tensor, args[1] if len(args) > 1 else kwargs.get("group"))
            return original(tensor, *args, **kwargs)

        return wrapper

    def _record(self, tensor: torch.Tensor, group: Any) -> None:
        import torch.distributed as dist

        if not tensor.numel():
            return
        # the gradients' storages, indexed again only when one is not found (gradients made since): a loop of
        # all-reduces, one per parameter, costs one walk over the parameters, not one each
        found = self._gradients.get(tensor.data_ptr())
        if found is None or _storage(found[1]) != tensor.data_ptr():  # a gradient made, or freed, since
            self._gradients = {pointer: (name, parameter) for name, parameter in self.observer.parameters()
                               if (pointer := _storage(parameter)) is not None}
            found = self._gradients.get(tensor.data_ptr())
        reduced_over = group or dist.group.WORLD
        if found is not None and reduced_over is not None:
            self.reductions.append(Reduction(found[0], sorted(dist.get_process_group_ranks(reduced_over))))

    def take(self) -> list[Reduction]:
        reductions, self.reductions = self.reductions, []
        return reductions


class MicroBatches(HookSet):
    """How many micro-batches the rank's pipeline stages (torch.distributed.pipelining) ran forward in a step: the
    calls of a stage's `forward_one_chunk`, which every schedule makes once per micro-batch (a stage's module runs
    once more in its first step, to infer the shapes it sends, so its forwards do not count them). Nothing is
    patched unless the recipe imported the pipelining stages."""

    def __init__(self, recipe_type: type) -> None:
        super().__init__()
        self.recipe_type = recipe_type
        #: id(stage) -> its forward calls since the last `take`
        self.calls: Counter[int] = Counter()

    def _install(self) -> None:
        module = sys.modules.get("torch.distributed.pipelining.stage")
        base = getattr(module, "_PipelineStageBase", None)
        if base is not None and callable(getattr(base, "forward_one_chunk", None)):
            patch_functions(self._stack, self.recipe_type, {base.forward_one_chunk: "forward_one_chunk"},
                            self._wrapper, namespaces=[base])

    def _wrapper(self, original: Callable[..., Any], function: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(stage: object, *args: Any, **kwargs: Any) -> Any:
            self.calls[id(stage)] += 1
            return original(stage, *args, **kwargs)

        return counted

    def take(self) -> int:
        """The most micro-batches one stage ran since the last call (0 without pipelining)."""
        most = max(self.calls.values(), default=0)
        self.calls.clear()
        return most


def _storage(parameter: torch.Tensor) -> int | None:
    """Where a parameter's gradient (a DTensor's local tensor) lives; None without one."""
    grad = parameter.grad
    local = getattr(grad, "_local_tensor", grad)
    return local.data_ptr() if isinstance(local, torch.Tensor) and local.numel() else None


def _output_tensors(output: object) -> list[tuple[str, torch.Tensor]]:
    """The dense floating tensors in a module's output: the output itself, or the items of a tuple, list or
    dict (one level: enough for layers and blocks; a model's nested output is seen through its layers)."""
    items: list[tuple[str, object]]
    if isinstance(output, torch.Tensor):
        items = [("", output)]
    elif isinstance(output, (tuple, list)):  # items named as the snapshot walk names them: `.0`, `.key`
        items = [(f".{index}", item) for index, item in enumerate(output)]
    elif isinstance(output, Mapping):
        items = [(f".{key}", item) for key, item in output.items()]
    else:
        items = []
    return [(suffix, item) for suffix, item in items
            if isinstance(item, torch.Tensor) and item.is_floating_point() and item.layout == torch.strided]
