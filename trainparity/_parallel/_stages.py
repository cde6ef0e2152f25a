"""Pipeline parallelism: ranks that hold stages of the model (torch.distributed.pipelining), judged by name.

A rank holds its stages the torchtitan way: the whole model built on every rank, the layers it does not own
deleted, so that each parameter keeps its fully qualified name in the whole model. The ranks that hold the same
parameters are the replicas of one stage (data parallel over the pipeline); the i-th replica of every stage
together make the i-th pipeline, whose ranks read the same samples. A weight tied across stages (an embedding and
the output projection) is held under its own name on each stage and matched to the reference's one parameter
through the reference's names for it.

Per step, each parameter's gradient and value are compared across the ranks that hold it (the replicas of its
stage, the stages that share a tied weight), then the first holder's with the reference's. A gradient the
number of micro-batches times the reference's, or one over it, names the schedule's scaling; a stage with no
gradient where the reference has one, a stage cut from the graph. Before them, the first module output that
differs from the reference's rows, micro-batch by micro-batch and stage by stage: where the forward diverges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from trainparity._parallel._differences import compared, scaled, shape_of, violation
from trainparity._parallel._tensor_parallel import sums_to
from trainparity._parallel._trace import ModuleOutput, RankStep, RankTrace
from trainparity._results._violation import Violation, listed
from trainparity._state._compare import Comparison, Leaf, Snapshot, compare_leaves

#: how to hold a stage so that the check can match it to the whole model
HOW_TO_LAY_OUT = ("build the whole model on every rank and delete the layers the rank does not own (del "
                  "model.layers[name], or set the module to None), as torchtitan does, so that every parameter keeps "
                  "its fully qualified name in the whole model, and hold that model in the State")

TIED = "tied_weights_not_synchronized"
WITHOUT_GRAD = "param_without_grad"


@dataclasses.dataclass(frozen=True)
class Stages:
    """How the ranks of a pipeline hold the reference's parameters."""

    #: per rank: its names for its parameters -> the reference's names for them
    names: list[dict[str, str]]
    #: per rank: its stage (ranks that hold the same parameters hold one stage), numbered by first rank
    stage: list[int]
    #: the pipelines: the i-th replica of every stage, in stage order
    pipelines: list[list[int]]
    #: the reference's parameter name -> the ranks that hold it, in rank order
    holders: dict[str, list[int]]

    def pipeline_of(self, rank: int) -> list[int]:
        return next(pipeline for pipeline in self.pipelines if rank in pipeline)


def stages_of(reference: RankTrace, ranks: Sequence[RankTrace]) -> Stages | str | None:
    """The pipeline the ranks make; None when every rank holds the whole model (no pipeline), and why not when
    they hold parts of it in a way the check cannot match to the reference's model."""
    if not reference.steps or not ranks or any(not trace.steps for trace in ranks):
        return None
    expected = {path: shape_of(leaf) for path, leaf in reference.steps[0].parameters.items()}
    names = [{name: reference.aliases.get(name, name) for name in trace.steps[0].parameters} for trace in ranks]
    if all(set(held.values()) >= expected.keys() for held in names):
        return None
    problems = []
    for rank, (trace, held) in enumerate(zip(ranks, names, strict=True)):
        unknown = sorted(name for name, whole in held.items() if whole not in expected)
        reshaped = sorted(name for name, whole in held.items() if whole in expected and
                          shape_of(trace.steps[0].parameters[name]) != expected[whole])
        if unknown:
            problems.append(f"rank {rank} holds {listed(unknown, 3)}, which the reference's model does not")
        for name in reshaped[:1]:
            problems.append(f"{name} is {list(shape_of(trace.steps[0].parameters[name]) or [])} on rank {rank} and "
                            f"{list(expected[held[name]] or [])} in the reference")
    unheld = sorted(expected.keys() - {whole for held in names for whole in held.values()})
    if unheld:
        problems.append(f"no rank holds {listed(unheld, 3)}")
    groups: dict[frozenset[str], list[int]] = {}
    for rank, held in enumerate(names):
        groups.setdefault(frozenset(held.values()), []).append(rank)
    tied = set(reference.aliases.values())
    for whole in [whole for whole in expected if whole not in tied]:
        stages = {group for group in groups if whole in group}
        if len(stages) > 1 and not problems:
            problems.append(f"{whole} is held by ranks that hold other stages ({listed(_ranks(groups, stages), 4)}) "
                            "and is not a weight tied to another in the reference's model")
    replicas = {len(group) for group in groups.values()}
    if not problems and len(replicas) > 1:
        counts = listed([str(count) for count in sorted(replicas)], 4)
        problems.append(f"its stages are held by different numbers of ranks ({counts})")
    if problems:
        return (f"The ranks hold parts of the model the reference trains (pipeline stages?), but "
                f"{'; '.join(problems)}: to be matched with the reference, {HOW_TO_LAY_OUT}.")
    stage = [0] * len(ranks)
    for index, group in enumerate(groups.values()):
        for rank in group:
            stage[rank] = index
    pipelines = [[group[i] for group in groups.values()] for i in range(replicas.pop())]
    holders = {name: [rank for rank, held in enumerate(names) if name in held.values()] for name in expected}
    return Stages(names, stage, pipelines, holders)


