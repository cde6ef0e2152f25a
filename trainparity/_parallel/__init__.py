"""`check_parallel`: the user's DDP, FSDP2 or tensor-parallel code on real ranks against one process.

- `_check`: the check: the ranks and the reference run together, the failure that ended them;
- `_rank`: the child: one rank (or the reference) joins its world and records each step;
- `_trace`: what one process recorded (`RankTrace`);
- `_judge`: the verdict, step by step (data, gradients, parameters) with causes;
- `_shards`: the ranks' sample IDs against the reference's batch;
- `_tensor_parallel`: the layer whose partial sums were never all-reduced.
"""

from trainparity._parallel._check import check_parallel

__all__ = ["check_parallel"]
