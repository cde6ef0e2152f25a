"""_process."""
