"""The watches a check may hand the `Observer` beside its own hooks: dropout switched off, the batch-dependent
modules (BatchNorm and friends) that ran in training mode, and float64 mode's refusal of an operation that computes
below float64. (`_forwards.ForwardRecorder` is the fourth.)"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.overrides import TorchFunctionMode

from trainparity._observe._hooks import DROPOUT_FUNCTIONS, Watch, patch_functions
from trainparity._observe._records import CallRecord, Dropout
from trainparity._state._entries import State, state_objects, unwrap_module
from trainparity._state._precision import FORCED_PRECISION_HINT, PrecisionError


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


class Float64Only(Watch):
    """In float64 mode, the first operation of an observed `step()` call whose result is a floating (or complex)
    tensor below float64 raises `PrecisionError`, naming the operation and the module it ran in: a float64 check
    cannot judge code that computes part of the step in float32 (`.float()`, an explicit dtype). It sees the ops called
    from Python (a `TorchFunctionMode`, thread-local, pushed for the call only) outside torch's own package, whose
    float32 (GradScaler's scale) is deliberate."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.modules = named_modules(state)
        #: the paths of the State's modules whose forward is running, innermost last
        self.running: list[str] = []
        self._mode: _Float64Mode | None = None

    def _install(self) -> None:
        for path, module in self.modules:
            self._stack.callback(module.register_forward_pre_hook(functools.partial(self._enter, path)).remove)
            self._stack.callback(module.register_forward_hook(self._leave, always_call=True).remove)
        self._stack.callback(self._pop)

    def _enter(self, path: str, module: nn.Module, args: Any) -> None:
        self.running.append(path)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.running:
            self.running.pop()

    def begin_call(self, index: int) -> None:
        self.running.clear()
        self._mode = _Float64Mode(self)
        self._mode.__enter__()  # type: ignore[no-untyped-call, unused-ignore]

    def end_call(self, call: CallRecord) -> None:
        self._pop()

    def _pop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call, unused-ignore]


#: the dtypes a float64 run computes in: float64, and complex128 for complex values
_FLOAT64_DTYPES = (torch.float64, torch.complex128)
#: ops torch's own Python code calls below float64 on purpose (GradScaler's float32 scale) are its business
_TORCH_DIRECTORY = os.path.dirname(torch.__file__) + os.sep
#: torch's files that only hand a call on (`F.softmax(x, dtype=torch.float32)` reaches the mode from
#: `torch/overrides.py` through `torch/nn/functional.py`): who called them is who called the op
_HANDING_ON = tuple(os.path.join(_TORCH_DIRECTORY, *name.split("/")) for name in (
    "overrides.py", "nn/functional.py", "functional.py", "_tensor.py"))


def _called_by_torch() -> bool:
    """Whether the op the mode sees was called by torch's own Python code, past the files that only hand calls on."""
    frame = sys._getframe(2)  # the caller of `__torch_function__`
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_HANDING_ON):
        frame = frame.f_back
    return frame.f_code.co_filename.startswith(_TORCH_DIRECTORY)


class _Float64Mode(TorchFunctionMode):
    def __init__(self, watch: Float64Only) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        for tensor in (result,) if isinstance(result, torch.Tensor) else result if isinstance(
                result, (tuple, list)) else ():
            if isinstance(tensor, torch.Tensor) and (tensor.is_floating_point() or tensor.is_complex()) \
                    and tensor.dtype not in _FLOAT64_DTYPES and not _called_by_torch():
                self._refuse(func, tensor.dtype)
        return result

    def _refuse(self, func: Any, dtype: torch.dtype) -> None:
        name = getattr(func, "__name__", repr(func))
        owner = getattr(func, "__objclass__", None)
        if owner is not None and issubclass(owner, torch._C.TensorBase):
            op = f"Tensor.{name}"
        else:
            op = f"{getattr(func, '__module__', None) or 'torch'}.{name}".replace("torch.nn.functional.", "F.")
        where = f" in {self.watch.running[-1]}" if self.watch.running else ""
        dtype_name = str(dtype).removeprefix("torch.")
        raise PrecisionError(f"{op}{where} computed in {dtype_name}: "
                             + FORCED_PRECISION_HINT.format(dtype=dtype_name))
