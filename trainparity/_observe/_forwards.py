"""Observing the forward passes of a State's modules: in which mode they ran, what they changed and drew.

`ForwardRecorder` is the watch (`_hooks.Watch`) that the train-mode and frozen checks hand the `Observer`. It
records dropout as the recipe has it: it is not given with `_watches.DropoutOff`. While it is installed:

- global module forward pre/post hooks (`torch.nn.modules.module.register_module_forward_pre_hook`) see every
  forward of a State module. The outermost one is a *pass*: its grad and inference mode, whether it drew from
  torch's RNG streams, and, through tensor hooks on its outputs (removed when the call ends), whether a
  backward pass went through them, which tells a forward that builds the loss from an evaluation. A module that
  runs in train mode has its own buffers compared before and after its forward;
- `nn.Module.training` is a property: a read during a pass says that the module's behaviour depends on its mode
  (dropout, batch norm, and any forward that reads `self.training`), a write that changes it records who switched
  it (`model.eval() in Trainer.evaluate (train.py:88)`);
- the functional dropouts are wrapped: which module called one that dropped, and in which mode.

All of it is process-wide, like the Observer's patches: observed runs hold `OBSERVATION_LOCK`, and only the
thread that installed the recorder is recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.dropout import _DropoutNd
from torch.utils.hooks import RemovableHandle

from trainparity._observe._hooks import DROPOUT_FUNCTIONS, Watch, patch_functions
from trainparity._observe._records import CallRecord, ForwardPass, ForwardRecord, ModeSwitch
from trainparity._state._compare import bitwise_equal
from trainparity._state._entries import State, buffer_names, module_names, module_prefixes
from trainparity._state._rng import torch_rng_states

#: modules that read `training` only to pick a faster kernel for the same result
_FAST_PATH_ONLY = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder,
                   nn.TransformerDecoder)
#: how deep a forward's output is searched for tensors (tuples, dicts, dataclasses)
_OUTPUT_DEPTH = 4
#: the frames of torch's own mode switching, passed over to find who called it
_MODULE_FILE = os.path.normcase(module_hooks.__file__)


def mode_matters(module: nn.Module) -> bool:
    """Whether a module that reads its `training` behaves differently in train and eval mode: not a dropout of
    probability 0, a norm layer without running statistics (it normalizes by the batch in both), nor a layer that
    only picks a faster kernel."""
    if isinstance(module, _DropoutNd):
        return bool(module.p)
    if isinstance(module, nn.MultiheadAttention):
        return bool(module.dropout)
    if isinstance(module, _NormBase):
        return bool(module.track_running_stats)
    return not isinstance(module, _FAST_PATH_ONLY)


def _dense(tensor: torch.Tensor) -> bool:
    """A buffer whose values a forward may update in place and the recorder compares as they are (a sparse,
    nested or quantized one is compared by the frozen check's watch only)."""
    return tensor.layout == torch.strided and not tensor.is_quantized and not tensor.is_nested


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors of a forward's output: in tuples, lists, dicts (a transformers ModelOutput) and dataclasses."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < _OUTPUT_DEPTH:
        if isinstance(value, (list, tuple)):
            items: Any = value
        elif isinstance(value, Mapping):
            items = value.values()
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            items = [getattr(value, field.name) for field in dataclasses.fields(value)]
        else:
            return
        for item in items:
            yield from _tensors(item, depth + 1)


@dataclasses.dataclass
class _Running:
    """A forward of a State module that has not returned yet."""

    module: nn.Module
    name: str
    #: its own buffers before its forward, when it runs in train mode
    buffers: dict[str, torch.Tensor] | None
    #: a forward that autograd runs again during the backward pass (activation checkpointing): not recorded
    recomputed: bool


class ForwardRecorder(Watch):
    """Records the forward passes of one State's modules, per `step()` call (into `CallRecord.forwards`)."""

    def __init__(self, state: State, recipe_type: type) -> None:
        super().__init__()
        self.recipe_type = recipe_type
        self.names = module_names(state)
        names = buffer_names(state)
        self.modules = {id(sub): sub for _, _, module in module_prefixes(state) for sub in module.modules()}
        #: module id -> {buffer attribute: buffer name}, for the modules that hold buffers of their own
        self.own_buffers = {key: {attribute: names[id(buffer)] for attribute, buffer in module._buffers.items()
                                  if buffer is not None and id(buffer) in names}
                            for key, module in self.modules.items() if module._buffers}
        #: module name -> [its class's name, "dropout", "norm" or "other"], for every module that read its `training`
        #: in a pass or called a functional dropout that dropped
        self.kinds: dict[str, list[str]] = {}
        #: the modules in eval mode right after setup()
        self.eval_after_setup = [self.names[key] for key, module in self.modules.items()
                                 if not vars(module).get("training", True)]
        self._thread = threading.get_ident()
        self._running: list[_Running] = []
        self._pass: ForwardPass | None = None
        self._rng_before: list[torch.Tensor] = []
        self._handles: list[RemovableHandle] = []
        self._step = 0
        self._inside = False
        self._record = ForwardRecord()
        self._order = itertools.count()

    # -- installing and removing ------------------------------------------------------------------

    def _install(self) -> None:
        stack = self._stack
        stack.callback(module_hooks.register_module_forward_pre_hook(self._before_forward).remove)
        stack.callback(module_hooks.register_module_forward_hook(self._after_forward, always_call=True).remove)
        missing = object()
        previous = vars(nn.Module).get("training", missing)
        # setattr: the class declares `training: bool`, and this is a property for the observation's time
        setattr(nn.Module, "training", property(self._read_training, self._write_training))  # noqa: B010
        stack.callback(lambda: delattr(nn.Module, "training") if previous is missing
                       else setattr(nn.Module, "training", previous))
        patch_functions(stack, self.recipe_type, {f: spec.name for f, spec in DROPOUT_FUNCTIONS.items()},
                        self._dropout_wrapper)
        stack.callback(self._remove_output_hooks)

    # -- calls ------------------------------------------------------------------------------------

    def begin_call(self, index: int) -> None:
        self._step, self._inside = index, True
        self._running.clear()
        self._pass = None

    def end_call(self, call: CallRecord) -> None:
        self._inside = False
        self._running.clear()
        self._pass = None
        self._remove_output_hooks()
        call.forwards, self._record = self._record, ForwardRecord()

    def _remove_output_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- the hooks --------------------------------------------------------------------------------

    def _watching(self) -> bool:
        return self._inside and threading.get_ident() == self._thread

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        if name is None or not self._watching():
            return
        recomputed = bool(self._running and self._running[-1].recomputed)
        if not self._running:
            recomputed = torch._C._current_autograd_node() is not None
            if not recomputed:
                self._pass = ForwardPass(name, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                                         any(p.requires_grad for p in module.parameters()), order=next(self._order))
                self._rng_before = torch_rng_states()
        own = self.own_buffers.get(id(module))
        before = None
        if own and vars(module).get("training", False) and not recomputed:
            buffers = {attribute: module._buffers.get(attribute) for attribute in own}
            before = {attribute: buffer.detach().clone() for attribute, buffer in buffers.items()
                      if buffer is not None and _dense(buffer)}
        self._running.append(_Running(module, name, before, recomputed))

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._running or self._running[-1].module is not module or not self._watching():
            return
        running = self._running.pop()
        current = self._pass
        if running.recomputed or current is None:
            return
        if running.buffers is not None:
            own = self.own_buffers[id(module)]
            for attribute, before in running.buffers.items():
                after = module._buffers.get(attribute)
                changed = after is not None and not bitwise_equal(before, after.detach())
                if changed and own[attribute] not in current.buffers:
                    current.buffers.append(own[attribute])
        if self._running:
            return
        current.rng = any(not torch.equal(before, after) for before, after in zip(self._rng_before,
                                                                                 torch_rng_states(), strict=True))
        for tensor in _tensors(output):
            if tensor.requires_grad:
                current.reached = False
                hook = functools.partial(self._reached, current)
                self._handles.append(tensor.register_hook(hook))  # type: ignore[no-untyped-call]
        self._record.passes.append(current)
        self._pass = None

    @staticmethod
    def _reached(forward: ForwardPass, grad: torch.Tensor) -> None:
        forward.reached = True

    def _read_training(self, module: nn.Module) -> bool:
        try:
            training: bool = vars(module)["training"]
        except KeyError:
            raise AttributeError("training") from None
        current = self._pass
        if current is not None and self._running and not self._running[-1].recomputed and self._watching():
            name = self.names.get(id(module))
            if name is not None and mode_matters(module) and all(name != seen for seen, _ in current.modes):
                current.modes.append([name, training])
                self._kind(name, module)
        return training

    def _write_training(self, module: nn.Module, training: bool) -> None:
        before = vars(module).get("training")
        vars(module)["training"] = training
        name = self.names.get(id(module))
        if name is not None and before is not None and before != training and threading.get_ident() == self._thread:
            step = self._step if self._inside else self._step + 1
            site = self._switch_site(sys._getframe(1), bool(training))
            self._record.switches.append(ModeSwitch(name, bool(training), step, self._inside, site, next(self._order)))

    def _kind(self, name: str, module: nn.Module) -> None:
        category = ("dropout" if isinstance(module, (_DropoutNd, nn.MultiheadAttention)) else
                    "norm" if isinstance(module, _NormBase) else "other")
        self.kinds.setdefault(name, [type(module).__name__, category])

    def _switch_site(self, frame: FrameType | None, training: bool) -> str:
        """`model.eval() in Trainer.evaluate (train.py:88)`: the outermost `train()`/`eval()` of a module on the
        stack (a module's own override included) and its caller; for a plain assignment, where it was made."""
        outermost: tuple[FrameType, nn.Module] | None = None
        caller = None
        while frame is not None:
            code = frame.f_code
            if code.co_name in ("train", "eval"):
                owner = frame.f_locals.get("self")
                if isinstance(owner, nn.Module):
                    outermost = (frame, owner)
            elif caller is None and os.path.normcase(code.co_filename) != _MODULE_FILE:
                caller = frame
            frame = frame.f_back
        if outermost is not None:
            frame, owner = outermost
            method = frame.f_code.co_name
            name = self.names.get(id(owner), type(owner).__name__)
            arguments = "" if method == "eval" or training else "False"
            call, caller = f"{name}.{method}({arguments})", frame.f_back
        else:
            call = f"training = {training}"
        if caller is None:
            return call
        code = caller.f_code
        return f"{call} in {code.co_qualname} ({os.path.basename(code.co_filename)}:{caller.f_lineno})"

    def _dropout_wrapper(self, original: Callable[..., Any], function: str) -> Callable[..., Any]:
        spec = DROPOUT_FUNCTIONS[original]

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            current = self._pass
            if current is not None and self._running and self._watching() and spec.drops(args, kwargs):
                caller = self._running[-1]
                entry = [caller.name, function, bool(vars(caller.module).get("training", False))]
                if entry not in current.dropouts:
                    current.dropouts.append(entry)
                    self._kind(caller.name, caller.module)
            return original(*args, **kwargs)

        return wrapper

