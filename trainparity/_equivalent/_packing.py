"""Packed sequences: several documents in one row, told apart where the row's `position_ids` restart at 0 (the
layout of transformers' `DataCollatorWithFlattening`) or by the `cu_seq_lens_q` a batch carries for a flattened row.

The probe: the model called once more on the same arguments, in eval mode, with the random streams put back after,
the output of its first embedding made a leaf that needs a gradient; the gradient of each row's last document's
outputs with respect to the embeddings of the documents before it. A correct block-diagonal mask makes it exactly
zero; a mask that lets a document attend across its start does not. The parameters' gradients are not touched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: rows probed per call: one backward each
ROWS = 4


def documents(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[list[tuple[int, int]]] | None:
    """Per row, the (start, end) positions of its documents, where the call carries packed rows (some row holding
    two documents or more); None otherwise."""
    cumulative = kwargs.get("cu_seq_lens_q", kwargs.get("cu_seqlens"))
    if isinstance(cumulative, torch.Tensor) and cumulative.dim() == 1 and cumulative.numel() > 2:
        bounds = [int(b) for b in cumulative.tolist()]
        return [[(start, end) for start, end in zip(bounds, bounds[1:], strict=False) if end > start]]
    positions = kwargs.get("position_ids")
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.shape[1] < 2:
        return None
    rows = []
    for row in positions[:ROWS].tolist():
        starts = [index for index, position in enumerate(row) if position == 0] or [0]
        if starts[0] != 0:
            starts.insert(0, 0)
        rows.append([(start, end) for start, end in zip(starts, [*starts[1:], len(row)], strict=True)])
    return rows if any(len(row) > 1 for row in rows) else None


def _output_tensor(output: Any) -> torch.Tensor | None:
    """The model's per-position output: a tensor, a transformers ModelOutput's logits, or a tuple's first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)):
        return next((item for item in output if isinstance(item, torch.Tensor)), None)
    return None


def cross_document_reads(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                         rows: list[list[tuple[int, int]]]) -> list[str]:
    """What the probe finds: `row 0: the document at positions 5-8 reads positions 0-4` for each row whose last
    document depends on earlier ones; empty where none does, or where the model has no embedding to probe."""
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if embedding is None:
        return []
    leaves: list[torch.Tensor] = []

    def leaf(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        made = output.detach().requires_grad_(True)
        leaves.append(made)
        return made

    modes = [(m, m.training) for m in model.modules()]
    handle = embedding.register_forward_hook(leaf)
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.set_grad_enabled(True):  # typed on every torch, enable_grad not
            output = _output_tensor(model(*args, **kwargs))
            if output is None or not leaves or output.dim() < 2:
                return []
            embedded = leaves[0]
            found = []
            for index, row in enumerate(rows):
                if len(row) < 2:
                    continue
                (start, end), first, before = row[-1], row[0][0], row[-2][1]
                unbatched = embedded.dim() == 2  # (positions, width): one row without a batch dimension
                target = output[start:end] if unbatched else output[index, start:end]
                grad, = torch.autograd.grad(target.sum(), embedded, retain_graph=True, allow_unused=True)
                if grad is None:
                    continue
                leak = grad[first:before] if unbatched else grad[index, first:before]
                if bool(leak.ne(0).any()):
                    found.append(f"row {index}: the document at positions {start}-{end - 1} reads positions "
                                 f"{first}-{before - 1}, which belong to the documents before it")
            return found
    finally:
        handle.remove()
        for module, training in modes:
            module.training = training
