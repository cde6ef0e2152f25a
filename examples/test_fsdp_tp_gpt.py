# ruff: noqa: E501 - the report snapshots hold report lines verbatim
"""The FSDP2 x tensor-parallel GPT on a (world / 4) x 4 mesh of ranks as threads, against one process: clean at 8
ranks, and each fault named with its cause and its mesh coordinate at 8 and 16 ranks."""

import unittest

from fsdp_tp_gpt import MeshGPT

import trainparity as tp


def first_lines(result: tp.Result) -> str:
    """The report's headline and first violation's message, as the snapshots keep them."""
    report = result.report()
    head = report.splitlines()[0]
    first = report.split("First violation: ", 1)[1].split("\n  Tensor-likes", 1)[0].split("\n  expected:", 1)[0]
    return f"{head}\nFirst violation: {first}"


class TestMeshGPT(tp.TestCase):
    def test_eight_ranks_on_a_2x4_mesh_train_like_one_process(self) -> None:
        self.assertParallelEquivalent(MeshGPT(), world_size=8, backend="threads", steps=2, timeout=120)

    def test_with_sequence_parallelism_eight_ranks_train_like_one_process(self) -> None:
        self.assertParallelEquivalent(MeshGPT(sequence_parallel=True), world_size=8, backend="threads", steps=2,
                                      timeout=120)

    def test_an_attention_output_never_all_reduced_over_tp_is_named_at_16_ranks(self) -> None:
        result = tp.check_parallel(MeshGPT("attention_output_not_reduced"), world_size=16, backend="threads",
                                   steps=1, timeout=120)
        self.assertExpectedInline(first_lines(result), """\
trainparity parallel check: FAIL at outputs.model.layers.0.attention.wo (tp_partial_not_reduced, step 1, rank 0)
First violation: outputs.model.layers.0.attention.wo (step 1, rank 0, kind: output_mismatch, cause: tp_partial_not_reduced)
  model.layers.0.attention.wo (Linear) returned other values on rank 0 (dp=0, tp=0) than in the reference for the same samples, and the outputs of its peers along tp (the ranks that read the same samples) sum to the reference's: its output on each rank is a partial sum that was never all-reduced over tp (a row-parallel layer without the all-reduce of its output, such as RowwiseParallel(output_layouts=Partial()) or a missing dist.all_reduce?).""")

    def test_peers_sharding_the_data_by_global_rank_are_named_at_8_ranks(self) -> None:
        result = tp.check_parallel(MeshGPT("sharded_by_global_rank"), world_size=8, backend="threads", steps=1,
                                   timeout=120)
        self.assertExpectedInline(first_lines(result), """\
trainparity parallel check: FAIL at data.sample_ids (peers_read_different_samples, step 1, rank 1)
First violation: data.sample_ids (step 1, rank 1, kind: peer_mismatch, cause: peers_read_different_samples)
  Rank 1 (dp=0, tp=1) read other samples than rank 0 (dp=0, tp=0), its peer along tp: ranks that differ only along tp compute one replica of the model and must read the same shard of the batch (is the sampler given the global rank and world size instead of the data-parallel dimension's, mesh['dp'].get_local_rank() and mesh['dp'].size()?).""")


if __name__ == "__main__":
    unittest.main()