def _ranks(groups: Mapping[frozenset[str], list[int]], chosen: set[frozenset[str]]) -> list[str]:
    return [str(rank) for rank in sorted(rank for group in chosen for rank in groups[group])]


def _renamed(snapshot: Snapshot, names: Mapping[str, str]) -> Snapshot:
    return {names.get(name, name): leaf for name, leaf in snapshot.items()}


Found = list[tuple[Violation, Leaf, Leaf]]


def stage_differences(expected: RankStep, observed: Sequence[RankStep], stages: Stages,
                      comparison: Comparison) -> Found:
    """One step of a pipeline: each parameter's gradient across the ranks that hold it and against the reference's,
    then its value after the step likewise; each violation with the two values it compares."""
    gradients = [_renamed(step.gradients, names) for step, names in zip(observed, stages.names, strict=True)]
    values = [_renamed(step.parameters, names) for step, names in zip(observed, stages.names, strict=True)]
    found = _copies(expected, gradients, stages, comparison, "gradients", None)
    step_cause = found[0][0].cause if found else None
    found[:0] = microbatch_divergence(expected, observed, stages, comparison)
    for name, holders in stages.holders.items():
        rank = holders[0]
        for m in compared({name: expected.gradients.get(name)}, {name: gradients[rank].get(name)}, "gradients",
                          comparison):
            e, a = expected.gradients.get(name), gradients[rank].get(name)
            cause, preface = _gradient_cause(e, a, rank, (observed[rank].forwards, len(stages.pipelines)), step_cause)
            step_cause = step_cause or cause
            found.append((violation("gradient_mismatch", "gradients", m, expected.step, rank, cause, preface), e, a))
    found += _copies(expected, values, stages, comparison, "replicas", step_cause)
    for name, holders in stages.holders.items():
        rank = holders[0]
        for m in compared({name: expected.parameters.get(name)}, {name: values[rank].get(name)}, "parameters",
                          comparison):
            found.append((violation("parameter_mismatch", "parameters", m, expected.step, rank, step_cause,
                                    f"The parameters of rank {rank}'s pipeline stage after the step differ from the "
                                    "reference's."), expected.parameters.get(name), values[rank].get(name)))
    return found


