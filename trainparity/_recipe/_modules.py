"""Loading a recipe's module in a fresh process: by name, or from its file where the name does not import it."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any

from trainparity._process import _session

#: module names under which files that cannot be imported by name are loaded (a script run as __main__,
#: a `path/to/file.py:Class` spec); reports show the file's stem instead
ALIAS_PREFIX = "__trainparity_"


MAIN_ALIAS = "__trainparity_main__"


def attribute(module: ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def import_module(name: str) -> ModuleType:
    # The import statement's machinery, unlike importlib.import_module, drops importlib's own frames from the
    # traceback of an error raised while the module executes: the report shows the user's frames only.
    if name not in sys.modules:  # (a module already imported may have no importable parent package)
        __import__(name)
    return sys.modules[name]


def import_attribute(module_name: str, qualname: str) -> Any:
    return attribute(import_module(module_name), qualname)


def origin(name: str) -> str | None:
    """The file that importing `name` would execute, or None when the name does not import."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None or spec.origin is None else str(pathlib.Path(spec.origin).resolve())


def load_module(name: str, file: str | None) -> ModuleType:
    """The module `name`: imported by name, or, where that name does not import `file`, executed from `file`
    under that name (as pytest's --import-mode=importlib does with test modules)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    with _session.importing(name):
        if file is None or origin(name) == file:
            return import_module(name)
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load module {name!r} from {file}", name=name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


def module_file(module: ModuleType | None) -> str | None:
    file = getattr(module, "__file__", None)
    return str(pathlib.Path(file).resolve()) if isinstance(file, str) and file.endswith(".py") else None
