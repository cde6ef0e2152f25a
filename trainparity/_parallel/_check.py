"""`check_data_parallel`: real torch.distributed ranks against the same recipe in a world of size 1.

The process engine starts `world_size` ranks and the reference concurrently. Each child
initializes the default process group (a file store in a temporary directory) before the
recipe's `setup()`, so the recipe reads `dist.get_rank()`/`dist.get_world_size()`, shards
its data and wraps its model in DDP exactly as in production; the reference runs the same
code path in a world of size 1. Each child records, per step, the batch's sample IDs, the
gradients at its optimizer step (a step pre-hook, removed afterwards), the parameters
after the step, and a bounded sample of what its modules returned (forward hooks, removed
afterwards), in the order the modules finished.

Judgement per step, in observation order: the ranks' sample IDs against the reference's
full batch (`data.sample_ids`), the gradients across ranks and then against the reference
(`gradients.<param>`), the parameters across ranks (`replicas.<param>`) and then against the
reference (`parameters.<param>`). Ranks are compared with rank 0, the reference with rank 0.
When the ranks are a tensor-parallel group (all read the reference's batch), a module output
(`outputs.<module>`) or a gradient (`gradients.<param>`) that is a partial sum over the ranks
names the layer whose all-reduce is missing (`tp_partial_not_reduced`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from trainparity._batches._sample_ids import SampleIds, normalize_sample_ids
from trainparity._coverage import ExactlyOnce, check_coverage
from trainparity._observe._observer import HookSet, Observer
from trainparity._process import _session
from trainparity._process._engine import Job, JobOutcome, first_failure, run_jobs, scratch_directory
from trainparity._process._options import Isolation
from trainparity._process._world import World, join, leave, validate_backend, world_isolation
from trainparity._recipe._recipe import Recipe, next_batch, require_state
from trainparity._recipe._reference import RecipeRef, RecipeSpec, resolve_recipe
from trainparity._results._result import ChildError, DataParallelResult
from trainparity._results._violation import Outcome, Violation
from trainparity._state._compare import (
    Comparison,
    ExactComparison,
    Leaf,
    Mismatch,
    Snapshot,
    ToleranceComparison,
    compare_leaves,
    compare_snapshots,
    resolve_comparison,
)
from trainparity._state._digest import gathered
from trainparity._state._precision import (
    cast_batch,
    convert_state,
    describe_comparison,
    dtype_error_hint,
    effective_comparison,
    running_in,
)
from trainparity._state._rng import seed_everything, validate_seed
from trainparity._state._snapshot import to_leaf

TASK = "trainparity._parallel._check:run_rank"
REFERENCE = "reference"
#: a diagnosis names a likely cause, never the verdict: "world_size times the reference" allows for the
#: rounding of a different reduction order whatever comparison was declared
RATIO_TOLERANCE = ToleranceComparison(rtol=1e-4, atol=1e-7)
#: torch.testing.assert_close's defaults, used only to say that an exact FAIL is rounding-level
ROUNDING = {
    torch.float16: ToleranceComparison(rtol=1e-3, atol=1e-5),
    torch.bfloat16: ToleranceComparison(rtol=1.6e-2, atol=1e-5),
    torch.float32: ToleranceComparison(rtol=1.3e-6, atol=1e-5),
    torch.float64: ToleranceComparison(rtol=1e-7, atol=1e-7),
}
SHARD_CAUSES = {"cross_rank_duplicate": "rank_shard_overlap", "missing_id": "rank_shard_missing"}
TP_PARTIAL = "tp_partial_not_reduced"
#: a recorded module output keeps every k-th element, at most this many: enough to see a partial sum
OUTPUT_SAMPLE = 4096
#: module outputs a process records over the whole run (the first ones in forward order, from step 1 on):
#: at most OUTPUT_LIMIT * OUTPUT_SAMPLE float64 values, 16 MiB, whatever the model's size. A count rather than
#: a size, so that every rank stops at the same output and gathers (collectives) the same DTensors.
OUTPUT_LIMIT = 512


# -- the child: one rank (or the reference) ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModuleOutput:
    """A floating tensor a module returned in one step, as the tensor-parallel diagnosis keeps it."""

    #: the module's path, `.i`/`.key` for an item of a tuple or dict output, `#n` for its n-th call in the step
    key: str
    #: the module's path and class, as reports name it: "model.down (Linear)"
    module: str
    #: the whole (gathered) output's shape
    shape: list[int]
    #: every `stride`-th element of the whole output in float64, shaped like the output when stride is 1
    stride: int
    values: torch.Tensor

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ModuleOutput:
        return cls(str(data["key"]), str(data["module"]), [int(n) for n in data["shape"]], int(data["stride"]),
                   data["values"])


@dataclasses.dataclass(frozen=True)
class RankStep:
    """One step of one process: its batch's sample IDs, the gradients at the optimizer step, the parameters after,
    and the module outputs recorded in the step (see `OutputRecorder`)."""

    step: int
    sample_ids: SampleIds | None
    gradients: Snapshot
    parameters: Snapshot
    outputs: list[ModuleOutput]


@dataclasses.dataclass(frozen=True)
class RankTrace:
    """What one process of the check observed."""

    steps: list[RankStep]
    #: how many optimizers the State holds
    optimizers: int
    #: batch-dependent modules that ran in training mode
    batch_dependent: list[str]
    #: parameter name -> the layer that owns it, as reports name it ("model.embed (Linear)")
    layers: dict[str, str]

    def to_wire(self) -> dict[str, Any]:
        return {"steps": [dataclasses.asdict(step) for step in self.steps], "optimizers": self.optimizers,
                "batch_dependent": self.batch_dependent, "layers": self.layers}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RankTrace:
        steps = [RankStep(int(step["step"]), None if step["sample_ids"] is None else list(step["sample_ids"]),
                          dict(step["gradients"]), dict(step["parameters"]),
                          [ModuleOutput.from_wire(output) for output in step["outputs"]]) for step in data["steps"]]
        return cls(steps, int(data["optimizers"]), [str(module) for module in data["batch_dependent"]],
                   {str(name): str(layer) for name, layer in data["layers"].items()})


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


def run_rank(payload: RankPayload, workdir: pathlib.Path) -> dict[str, Any]:
    """Child task: join the process group, run the recipe, record each step. When a rank fails, the
    others' collectives break and they fail too: the engine reports the failure that came first."""
    store = pathlib.Path(payload.scratch) / ("store.reference" if payload.tag == REFERENCE else "store.ranks")
    join(World(payload.backend, payload.rank, payload.world_size, str(store)))
    recipe = payload.recipe.build()
    with running_in(payload.precision):
        seed_everything(payload.seed)
        state = require_state(recipe.setup(), recipe, "setup")
        convert_state(state, payload.precision)
        with Observer(state, type(recipe), disable_dropout=False, record_contributions=False) as observer, \
                OutputRecorder(observer.modules) as outputs:
            steps = list(record_steps(recipe, observer, outputs, payload))
            batch_dependent = sorted(observer.batch_dependent)
            optimizers = len(observer.optimizers)
            layers = owning_layers(observer)
    leave(recipe, state)
    return RankTrace(steps, optimizers, batch_dependent, layers).to_wire()