def microbatch_divergence(expected: RankStep, observed: Sequence[RankStep], stages: Stages,
                          comparison: Comparison) -> Found:
    """Where the step's forward diverges first: micro-batch by micro-batch, and within one stage by stage along each
    pipeline, the first module output that differs from the reference's rows for the same samples (the schedule
    cuts each pipeline's batch into `torch.tensor_split` chunks along the first dimension). A module's calls in a
    step are its micro-batches but for the first ones (a stage runs its module once more in its first step, to
    infer shapes); outputs not a batch's rows in the reference (sampled, another first dimension), and a rank's
    outputs of another shape than those rows (the shard of a tensor-parallel layer) are passed over."""
    batch = expected.sample_ids
    reference = {output.key: output for output in expected.outputs if output.stride == 1 and output.shape and
                 batch is not None and output.shape[0] == len(batch)}
    if batch is None or not reference or len(set(map(str, batch))) != len(batch):
        return []
    where = {str(sample): index for index, sample in enumerate(batch)}
    for pipeline in stages.pipelines:
        ids = observed[pipeline[0]].sample_ids
        if ids is None or any(str(sample) not in where for sample in ids):
            continue
        counts = {observed[rank].forwards for rank in pipeline}
        if len(counts) != 1 or 0 in counts:
            continue
        microbatches = counts.pop()
        rows = torch.tensor_split(torch.tensor([where[str(sample)] for sample in ids]), microbatches)
        calls = {rank: _microbatch_calls(observed[rank], microbatches) for rank in pipeline}
        for index, chunk in enumerate(rows):
            for stage, rank in enumerate(pipeline):
                for key, outputs in calls[rank].items():
                    wanted = reference.get(key)
                    actual = outputs[index]
                    if wanted is None or actual.stride != 1 or actual.shape != [len(chunk), *wanted.shape[1:]]:
                        continue  # a shard of a tensor-parallel layer's output: not the whole rows
                    mismatch = compare_leaves(wanted.values[chunk], actual.values, comparison)
                    if mismatch is not None:
                        preface = (f"{wanted.module} returned other values on rank {rank}, stage {stage} of its "
                                   f"pipeline, in micro-batch {index + 1} of {microbatches} than in the reference for "
                                   "the same samples: the step's forward diverges first there (every earlier "
                                   "micro-batch, and this one's earlier stages, agree).")
                        return [(violation("output_mismatch", "outputs", dataclasses.replace(mismatch, path=key),
                                           expected.step, rank, None, preface), wanted.values[chunk], actual.values)]
    return []


def _microbatch_calls(step: RankStep, microbatches: int) -> dict[str, list[ModuleOutput]]:
    """A rank's module outputs in the step by key without the call number (`model.layers.2`, `...#3`): the last
    `microbatches` calls of each, which ran the micro-batches in order."""
    calls: dict[str, list[ModuleOutput]] = {}
    for output in step.outputs:
        path = output.module.rsplit(" (", 1)[0]
        rest = output.key[len(path):]
        suffix = rest.lstrip("#0123456789") if rest.startswith("#") else rest
        calls.setdefault(path + suffix, []).append(output)
    return {key: outputs[-microbatches:] for key, outputs in calls.items() if len(outputs) >= microbatches}


def _copies(expected: RankStep, held: Sequence[Snapshot], stages: Stages, comparison: Comparison, root: str,
            step_cause: str | None) -> Found:
    """Each parameter's gradients (`root` "gradients") or values after the step ("replicas") on the ranks that hold
    it, against its first holder's: the replicas of one stage, or the stages that hold copies of a tied weight."""
    found: Found = []
    for name, holders in stages.holders.items():
        first = holders[0]
        for rank in holders[1:]:
            for m in compared({name: held[first].get(name)}, {name: held[rank].get(name)},
                              "gradients" if root == "gradients" else "parameters", comparison):
                e, a = held[first].get(name), held[rank].get(name)
                if stages.stage[rank] != stages.stage[first]:
                    cause, preface = TIED, _tied_preface(name, rank, first, expected, held, stages, root)
                else:
                    cause = step_cause if root == "replicas" and step_cause else "grads_not_synchronized"
                    preface = (f"Rank {rank} holds other {'gradients' if root == 'gradients' else 'parameters'} than "
                               f"rank {first}, a replica of the same pipeline stage: its gradients were not "
                               "all-reduced over the stage's data-parallel replicas (DDP or fully_shard per stage, or "
                               "a manual all-reduce over the dp group, left out?).")
                kind = "gradient_mismatch" if root == "gradients" else "replica_mismatch"
                found.append((violation(kind, root, m, expected.step, rank, cause, preface), e, a))
    return found


