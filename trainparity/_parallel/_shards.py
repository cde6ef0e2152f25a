"""The data side of the data-parallel check: the ranks' sample IDs of one step against the reference's batch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from trainparity._batches._sample_ids import SampleIds
from trainparity._coverage import ExactlyOnce, check_coverage
from trainparity._parallel._mesh import Mesh, named
from trainparity._results._violation import Violation

#: peers of one replica on a mesh (ranks that differ only along its model dimensions) read other samples
PEERS_DIFFER = "peers_read_different_samples"

SHARD_CAUSES = {"cross_rank_duplicate": "rank_shard_overlap", "missing_id": "rank_shard_missing"}


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


def peer_violations(step: int, groups: Sequence[Sequence[int]], ranks: Sequence[SampleIds],
                    meshes: Sequence[Mesh | None]) -> list[Violation]:
    """On a mesh, the peers of each replica (ranks that differ only along the model dimensions: `tp`, ...) compute
    one model on one batch: each must read the samples its group's first rank read."""
    found = []
    for group in groups:
        first = ranks[group[0]]
        for rank in group[1:]:
            if Counter(map(str, ranks[rank])) == Counter(map(str, first)):
                continue
            mesh = meshes[rank]
            dims = ", ".join(mesh.model_dims) if mesh is not None else "the model dimensions"
            found.append(Violation(
                kind="peer_mismatch",
                path="data.sample_ids",
                message=f"{named(rank, meshes).capitalize()} read other samples than {named(group[0], meshes)}, its "
                f"peer along {dims}: ranks that differ only along {dims} compute one replica of the model and must "
                "read the same shard of the batch (is the sampler given the global rank and world size instead of "
                "the data-parallel dimension's, mesh['dp'].get_local_rank() and mesh['dp'].size()?).",
                step=step,
                expected=list(first),
                actual=list(ranks[rank]),
                cause=PEERS_DIFFER,
                rank=rank,
            ))
    return found
