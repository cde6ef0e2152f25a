"""_recipe."""