def _tied_preface(name: str, rank: int, first: int, expected: RankStep, held: Sequence[Snapshot], stages: Stages,
                  root: str) -> str:
    what = "gradient" if root == "gradients" else "value after the step"
    own = next(held_as for held_as, whole in stages.names[rank].items() if whole == name)
    there = f", {own} there" if own != name else ""
    told = (f"The copies of {name} on rank {first}'s pipeline stage and rank {rank}'s (a weight tied across "
            f"stages{there}) hold another {what}")
    pipeline = [holder for holder in stages.pipeline_of(first) if holder in stages.holders[name]]
    if root == "gradients" and sums_to(expected.gradients.get(name), [held[holder].get(name) for holder in pipeline]):
        told += (", and together they sum to the reference's gradient: each stage's copy holds only the part of the "
                 "gradient from its own use of the weight")
    return (f"{told}. All-reduce the tied weight's gradient between the stages that hold it before the optimizer "
            "step (as Megatron-LM's embedding group does), so that every copy steps with the whole gradient.")


def _gradient_cause(expected: Leaf, actual: Leaf, rank: int, counts: tuple[int, int],
                    step_cause: str | None) -> tuple[str | None, str]:
    """Why a stage's gradient differs from the reference's: none where the reference has one (a stage cut from the
    graph), the number of micro-batches times it or one over it (the schedule's scaling), or the number of
    pipelines times it (gradients summed over the dp replicas); `counts`: the stage's micro-batches a step, and the
    pipelines."""
    microbatches, pipelines = counts
    who = f"rank {rank}'s pipeline stage"
    if step_cause is not None:
        return step_cause, f"The gradients of {who} at its optimizer step differ from the reference's."
    if isinstance(expected, torch.Tensor) and bool(expected.any()) and (
            actual is None or (isinstance(actual, torch.Tensor) and not bool(actual.any()))):
        return WITHOUT_GRAD, (
            f"The parameters of {who} got {'no' if actual is None else 'a zero'} gradient at its optimizer step, "
            "where the reference's is nonzero: backward never reached this stage (its output, or the next stage's "
            "input, detached or computed under torch.no_grad()?).")
    #: (factor, whether the stage's gradients are the reference's divided by it, cause, what it means)
    scalings = [
        (microbatches, False, "loss_not_scaled",
         f"are {microbatches} times the reference's, the number of micro-batches it ran: each micro-batch's loss is "
         "a mean over the micro-batch and their gradients were summed without dividing by their number (a schedule "
         "built with scale_grads=False, and a loss_fn not divided by n_microbatches)"),
        (microbatches, True, "loss_scaled_twice",
         f"are 1/{microbatches} of the reference's, one over the number of micro-batches it ran: the loss was "
         "divided by n_microbatches while the schedule scales the gradients by it too (scale_grads=True, the "
         "default)"),
        (pipelines, False, "loss_not_averaged",
         f"are {pipelines} times the reference's, the number of pipelines (the stage's data-parallel replicas): the "
         "gradients were summed over the replicas where the full batch takes a mean (an all-reduce with "
         "ReduceOp.SUM not divided by the dp size?)"),
    ]
    for factor, divided, cause, told in scalings:
        if factor > 1 and (scaled(actual, expected, factor) if divided else scaled(expected, actual, factor)):
            return cause, f"The gradients of {who} {told}."
    return None, f"The gradients of {who} at its optimizer step differ from the reference's."
