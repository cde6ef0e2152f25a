"""The recipe: the user's training semantics, and how a check calls it and rebuilds it in a fresh process.

- `_recipe`: `tp.Recipe`, `tp.LossAccounting`, and the calls every check makes through it;
- `_reference`: `RecipeRef`, what travels to a child instead of the recipe, and `resolve_recipe`;
- `_spec`: recipe specs (`package.module:Class(k=1)`, `path/to/file.py:Class`);
- `_modules`: loading a recipe's module by name or from its file.
"""
