"""Batches: splitting them into micro-batches (`_split`, `tp.split_batch`), reading their sample IDs
(`_sample_ids`, which needs only numpy and torch, so that coverage stands on its own), and reading the user's
iterables of them guarded (`_reading`: failures and timeouts as ERROR results, iterators let go of)."""
