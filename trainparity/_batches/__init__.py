"""Batches: splitting them into micro-batches (`_split`, `tp.split_batch`) and reading their sample IDs
(`_sample_ids`, which needs only numpy and torch, so that coverage stands on its own)."""