def record_steps(recipe: Recipe, observer: Observer, outputs: OutputRecorder,
                 payload: RankPayload) -> Iterator[RankStep]:
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
            observer.end_call()
        gradients: Snapshot = {}
        for events in observer.take_step_events().values():
            for event in events:
                gradients.update(event.grads)
        yield RankStep(step, ids, gradients, {n: to_leaf(p) for n, p in observer.parameters()}, outputs.take())


def named_layers(modules: Mapping[str, nn.Module]) -> Iterator[tuple[str, str, nn.Module]]:
    """Every submodule of the State's modules: its path, the "path (Class)" reports name it by, and itself."""
    for entry, module in modules.items():
        for sub_name, sub in module.named_modules():
            path = f"{entry}.{sub_name}" if sub_name else entry
            yield path, f"{path} ({type(sub).__name__})", sub


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


# -- the parent: run and judge ------------------------------------------------------------------------


def _validate(world_size: object, backend: object, steps: object, seed: object) -> tuple[int, str, int, int]:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size= must be an int >= 2 (the reference is the world of size 1), got {world_size!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps= must be an int >= 1, got {steps!r}")
    return world_size, validate_backend(backend, world_size), steps, validate_seed(seed)


@_session.recorded
def check_data_parallel(
    recipe: RecipeSpec,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    steps: int = 3,
    comparison: Comparison | None = None,
    seed: int = 0,
    precision: _session.Precision | None = None,
    timeout: float | None = None,
    isolation: Isolation | None = None,
) -> DataParallelResult:
    """Check that `world_size` real torch.distributed ranks train like the same recipe in a world of size 1.

    Per step: the ranks' sample IDs together make the reference's batch, every rank holds the
    reference's gradients at its optimizer step, and every rank's parameters after the step
    equal each other's and the reference's. Never raises for a FAIL. `timeout` bounds the whole
    check: a rank that hangs (a collective that never completes) gets every process killed.
    `isolation` is "process" (children of the warmed fork server) or "spawn" (fresh interpreters);
    by default "process", and "spawn" for nccl: a child forked from the fork server may be unable
    to initialize CUDA. `precision="float64"` (default) runs every process in float64 and, without
    a declared comparison, judges with the fixed float64 tolerance; `"native"` keeps the recipe's
    dtypes (exact unless a comparison is declared). `timeout` defaults to 120 s. `precision`,
    `timeout` and `isolation` left at None take the session's defaults (`--trainparity-*` under
    pytest; an isolation the check cannot use, "inprocess" or, for nccl, "process", is passed over).
    """
    ref = resolve_recipe(recipe)
    world_size, backend, steps, seed = _validate(world_size, backend, steps, seed)
    declared = None if comparison is None else resolve_comparison(comparison)
    precision = _session.precision(precision)
    timeout = _session.timeout(timeout)
    isolation = world_isolation(isolation, backend)
    config: dict[str, Any] = {
        "recipe": ref.name,
        "world_size": world_size,
        "backend": backend,
        "steps": steps,
        "seed": seed,
        "precision": precision,
        "comparison": describe_comparison(declared, precision),
        "isolation": isolation,
    }
    with scratch_directory("trainparity-dp-") as scratch:
        def job(rank: int, size: int, tag: str) -> Job:
            payload = RankPayload(ref, seed, steps, backend, rank, size, tag, str(scratch), precision)
            return Job(TASK, payload, tag, timeout, rank=None if tag == REFERENCE else rank, decode=RankTrace.from_wire)

        jobs = [job(rank, world_size, f"rank {rank}") for rank in range(world_size)] + [job(0, 1, REFERENCE)]
        outcomes = run_jobs(jobs, isolation=isolation, concurrency=len(jobs), on_failure="all")
        error = _first_error(outcomes, timeout)
    if error is not None:
        result = DataParallelResult.errored(error, config)
        hint = dtype_error_hint(error.message) if precision == "float64" else None
        if hint is not None:
            result.notes.append(hint)
        return result
    traces = [o.output for o in outcomes]
    assert all(trace is not None for trace in traces)
    *ranks, reference = (trace for trace in traces if trace is not None)
    return judge_data_parallel(reference, ranks, effective_comparison(declared, precision), config)


def _first_error(outcomes: Sequence[JobOutcome], timeout: float) -> ChildError | None:
    """The failure that ended the check; on a timeout, with the stacks of every process."""
    failed = first_failure(outcomes)
    if failed is None or failed.error is None:
        return None
    error = failed.error
    if error.kind != "timeout":
        return error
    stacks = [f"{o.phase}:\n{o.error.traceback}" for o in outcomes if o.error is not None and o.error.traceback]
    return dataclasses.replace(
        error,
        message=f"did not finish within timeout={timeout:g} s (a process that hangs, e.g. in a collective that "
        "never completes, blocks the others); every process of the check was killed",
        traceback="Stacks of every process shortly before the timeout (most recent call first):\n"
        + "\n".join(stacks),
    )


# -- judgement ----------------------------------------------------------------------------------------


def judge_data_parallel(
    reference: RankTrace, ranks: Sequence[RankTrace], comparison: Comparison, config: dict[str, Any]
) -> DataParallelResult:
    world_size = len(ranks)
    violations: list[Violation] = []
    rounding: list[bool] = []

    def add(found: Violation, expected: Leaf = None, actual: Leaf = None) -> None:
        violations.append(found)
        rounding.append(_within_rounding(expected, actual, comparison))

    notes: list[str] = []
    data_checked = True
    # SyncBatchNorm normalizes over the whole batch across ranks: only the others depend on the shard.
    batch_dependent = sorted({module for trace in (reference, *ranks) for module in trace.batch_dependent
                              if not module.endswith("(SyncBatchNorm)")})
    for index, expected in enumerate(reference.steps):
        step: int = expected.step
        observed = [rank.steps[index] for rank in ranks]
        shards = [o.sample_ids for o in observed if o.sample_ids is not None]
        if expected.sample_ids is None or len(shards) < len(observed):
            data_checked = False
        else:
            for violation in shard_violations(step, expected.sample_ids, shards):
                add(violation)
        # A tensor-parallel group computes one model on the same batch: partial sums over its ranks are telling.
        group = expected.sample_ids is not None and len(shards) == len(observed) and reads_whole_batch(
            expected.sample_ids, shards)
        partial = partial_output(expected, observed, comparison) if group else None
        found: list[tuple[Violation, Leaf, Leaf]] = []
        first = observed[0]
        step_cause = None if partial is None else TP_PARTIAL
        for rank, other in enumerate(observed[1:], start=1):
            for m in compare_snapshots(first.gradients, other.gradients, comparison):
                reason, preface = _unsynchronized(m.path, rank, expected, observed, reference.layers, partial, group)
                step_cause = step_cause or reason
                found.append((_violation("gradient_mismatch", "gradients", m, step, rank, reason, preface),
                              first.gradients.get(m.path), other.gradients.get(m.path)))
        for m in compare_snapshots(expected.gradients, first.gradients, comparison):
            e, a = expected.gradients.get(m.path), first.gradients.get(m.path)
            cause, preface = step_cause, (
                "Rank 0's gradients at its optimizer step differ from the reference's (the same recipe in a world "
                "of size 1)."
            )
            if cause is None and _scaled(e, a, world_size):
                cause = step_cause = "loss_not_averaged"
                preface = (
                    f"Rank 0's gradients are world_size ({world_size}) times the reference's: the loss (or the "
                    "gradients) was summed across ranks where the full batch takes a mean."
                )
            elif cause is None and batch_dependent:
                cause = step_cause = "batch_dependent_layer"
                preface = (
                    "Rank 0's gradients at its optimizer step differ from the reference's: "
                    f"{', '.join(batch_dependent)} normalize by the statistics of the batch each process sees in "
                    "training mode, and a rank's shard has other statistics than the full batch. To normalize over "
                    "the whole batch across ranks, convert them with nn.SyncBatchNorm.convert_sync_batchnorm(model)."
                )
            found.append((_violation("gradient_mismatch", "gradients", m, step, 0, cause, preface), e, a))
        for rank, other in enumerate(observed[1:], start=1):
            for m in compare_snapshots(first.parameters, other.parameters, comparison):
                found.append((_violation("replica_mismatch", "replicas", m, step, rank,
                                         TP_PARTIAL if step_cause == TP_PARTIAL else "grads_not_synchronized",
                                         f"Rank {rank}'s parameters after the step differ from rank 0's: the replicas "
                                         "drifted apart."),
                              first.parameters.get(m.path), other.parameters.get(m.path)))
        for m in compare_snapshots(expected.parameters, first.parameters, comparison):
            found.append((_violation("parameter_mismatch", "parameters", m, step, 0, step_cause,
                                     "Rank 0's parameters after the step differ from the reference's."),
                          expected.parameters.get(m.path), first.parameters.get(m.path)))
        if found and partial is not None:
            # The module that summed partially comes first: the gradients and parameters follow from it.
            add(_partial_violation(step, partial), partial.expected.values, partial.actual.values)
        for violation, e, a in found:
            add(violation, e, a)
    if not data_checked:
        notes.append("data stream not checked: the recipe's sample_ids() returns None.")
    if reference.optimizers == 0:
        notes.append("gradients not compared: the State holds no torch.optim.Optimizer whose step could be observed.")
    if violations and all(rounding):
        notes.append(
            "every difference is within torch.testing's default tolerance for its dtype: ranks reduce the batch "
            "in another order than one process, which changes rounding. If that is acceptable, judge in float64 "
            "(precision='float64', the default) or declare comparison=tp.ToleranceComparison(rtol=..., atol=...)."
        )
    return DataParallelResult(Outcome.FAIL if violations else Outcome.PASS, violations, notes, config)


def _violation(
    kind: str, root: str, mismatch: Mismatch, step: int, rank: int, cause: str | None, preface: str
) -> Violation:
    return Violation(
        kind=kind,
        path=f"{root}.{mismatch.path}",
        message=f"{preface}\n{mismatch.message}",
        step=step,
        expected=mismatch.expected,
        actual=mismatch.actual,
        cause=cause,
        rank=rank,
    )


def _scaled(expected: Leaf, actual: Leaf, world_size: int) -> bool:
    """Whether `actual` is `world_size` times a nonzero `expected`."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return False
    if not expected.is_floating_point() or expected.shape != actual.shape or not bool(expected.any()):
        return False
    return compare_leaves(expected * world_size, actual, RATIO_TOLERANCE) is None


def _unsynchronized(
    path: str, rank: int, expected: RankStep, observed: Sequence[RankStep], layers: dict[str, str],
    partial: PartialOutput | None, group: bool,
) -> tuple[str, str]:
    """The cause and preface of gradients that differ between rank 0 and `rank`."""
    if partial is not None:
        return TP_PARTIAL, f"Rank {rank} holds other gradients than rank 0 at its optimizer step."
    if group and _sums_to(expected.gradients.get(path), [o.gradients.get(path) for o in observed]):
        layer = layers.get(path, path)
        after = _sharded_after(layer, expected, observed[0])
        culprit = "a tensor-parallel layer after it" if after is None else f"{after}, the first sharded layer after it,"
        return TP_PARTIAL, (
            f"Rank {rank} holds other gradients than rank 0 at its optimizer step, and the ranks' gradients sum to "
            f"the reference's: the gradients of {layer} on each rank are a partial sum that was never all-reduced "
            f"({culprit} whose input gradient is not all-reduced in backward?).")
    return "grads_not_synchronized", (
        f"Rank {rank} holds other gradients than rank 0 at its optimizer step: they were not all-reduced (a model "
        "used without its DDP wrapper, parameters left outside fully_shard, or no_sync() at the step?).")


def _sharded_after(layer: str, expected: RankStep, first: RankStep) -> str | None:
    """The first module to finish after `layer` whose output on rank 0 is a shard (another shape than the
    reference's): in forward order the tensor-parallel layer that `layer`'s output feeds."""
    shapes = {output.key: output.shape for output in first.outputs}
    modules = [output.module for output in expected.outputs]
    if layer not in modules:
        return None
    for output in expected.outputs[modules.index(layer) + 1:]:
        if output.key in shapes and shapes[output.key] != output.shape:
            return output.module
    return None


def _sums_to(expected: Leaf, ranks: Sequence[Leaf]) -> bool:
    """Whether the ranks' tensors add up to a nonzero `expected` (each a partial sum of it)."""
    if not isinstance(expected, torch.Tensor) or not expected.is_floating_point() or not bool(expected.any()):
        return False
    if not all(isinstance(r, torch.Tensor) and r.shape == expected.shape for r in ranks):
        return False
    total = torch.stack([r for r in ranks if isinstance(r, torch.Tensor)]).sum(0)
    return compare_leaves(expected, total.to(expected.dtype), RATIO_TOLERANCE) is None


@dataclasses.dataclass(frozen=True)
class PartialOutput:
    """A module output that differs from the reference's on `rank` (the first such rank), while the ranks'
    outputs sum to the reference's."""

    expected: ModuleOutput
    actual: ModuleOutput
    rank: int
    mismatch: Mismatch


def partial_output(reference: RankStep, ranks: Sequence[RankStep], comparison: Comparison) -> PartialOutput | None:
    """The first module output, in the order the modules finished, that differs from the reference's on some
    rank, when the ranks' outputs sum to the reference's. None when the first differing output is something
    else. Outputs of another shape than the reference's are a rank's shard of
    a sharded layer and are passed over; outputs not recorded by every process end the search."""
    recorded = [{output.key: output for output in step.outputs} for step in ranks]
    for expected in reference.outputs:
        outputs = [by_key.get(expected.key) for by_key in recorded]
        found = [output for output in outputs if output is not None]
        if len(found) < len(outputs):
            return None
        if any(output.shape != expected.shape for output in found):
            continue
        mismatches = [compare_leaves(expected.values, output.values, comparison) for output in found]
        rank = next((rank for rank, mismatch in enumerate(mismatches) if mismatch is not None), None)
        if rank is None:
            continue
        mismatch = mismatches[rank]
        if mismatch is None or not _sums_to(expected.values, [output.values for output in found]):
            return None
        return PartialOutput(expected, found[rank], rank, dataclasses.replace(mismatch, path=expected.key))
    return None


def _partial_violation(step: int, partial: PartialOutput) -> Violation:
    expected = partial.expected
    sampled = "" if expected.stride == 1 else f" (every {expected.stride}th element of the flattened output)"
    return _violation(
        "output_mismatch", "outputs", partial.mismatch, step, partial.rank, TP_PARTIAL,
        f"{expected.module} returned other values on rank {partial.rank} than in the reference{sampled}, and the "
        "ranks' outputs sum to the reference's: its output on each rank is a partial sum that was never all-reduced "
        "(a row-parallel layer without the all-reduce of its output, such as RowwiseParallel(output_layouts="
        "Partial()) or a missing dist.all_reduce?).")


def _within_rounding(expected: Leaf, actual: Leaf, comparison: Comparison) -> bool:
    if not isinstance(comparison, ExactComparison) or not isinstance(expected, torch.Tensor):
        return False
    tolerance = ROUNDING.get(expected.dtype)
    return tolerance is not None and isinstance(actual, torch.Tensor) and (
        compare_leaves(expected, actual, tolerance) is None
    )


def reads_whole_batch(expected: SampleIds, ranks: Sequence[SampleIds]) -> bool:
    """Whether every rank read the reference's whole batch: a tensor-parallel group."""
    return all(sorted(map(str, ids)) == sorted(map(str, expected)) for ids in ranks)


def shard_violations(step: int, expected: SampleIds, ranks: Sequence[SampleIds]) -> list[Violation]:
    """Whether the ranks' sample IDs of one step are together the reference's batch, each read once.

    The coverage audit judges `ExactlyOnce(the reference's batch)` over the ranks' IDs (one
    finding per offending sample, in observation order, then the samples no rank read); its
    findings are told here in data-parallel terms. Ranks that all read the whole batch are a
    tensor-parallel group (its ranks compute one model on the same data): nothing to judge. On a
    2-D mesh the ranks of each tensor-parallel group read one shard: when every shard is read by
    the same number of ranks and the shards, once each, are the batch, that is what is judged.
    """
    if reads_whole_batch(expected, ranks):
        return []
    peers = Counter(tuple(ids) for ids in ranks)
    if len(set(peers.values())) == 1 and 1 < min(peers.values()) < len(ranks) and not check_coverage(
            {group: [list(ids)] for group, ids in enumerate(peers)}, policy=ExactlyOnce(expected)).violations:
        return []
    if len(set(expected)) != len(expected):
        return _multiset_shard_violations(step, expected, ranks)
    audit = check_coverage({rank: [ids] for rank, ids in enumerate(ranks)}, policy=ExactlyOnce(expected))
    readers: dict[int | str, list[int]] = {}
    for rank, ids in enumerate(ranks):
        for read in ids:
            readers.setdefault(read, []).append(rank)
    found = []
    for finding in audit.violations:
        kind, sample, reader = finding.kind, finding.sample_id, finding.rank
        assert sample is not None  # every finding of ExactlyOnce names its sample
        by = ", ".join(str(r) for r in sorted(set(readers.get(sample, []))))
        message = {
            "cross_rank_duplicate": f"Sample {sample!r} was read by ranks {by}: their shards overlap.",
            "same_rank_duplicate": f"Sample {sample!r} was read more than once by rank {reader}.",
            "missing_id": f"Sample {sample!r} of the reference's batch was read by no rank: a shard is missing.",
            "unexpected_id": f"Sample {sample!r} was read by rank {by}, but it is not in the reference's batch.",
        }[kind]
        found.append(
            Violation(
                kind=kind,
                path="data.sample_ids",
                message="The ranks' samples together are not the reference's batch (each of its samples read "
                f"once by one rank).\n{message}",
                step=step,
                expected=list(expected),
                actual=[list(ids) for ids in ranks],
                cause=SHARD_CAUSES.get(kind),
                sample_id=sample,
                rank=reader,
                position=finding.position,
            )
        )
    return found


def _multiset_shard_violations(step: int, expected: SampleIds, ranks: Sequence[SampleIds]) -> list[Violation]:
    """When the reference's batch itself repeats samples (drawn with replacement), the ranks
    together must read the same multiset: each sample as often as the reference did."""
    wanted = Counter(expected)
    read = Counter(sample for ids in ranks for sample in ids)
    found = []
    for sample in dict.fromkeys([*expected, *(s for ids in ranks for s in ids)]):
        if read[sample] == wanted[sample]:
            continue
        kind = "missing_id" if read[sample] < wanted[sample] else "cross_rank_duplicate"
        found.append(
            Violation(
                kind=kind,
                path="data.sample_ids",
                message="The ranks' samples together are not the reference's batch.\n"
                f"Sample {sample!r} was read {read[sample]} times by the ranks and {wanted[sample]} times by the "
                "reference.",
                step=step,
                expected=list(expected),
                actual=[list(ids) for ids in ranks],
                cause=SHARD_CAUSES.get(kind),
                sample_id=sample,
            )
        )
    return found
