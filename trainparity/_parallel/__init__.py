"""_parallel."""
