"""_resume."""
