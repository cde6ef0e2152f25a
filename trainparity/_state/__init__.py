"""State walking and comparison, shared by every check: one walk, one path vocabulary, one message builder.

- `_entries`: `tp.State` and the walk over its entries (`entry_components`), which snapshots and the
  reference checkpoint both follow;
- `_rng`: the global RNG streams (seeding, capture, restore);
- `_checkpoint`: `tp.save_state` and `tp.load_state`;
- `_snapshot`: a State flattened into `{dotted path: leaf}`; `_digest`: what a large tensor travels as;
- `_tensors`: every kind of tensor (sparse, quantized, nested, meta, exotic dtypes) made readable;
- `_compare`: declared comparisons and the torch.testing-style mismatch messages;
- `_precision`: running and judging in float64.
"""
