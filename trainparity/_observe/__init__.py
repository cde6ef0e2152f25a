"""_observe."""
