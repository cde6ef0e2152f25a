"""Observing a recipe's `step()` calls without changing the user's code.

`Observer` installs hooks and temporary wrappers on the objects of one State and removes
every one of them on exit, exceptions included:

- optimizer step pre/post hooks (`register_step_pre_hook`): steps per call, the gradients
  and learning rates at the moment of each step (unscaled when an enabled GradScaler has
  not unscaled them yet);
- tensor hooks on the parameters (optional): the gradient each call back-propagates, before
  anything (clipping, zeroing, the optimizer) touches `.grad`;
- instance wrappers on `scheduler.step`, `scaler.unscale_` and `scaler.update`;
- the clipping functions of `torch.nn.utils` and `torch.nn.utils.clip_grad`, and any of them
  imported into the recipe's own modules: which parameters were clipped, when, and on
  gradients that were still scaled;
- forward pre-hooks on batch-dependent modules (BatchNorm and friends) in training mode;
- dropout probabilities set to 0 (when asked).

The clipping functions are module attributes shared by the whole process, so in-process
observation holds a lock: two observed runs never overlap.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.utils.clip_grad as clip_grad
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from trainparity._compare import Snapshot
from trainparity._snapshot import flatten
from trainparity._state import State, optimizer_named_state_dict, parameter_names, state_objects

#: the clipping functions users call, by the name reports use
CLIP_FUNCTIONS: dict[Callable[..., Any], str] = {
    clip_grad.clip_grad_norm_: "clip_grad_norm_",
    clip_grad.clip_grad_norm: "clip_grad_norm",
    clip_grad.clip_grad_value_: "clip_grad_value_",
    torch.nn.utils.clip_grads_with_norm_: "clip_grads_with_norm_",
}
OBSERVATION_LOCK = threading.RLock()


def _grad_copy(tensor: torch.Tensor | None, scale: float | None) -> torch.Tensor | None:
    if tensor is None:
        return None
    copy = tensor.detach().to("cpu", copy=True)
    if copy.layout != torch.strided:  # sparse gradients (nn.Embedding(sparse=True)) compare as dense values
        copy = copy.to_dense()
    return copy / scale if scale is not None else copy


def _float(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class Observer:
    """Hooks on one State's objects; use as a context manager around the observed calls.

    Between `begin_call()` and `end_call()` everything observed is attributed to that call.
    `record_contributions` turns on the per-parameter gradient hooks (a copy per backward).
    """

    def __init__(
        self,
        state: State,
        recipe_type: type,
        *,
        disable_dropout: bool,
        record_contributions: bool,
    ) -> None:
        self.state = state
        self.recipe_type = recipe_type
        self.disable_dropout = disable_dropout
        self.record_contributions = record_contributions
        self.names = parameter_names(state)
        self.optimizers = dict(state_objects(state, torch.optim.Optimizer))
        self.schedulers = dict(state_objects(state, torch.optim.lr_scheduler.LRScheduler))
        self.modules = dict(state_objects(state, nn.Module))
        scalers = [v for _, v in state_objects(state, torch.amp.GradScaler) if v.is_enabled()]
        # With several enabled scalers we cannot tell which one scaled a gradient: record them as they are.
        self.scaler = scalers[0] if len(scalers) == 1 else None
        #: optimizer entry -> [(parameter name, parameter)] in param_groups order
        self.optimizer_parameters = {
            entry: [(self.names.get(id(p), f"{entry}.param{i}"), p) for i, p in enumerate(self._params_of(opt))]
            for entry, opt in self.optimizers.items()
        }
        self.owners: dict[int, str] = {}
        for entry, pairs in self.optimizer_parameters.items():
            for _, parameter in pairs:
                self.owners.setdefault(id(parameter), entry)
        self.unscaled: set[str] = set()
        self.call: dict[str, Any] | None = None
        self.call_index = 0
        self.step_events: dict[str, list[dict[str, Any]]] = {entry: [] for entry in self.optimizers}
        self.dropout: list[str] = []
        self.batch_dependent: set[str] = set()
        self._clip_records: list[dict[str, Any]] = []
        self._clip_depth = 0
        self._stack = contextlib.ExitStack()

    @staticmethod
    def _params_of(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
        for group in optimizer.param_groups:
            yield from group["params"]

    # -- installing and removing ------------------------------------------------------------------

    def __enter__(self) -> Observer:
        try:
            self._install()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def _install(self) -> None:
        stack = self._stack
        for entry, optimizer in self.optimizers.items():
            stack.callback(optimizer.register_step_pre_hook(functools.partial(self._before_step, entry)).remove)
            stack.callback(optimizer.register_step_post_hook(functools.partial(self._after_step, entry)).remove)
        for entry, scheduler in self.schedulers.items():
            self._wrap_method(scheduler, "step", functools.partial(self._scheduler_step, entry))
        if self.scaler is not None:
            self._wrap_method(self.scaler, "unscale_", self._unscale)
            self._wrap_method(self.scaler, "update", self._scaler_update)
        if self.record_contributions:
            for pairs in self.optimizer_parameters.values():
                for name, parameter in pairs:
                    if parameter.requires_grad:
                        hook = functools.partial(self._contribution, name)
                        stack.callback(parameter.register_hook(hook).remove)  # type: ignore[no-untyped-call]
        for entry, module in self.modules.items():
            for sub_name, sub in module.named_modules():
                path = f"{entry}.{sub_name}" if sub_name else entry
                if isinstance(sub, _BatchNorm):
                    hook = functools.partial(self._batch_dependent_forward, f"{path} ({type(sub).__name__})")
                    stack.callback(sub.register_forward_pre_hook(hook).remove)
                if self.disable_dropout:
                    self._disable_dropout(path, sub)
        self._patch_clipping()

    def _wrap_method(self, obj: Any, name: str, before: Callable[..., None]) -> None:
        """Shadow `obj.name` with an instance attribute that calls `before` first; undone on exit."""
        had_own = name in vars(obj)
        previous = vars(obj).get(name)
        method = getattr(obj, name)

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before(*args, **kwargs)
            return method(*args, **kwargs)

        setattr(obj, name, wrapper)

        def undo() -> None:
            if had_own:
                setattr(obj, name, previous)
            else:
                delattr(obj, name)

        self._stack.callback(undo)

    def _disable_dropout(self, path: str, module: nn.Module) -> None:
        attribute = "p" if isinstance(module, _DropoutNd) else "dropout" if isinstance(
            module, nn.MultiheadAttention) else None
        if attribute is None:
            return
        old = getattr(module, attribute)
        if old:
            setattr(module, attribute, 0.0)
            self._stack.callback(setattr, module, attribute, old)
            self.dropout.append(path)

    def _patch_clipping(self) -> None:
        # The recipe's modules too: `from torch.nn.utils import clip_grad_norm_` binds the name at import.
        namespaces: list[Any] = [torch.nn.utils, clip_grad]
        namespaces += [sys.modules[c.__module__] for c in self.recipe_type.__mro__ if c.__module__ in sys.modules]
        wrappers = {original: self._clip_wrapper(original, name) for original, name in CLIP_FUNCTIONS.items()}
        for namespace in dict.fromkeys(namespaces):
            for attribute, value in list(vars(namespace).items()):
                wrapper = next((w for original, w in wrappers.items() if value is original), None)
                if wrapper is not None:
                    setattr(namespace, attribute, wrapper)
                    self._stack.callback(setattr, namespace, attribute, value)

    # -- the hooks -----------------------------------------------------------------------------------

    def _scale_of(self, entry: str | None) -> float | None:
        """The factor that still multiplies `entry`'s gradients, or None when they are unscaled."""
        if self.scaler is None or entry in self.unscaled:
            return None
        return float(self.scaler.get_scale())

    def _before_step(self, entry: str, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.call is None:
            return
        scale = self._scale_of(entry)
        grads = {name: _grad_copy(p.grad, scale) for name, p in self.optimizer_parameters[entry]}
        # The gradients as they were before the first clip in this call: what the diagnosis compares.
        pre_clip: dict[str, torch.Tensor] = {}
        for record in self._clip_records:
            for name, grad in record["grads"].items():
                if name in grads and name not in pre_clip:
                    pre_clip[name] = grad
        self.step_events[entry].append({
            "call": self.call_index,
            "grads": grads,
            "pre_clip": pre_clip,
            "lr": [_float(group["lr"]) for group in optimizer.param_groups],
        })

    def _after_step(self, entry: str, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.unscaled.discard(entry)
        if self.call is not None:
            self.call["steps"][entry] += 1

    def _scheduler_step(self, entry: str, *args: Any, **kwargs: Any) -> None:
        if self.call is not None:
            self.call["scheduler_steps"][entry] += 1

    def _unscale(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        entry = next((e for e, o in self.optimizers.items() if o is optimizer), None)
        if entry is not None:
            self.unscaled.add(entry)

    def _scaler_update(self, *args: Any, **kwargs: Any) -> None:
        self.unscaled.clear()

    def _contribution(self, name: str, grad: torch.Tensor) -> None:
        if self.call is None:
            return
        scale = None if self.scaler is None else float(self.scaler.get_scale())
        copy = _grad_copy(grad, scale)
        assert copy is not None
        contributions: dict[str, torch.Tensor] = self.call["contribution"]
        contributions[name] = contributions[name] + copy if name in contributions else copy

    def _batch_dependent_forward(self, path: str, module: nn.Module, args: Any) -> None:
        if module.training:
            self.batch_dependent.add(path)

    def _clip_wrapper(self, original: Callable[..., Any], function: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if self._clip_depth == 0 and self.call is not None:
                # Materialize a generator once, so that the original sees the same parameters.
                parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                self._record_clip(function, parameters)
            self._clip_depth += 1
            try:
                return original(parameters, *args, **kwargs)
            finally:
                self._clip_depth -= 1

        return wrapper

    def _record_clip(self, function: str, parameters: list[torch.Tensor]) -> None:
        assert self.call is not None
        names = [self.names.get(id(p), "<unnamed>") for p in parameters]
        grads: dict[str, torch.Tensor | None] = {}
        scales: set[float] = set()
        for name, parameter in zip(names, parameters, strict=True):
            if parameter.grad is not None:
                scale = self._scale_of(self.owners.get(id(parameter)))
                grads[name] = _grad_copy(parameter.grad, scale)
                if scale is not None:
                    scales.add(scale)
        self._clip_records.append({"grads": grads})
        self.call["clips"].append({
            "function": function,
            "parameters": names,
            "scaled": bool(scales),  # the clip saw gradients a GradScaler still scaled
            "scale": max(scales) if scales else None,
        })

    # -- calls ---------------------------------------------------------------------------------------

    def begin_call(self, index: int) -> None:
        self.call_index = index
        self._clip_records = []
        self.call = {
            "steps": dict.fromkeys(self.optimizers, 0),
            "scheduler_steps": dict.fromkeys(self.schedulers, 0),
            "clips": [],
            "contribution": {},
        }

    def end_call(self) -> dict[str, Any]:
        assert self.call is not None
        call, self.call = self.call, None
        self._clip_records = []
        return call

    def take_step_events(self) -> dict[str, list[dict[str, Any]]]:
        """The step events since the last call of this method, per optimizer entry."""
        events = self.step_events
        self.step_events = {entry: [] for entry in self.optimizers}
        return events

    def zero_grad(self) -> None:
        """Set every observed parameter's gradient to None (how the reference starts a window)."""
        for module in self.modules.values():
            for parameter in module.parameters():
                parameter.grad = None
        for pairs in self.optimizer_parameters.values():
            for _, tensor in pairs:
                tensor.grad = None

    def end_state(self) -> dict[str, Snapshot]:
        """Parameters, optimizer state (keyed by parameter name) and scheduler state, by report path."""
        parameters: Snapshot = {}
        for module in self.modules.values():
            for parameter in module.parameters():
                name = self.names.get(id(parameter))
                if name is not None and f"parameters.{name}" not in parameters:
                    parameters[f"parameters.{name}"] = parameter.detach().to("cpu", copy=True)
        optimizer: Snapshot = {}
        for entry, opt in self.optimizers.items():
            prefix = "optimizer" if len(self.optimizers) == 1 else f"optimizer.{entry}"
            flatten(prefix, optimizer_named_state_dict(opt, self.names), optimizer)
        scheduler: Snapshot = {}
        for entry, sched in self.schedulers.items():
            prefix = "scheduler" if len(self.schedulers) == 1 else f"scheduler.{entry}"
            flatten(prefix, sched.state_dict(), scheduler)
        return {"parameters": parameters, "optimizer": optimizer, "scheduler": scheduler}
