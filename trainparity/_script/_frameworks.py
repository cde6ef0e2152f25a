"""What a framework's checkpoint code holds, so that a script check's report names the line to change.

A script that checkpoints with Ignite's `Checkpoint(to_save, ...)` or Accelerate's `accelerator.save_state`
saves what it was told to: `to_save`'s entries, or the objects the accelerator prepared and those
registered with `register_for_checkpointing`. The hook learns them as the script builds them (patched as
the script imports the framework, never imported here), and tells, for each State entry of the script
(`model`, `optimizer`, `scheduler`, ...), which of those holds it, or that none does; the report adds
that sentence to what the checkpoint lost.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

#: attributes through which a framework's wrapper holds the object it wraps (Ignite's LRScheduler, Accelerate's
#: AcceleratedScheduler and AcceleratedOptimizer, DDP and compiled modules)
WRAPPED = ("lr_scheduler", "scheduler", "optimizer", "module", "_orig_mod")


def _holds(holder: object, target: object) -> bool:
    """Whether `holder` is `target` or a wrapper (a few attributes deep) around it."""
    pending: list[object] = [holder]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is target:
            return True
        if id(current) in seen or len(seen) > 16:
            continue
        seen.add(id(current))
        pending += [getattr(current, name) for name in WRAPPED if hasattr(current, name)]
    return False


def _holds_any(holder: object, entry: object) -> bool:
    """Whether `holder` holds the State entry, or one of the objects of an entry that is a list of them."""
    return any(_holds(holder, item) for item in entry) if isinstance(entry, list) else _holds(holder, entry)


@dataclasses.dataclass
class FrameworkObjects:
    """The checkpoint holders a script built, in the order it built them."""

    #: Ignite: each `Checkpoint`'s `to_save`, and the engines (trainers) the script built
    ignite_to_save: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    ignite_engines: list[Any] = dataclasses.field(default_factory=list)
    #: Accelerate: the accelerators whose `save_state` the script called
    accelerators: list[Any] = dataclasses.field(default_factory=list)

    def patches(self) -> dict[str, Callable[[types.ModuleType], None]]:
        """The modules to patch as the script imports them, and how."""
        return {"ignite.handlers.checkpoint": self._patch_ignite_checkpoint,
                "ignite.engine.engine": self._patch_ignite_engine,
                "accelerate.accelerator": self._patch_accelerator}

    def _patch_ignite_checkpoint(self, module: types.ModuleType) -> None:
        checkpoint = module.Checkpoint
        init = checkpoint.__init__

        @functools.wraps(init)
        def observed_init(instance: Any, to_save: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
            init(instance, to_save, *args, **kwargs)
            self.ignite_to_save.append(dict(to_save))

        checkpoint.__init__ = observed_init

    def _patch_ignite_engine(self, module: types.ModuleType) -> None:
        engine = module.Engine
        init = engine.__init__

        @functools.wraps(init)
        def observed_init(instance: Any, *args: Any, **kwargs: Any) -> None:
            init(instance, *args, **kwargs)
            self.ignite_engines.append(instance)

        engine.__init__ = observed_init

    def _patch_accelerator(self, module: types.ModuleType) -> None:
        accelerator = module.Accelerator
        save_state = accelerator.save_state

        @functools.wraps(save_state)
        def observed_save_state(instance: Any, *args: Any, **kwargs: Any) -> Any:
            if all(instance is not known for known in self.accelerators):
                self.accelerators.append(instance)
            return save_state(instance, *args, **kwargs)

        accelerator.save_state = observed_save_state

    def holders(self, entries: Mapping[str, Any]) -> dict[str, str]:
        """For each State entry (and `data.sample_ids`, where the trainer's position lives), the sentence that says
        which checkpoint holder saves it, or that none does."""
        said: dict[str, str] = {}
        for to_save in self.ignite_to_save:
            keys = ", ".join(repr(key) for key in to_save)
            for entry, value in entries.items():
                key = next((k for k, holder in to_save.items() if _holds_any(holder, value)), None)
                said[entry] = (f"Ignite's Checkpoint saves {entry} under to_save key {key!r}." if key is not None else
                               f"Ignite's Checkpoint does not save {entry}: its to_save has the keys {keys}; add it "
                               "there (and to the to_load of Checkpoint.load_objects).")
            if self.ignite_engines and not any(_holds(holder, engine) for holder in to_save.values()
                                               for engine in self.ignite_engines):
                said["data.sample_ids"] = (f"Ignite's Checkpoint does not save the trainer Engine, whose state holds "
                                           f"the epoch and the iteration the data stream resumes at: its to_save has "
                                           f"the keys {keys}; add the trainer.")
        for accelerator in self.accelerators:
            kinds = {"prepared model": getattr(accelerator, "_models", []),
                     "prepared optimizer": getattr(accelerator, "_optimizers", []),
                     "prepared scheduler": getattr(accelerator, "_schedulers", []),
                     "prepared dataloader": getattr(accelerator, "_dataloaders", []),
                     "object registered with register_for_checkpointing": getattr(accelerator, "_custom_objects", [])}
            for entry, value in entries.items():
                found = next(((kind, index) for kind, objects in kinds.items() for index, holder in enumerate(objects)
                              if _holds_any(holder, value)), None)
                said[entry] = (f"accelerator.save_state saves {entry} as its {found[0]} number {found[1]}."
                               if found is not None else
                               f"accelerator.save_state does not save {entry}: it is neither prepared by "
                               "accelerator.prepare nor registered with accelerator.register_for_checkpointing.")
        return said
