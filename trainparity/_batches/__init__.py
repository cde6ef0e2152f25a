"""_batches."""
