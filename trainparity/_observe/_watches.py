"""The watches a check may hand the `Observer` beside its own hooks: dropout switched off, and the batch-dependent
modules (BatchNorm and friends) that ran in training mode. (`_forwards.ForwardRecorder` is the third.)"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from trainparity._observe._hooks import DROPOUT_FUNCTIONS, Watch, patch_functions
from trainparity._observe._records import Dropout
from trainparity._state._entries import State, state_objects, unwrap_module


def named_modules(state: State) -> list[tuple[str, nn.Module]]:
    """Every module of the State's modules, by its path from the State entry (`model.encoder.0`)."""
    return [(f"{entry}.{name}" if name else entry, sub)
            for entry, module in state_objects(state, nn.Module) for name, sub in unwrap_module(module).named_modules()]


class DropoutOff(Watch):
    """Dropout switched off for the run: the probability of the State's dropout modules set to 0, and the functional
    dropouts (of `torch.nn.functional` and where the recipe's modules imported them) run with probability 0. `record`
    says what it switched off, and which were off already."""

    def __init__(self, state: State, recipe_type: type) -> None:
        super().__init__()
        self.modules = named_modules(state)
        self.recipe_type = recipe_type
        self.record = Dropout()

    def _install(self) -> None:
        for path, module in self.modules:
            attribute = "p" if isinstance(module, _DropoutNd) else "dropout" if isinstance(
                module, nn.MultiheadAttention) else None
            if attribute is None:
                continue
            old = getattr(module, attribute)
            if old:
                setattr(module, attribute, 0.0)
                self._stack.callback(setattr, module, attribute, old)
                self.record.modules.append(path)
            else:
                self.record.inactive.append(path)
        patch_functions(self._stack, self.recipe_type, {f: spec.name for f, spec in DROPOUT_FUNCTIONS.items()},
                        self._wrapper)

    def _wrapper(self, original: Callable[..., Any], function: str) -> Callable[..., Any]:
        spec = DROPOUT_FUNCTIONS[original]

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # only an active dropout is worth naming
            if spec.drops(args, kwargs) and function not in self.record.functions:
                self.record.functions.append(function)
            args, kwargs = spec.without_dropout(args, kwargs)
            return original(*args, **kwargs)

        return wrapper


class BatchDependentModules(Watch):
    """The batch-dependent modules (BatchNorm and friends, whose output depends on the whole batch) that ran in
    training mode (`mode="fail"`: recorded), or that were run in eval mode for the run (`mode="eval"`); `ran` names
    them, as reports do: `model.bn (BatchNorm1d)`."""

    def __init__(self, state: State, mode: str = "fail") -> None:
        super().__init__()
        self.modules = [(f"{path} ({type(module).__name__})", module) for path, module in named_modules(state)
                        if isinstance(module, _BatchNorm)]
        self.mode = mode
        self.ran: set[str] = set()

    def _install(self) -> None:
        for described, module in self.modules:
            self._stack.callback(module.register_forward_pre_hook(functools.partial(self._forward, described)).remove)
            if self.mode == "eval":
                self._stack.callback(module.register_forward_hook(self._restore_mode).remove)

    def _forward(self, described: str, module: nn.Module, args: Any) -> None:
        if not module.training:
            return
        self.ran.add(described)
        if self.mode == "eval":
            module.training = False
            module._tp_restore_training = True  # type: ignore[assignment]

    @staticmethod
    def _restore_mode(module: nn.Module, args: Any, output: Any) -> None:
        if vars(module).pop("_tp_restore_training", False):
            module.training = True
