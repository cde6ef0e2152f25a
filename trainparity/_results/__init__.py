"""_results."""
