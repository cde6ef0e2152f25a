"""Observing a recipe's `step()` calls without changing the user's code.

`Observer` installs hooks and temporary wrappers on the objects of one State and removes
every one of them on exit, exceptions included:

- optimizer step pre/post hooks (`register_step_pre_hook`): steps per call, the gradients
  and learning rates at the moment of each step (unscaled when an enabled GradScaler has
  not unscaled them yet, and whether the step took them still scaled), the RNG streams there,
  and (when asked) which of the gradients the step took held an inf or a NaN;
- tensor hooks on the parameters (optional): the gradient each call back-propagates, before
  anything (clipping, zeroing, the optimizer) touches `.grad`;
- instance wrappers on `scheduler.step`, `scaler.unscale_`, `scaler.step` (which optimizer steps ran
  inside it, and which it skipped) and `scaler.update` (the loss scale it left);
- the clipping functions of `torch.nn.utils` and `torch.nn.utils.clip_grad`, and any of them
  imported into the recipe's own modules: which parameters were clipped, when, and on
  gradients that were still scaled;
- forward pre-hooks on batch-dependent modules (BatchNorm and friends): which ran in training
  mode, or (batch_dependent="eval") running them in eval mode;
- dropout (when asked): the probabilities of dropout modules set to 0, and the functional
  dropouts of `torch.nn.functional` (also `scaled_dot_product_attention(dropout_p=...)`, which
  `nn.MultiheadAttention` calls) run with probability 0;
- the forward passes of the State's modules (when asked): in which mode they ran, what they
  changed and drew, who switched a module's mode (`_forwards.ForwardRecorder`).

The clipping and dropout functions are module attributes shared by the whole process, so
in-process observation holds a lock: two observed runs never overlap.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.utils.clip_grad as clip_grad
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.parameter import is_lazy

from trainparity._compat import GradScaler
from trainparity._observe._forwards import ForwardRecorder
from trainparity._observe._hooks import (
    DROPOUT_FUNCTIONS,
    HookSet,
    creates_state,
    grad_copy,
    nonfinite_flags,
    patch_functions,
    step_closure,
    tensor_norms,
)
from trainparity._observe._records import CallRecord, Clip, Dropout, ScalerStep, StepEvent
from trainparity._state._entries import State, parameter_names, state_objects, unwrap_module
from trainparity._state._rng import rng_fingerprint

#: the clipping functions users call, by the name reports use
CLIP_FUNCTIONS: dict[Callable[..., Any], str] = {
    clip_grad.clip_grad_norm_: "clip_grad_norm_",
    clip_grad.clip_grad_norm: "clip_grad_norm",
    clip_grad.clip_grad_value_: "clip_grad_value_",
    torch.nn.utils.clip_grads_with_norm_: "clip_grads_with_norm_",
}
OBSERVATION_LOCK = threading.RLock()
#: how many gradient elements (over all parameters) a diagnosis sample keeps, about
SAMPLE_ELEMENTS = 1 << 20


def _float(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class Observer(HookSet):
    """Hooks on one State's objects; use as a context manager around the observed calls.

    Between `begin_call()` and `end_call()` everything observed is attributed to that call.
    `record_contributions` turns on the per-parameter gradient hooks (a sample per backward).
    `before_step(entry, optimizer)` runs in every optimizer step pre-hook, first, and `after_step(entry,
    optimizer)` in every post-hook, last (neither for a step that only creates an optimizer's state).
    `record_forwards` records the forward passes of each call (`CallRecord.forwards`). `fingerprint_rng=False`
    leaves the RNG fingerprints of calls and steps empty (each costs a fraction of a millisecond).
    `record_grads=False` leaves the step events' gradients and the clip records' gradient samples empty: a caller
    that reads what it needs of the gradients in its step callbacks spares a copy of every gradient per step.
    `check_finite` names, in each step event, the parameters whose gradient held an inf or a NaN when the step took
    it (`StepEvent.nonfinite`, one fused reduction per step, no copy), and whether `scaler.step()` told a fused
    optimizer to skip the update (`StepEvent.told_to_skip`).

    What serves only to diagnose (the contributions, the gradients before a clip) is kept as a
    sample of at most about `SAMPLE_ELEMENTS` elements over all parameters, so that observing a
    large model costs little more than training it.
    """

    def __init__(
        self,
        state: State,
        recipe_type: type,
        *,
        disable_dropout: bool,
        record_contributions: bool,
        batch_dependent: str = "fail",
        before_step: Callable[[str, torch.optim.Optimizer], None] | None = None,
        after_step: Callable[[str, torch.optim.Optimizer], None] | None = None,
        record_forwards: bool = False,
        fingerprint_rng: bool = True,
        record_grads: bool = True,
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        self.state = state
        self.record_grads = record_grads
        self.check_finite = check_finite
        self._rng_fingerprint: Callable[[], str] = rng_fingerprint if fingerprint_rng else str
        self.recipe_type = recipe_type
        self.disable_dropout = disable_dropout
        self.record_contributions = record_contributions
        self.batch_dependent_mode = batch_dependent
        self.before_step_callback = before_step
        self.after_step_callback = after_step
        self.forwards = ForwardRecorder(state, recipe_type) if record_forwards else None
        self.names = parameter_names(state)
        self.optimizers = dict(state_objects(state, torch.optim.Optimizer))
        self.schedulers = dict(state_objects(state, torch.optim.lr_scheduler.LRScheduler))
        self.modules = {entry: unwrap_module(module) for entry, module in state_objects(state, nn.Module)}
        scalers = [v for _, v in state_objects(state, GradScaler) if v.is_enabled()]
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
        #: optimizers whose running `step()` only creates their state (`creates_state`)
        self._creating_state: set[str] = set()
        #: optimizers whose running `step(closure)` computes its gradients: they are read in the post-hook
        self._closure_steps: set[str] = set()
        self.call: CallRecord | None = None
        self.call_index = 0
        self.step_events: dict[str, list[StepEvent]] = {entry: [] for entry in self.optimizers}
        self._steps_seen = 0
        #: the `scaler.step()` call running now, if any
        self._scaler_step: ScalerStep | None = None
        self.dropout = Dropout()
        #: batch-dependent modules that ran in training mode ("fail") or were run in eval mode ("eval")
        self.batch_dependent: set[str] = set()
        self._clip_records: list[dict[str, torch.Tensor | None]] = []
        self._clip_depth = 0
        #: (optimizer entry, its step's index since `take_step_events`, parameter name, live gradient) -> a tensor
        #: of a run observed before, held instead of a copy where the gradient agrees with it (`_snapshot.Sharing`)
        self.share_gradient: Callable[[str, int, str, torch.Tensor], torch.Tensor | None] | None = None

    @staticmethod
    def _params_of(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
        for group in optimizer.param_groups:
            yield from group["params"]

    # -- installing and removing ------------------------------------------------------------------

    def _install(self) -> None:
        stack = self._stack
        for entry, optimizer in self.optimizers.items():
            stack.callback(optimizer.register_step_pre_hook(functools.partial(self._before_step, entry)).remove)
            stack.callback(optimizer.register_step_post_hook(functools.partial(self._after_step, entry)).remove)
        for entry, scheduler in self.schedulers.items():
            self._wrap_method(scheduler, "step", functools.partial(self._scheduler_step, entry))
        if self.scaler is not None:
            self._wrap_method(self.scaler, "unscale_", self._unscale)
            self._wrap_method(self.scaler, "step", self._scaler_step_begin, self._scaler_step_end)
            self._wrap_method(self.scaler, "update", self._scaler_update, self._scaler_updated)
        if self.record_contributions:
            lazy: list[tuple[str, torch.Tensor]] = []
            for pairs in self.optimizer_parameters.values():
                for name, parameter in pairs:
                    if is_lazy(parameter):
                        lazy.append((name, parameter))
                    elif parameter.requires_grad:
                        self._hook_contribution(name, parameter)
            if lazy:
                self._hook_when_materialized(lazy)
        for entry, module in self.modules.items():
            for sub_name, sub in module.named_modules():
                path = f"{entry}.{sub_name}" if sub_name else entry
                if isinstance(sub, _BatchNorm):
                    described = f"{path} ({type(sub).__name__})"
                    hook = functools.partial(self._batch_dependent_forward, described)
                    stack.callback(sub.register_forward_pre_hook(hook).remove)
                    if self.batch_dependent_mode == "eval":
                        stack.callback(sub.register_forward_hook(self._restore_mode).remove)
                if self.disable_dropout:
                    self._disable_dropout_module(path, sub)
        self._patch(CLIP_FUNCTIONS, self._clip_wrapper)
        if self.forwards is not None:  # its dropout wrappers record: they must not wrap ones that disable dropout
            assert not self.disable_dropout, "record_forwards observes dropout as the recipe has it"
            stack.enter_context(self.forwards)
        if self.disable_dropout:
            self._patch({function: spec.name for function, spec in DROPOUT_FUNCTIONS.items()}, self._dropout_wrapper)

    def _wrap_method(self, obj: Any, name: str, before: Callable[..., None],
                     after: Callable[..., None] | None = None) -> None:
        """Shadow `obj.name` with an instance attribute that calls `before` first and `after` last (also when
        it raises), each with the call's arguments; undone on exit."""
        had_own = name in vars(obj)
        previous = vars(obj).get(name)
        method = getattr(obj, name)

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before(*args, **kwargs)
            try:
                return method(*args, **kwargs)
            finally:
                if after is not None:
                    after(*args, **kwargs)

        setattr(obj, name, wrapper)

        def undo() -> None:
            if had_own:
                setattr(obj, name, previous)
            else:
                delattr(obj, name)

        self._stack.callback(undo)

    def _disable_dropout_module(self, path: str, module: nn.Module) -> None:
        attribute = "p" if isinstance(module, _DropoutNd) else "dropout" if isinstance(
            module, nn.MultiheadAttention) else None
        if attribute is None:
            return
        old = getattr(module, attribute)
        if old:
            setattr(module, attribute, 0.0)
            self._stack.callback(setattr, module, attribute, old)
            self.dropout.modules.append(path)
        else:
            self.dropout.inactive.append(path)

    def _patch(self, functions: dict[Callable[..., Any], str],
               make_wrapper: Callable[[Callable[..., Any], str], Callable[..., Any]]) -> None:
        """Replace `functions` in torch's namespaces and in the recipe's own modules; undone on exit."""
        patch_functions(self._stack, self.recipe_type, functions, make_wrapper)

    # -- the hooks -----------------------------------------------------------------------------------

    def _scale_of(self, entry: str | None) -> float | None:
        """The factor that still multiplies `entry`'s gradients, or None when they are unscaled."""
        if self.scaler is None or entry in self.unscaled:
            return None
        return float(self.scaler.get_scale())

    def _before_step(self, entry: str, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if creates_state(optimizer):
            self._creating_state.add(entry)
            return
        if self.before_step_callback is not None:
            self.before_step_callback(entry, optimizer)
        if self.call is None:
            return
        scale = self._scale_of(entry)
        # A closure (`optimizer.step(closure)`) computes the gradients inside the step: they are read after it.
        closure = step_closure(optimizer, args, kwargs)
        grads = {} if closure is not None else self._grads(entry, scale, len(self.step_events[entry]))
        if closure is not None:
            self._closure_steps.add(entry)
        pre_clip: dict[str, torch.Tensor] = {}
        for record in self._clip_records:
            for name, grad in record.items():
                if name in grads and name not in pre_clip and grad is not None:
                    pre_clip[name] = grad
        self._steps_seen += 1
        if self._scaler_step is not None and self._scaler_step.optimizer == entry:
            self._scaler_step.order = self._steps_seen
        nonfinite = self._nonfinite_grads(entry) if self.check_finite and closure is None else []
        self.step_events[entry].append(StepEvent(
            call=self.call_index,
            grads=grads,
            pre_clip=pre_clip,
            lr=[_float(group["lr"]) for group in optimizer.param_groups],
            scaled=scale is not None,
            scale=scale,
            rng=self._rng_fingerprint(),
            order=self._steps_seen,
            nonfinite=nonfinite,
            told_to_skip=self.check_finite and self._told_to_skip(entry, optimizer, kwargs, nonfinite),
        ))

    def _nonfinite_grads(self, entry: str) -> list[str]:
        """The parameters of `entry` whose gradient holds an inf or a NaN now, in param_groups order."""
        named = [(name, parameter.grad) for name, parameter in self.optimizer_parameters[entry]
                 if parameter.grad is not None]
        flags = nonfinite_flags([grad for _, grad in named])
        return list(dict.fromkeys(name for (name, _), flag in zip(named, flags, strict=True) if flag))

    def _told_to_skip(self, entry: str, optimizer: torch.optim.Optimizer, kwargs: dict[str, Any],
                      nonfinite: list[str]) -> bool:
        """Whether the step runs inside `scaler.step()` for this optimizer, which told it to skip the update: a
        fused optimizer (`_step_supports_amp_scaling`) is always called, with `optimizer.found_inf` set to what the
        GradScaler's inf check found; one given the scaler itself (`grad_scaler=`) checks on its own, and is taken
        to skip gradients that are not finite. Any other optimizer is only called when the check found nothing."""
        if self._scaler_step is None or self._scaler_step.optimizer != entry:
            return False
        if "grad_scaler" in kwargs:
            return bool(nonfinite)
        found_inf = getattr(optimizer, "found_inf", None)
        return isinstance(found_inf, torch.Tensor) and bool(found_inf.any())

    def _grads(self, entry: str, scale: float | None, index: int) -> dict[str, torch.Tensor | None]:
        if not self.record_grads:
            return {}
        grads: dict[str, torch.Tensor | None] = {}
        for name, parameter in self.optimizer_parameters[entry]:
            shared = None
            if self.share_gradient is not None and scale is None and parameter.grad is not None:
                shared = self.share_gradient(entry, index, name, parameter.grad)
            grads[name] = shared if shared is not None else grad_copy(parameter.grad, scale)
        return grads

    def _after_step(self, entry: str, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if entry in self._creating_state:
            self._creating_state.discard(entry)
            return
        if entry in self._closure_steps:
            self._closure_steps.discard(entry)
            event = self.step_events[entry][-1]
            event.grads = self._grads(entry, event.scale if event.scaled else None, len(self.step_events[entry]) - 1)
            if self.check_finite:
                event.nonfinite = self._nonfinite_grads(entry)
        self.unscaled.discard(entry)
        if self.call is not None:
            self.call.steps[entry] += 1
        if self.after_step_callback is not None:
            self.after_step_callback(entry, optimizer)

    def _scheduler_step(self, entry: str, *args: Any, **kwargs: Any) -> None:
        if self.call is not None:
            self.call.scheduler_steps[entry] += 1

    def _entry(self, optimizer: object) -> str | None:
        return next((e for e, o in self.optimizers.items() if o is optimizer), None)

    def _unscale(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        entry = self._entry(optimizer)
        if entry is not None:
            self.unscaled.add(entry)

    def _scaler_step_begin(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        entry = self._entry(optimizer)
        if self.call is not None and entry is not None and self.scaler is not None:
            self._scaler_step = ScalerStep(entry, float(self.scaler.get_scale()))
            self.call.scaler_steps.append(self._scaler_step)

    def _scaler_step_end(self, *args: Any, **kwargs: Any) -> None:
        self._scaler_step = None

    def _scaler_update(self, *args: Any, **kwargs: Any) -> None:
        self.unscaled.clear()

    def _scaler_updated(self, *args: Any, **kwargs: Any) -> None:
        if self.call is None or self.scaler is None:
            return
        for step in self.call.scaler_steps:
            if step.scale_after is None:
                step.scale_after = float(self.scaler.get_scale())

    def _hook_contribution(self, name: str, parameter: torch.Tensor) -> None:
        hook = functools.partial(self._contribution, name)
        self._stack.callback(parameter.register_hook(hook).remove)  # type: ignore[no-untyped-call]

    def _hook_when_materialized(self, lazy: list[tuple[str, torch.Tensor]]) -> None:
        """Hook the parameters of lazy modules once a forward pass has given them a size (no hook can be put on
        them before): a forward hook of every module, removed when none is left to hook."""
        def hook_materialized(module: nn.Module, args: Any, output: Any) -> None:
            for name, parameter in [pair for pair in lazy if not is_lazy(pair[1])]:
                lazy.remove((name, parameter))
                if parameter.requires_grad:
                    self._hook_contribution(name, parameter)
            if not lazy:
                handle.remove()

        handle = nn.modules.module.register_module_forward_hook(hook_materialized)
        self._stack.callback(handle.remove)

    def _contribution(self, name: str, grad: torch.Tensor) -> None:
        if self.call is None:
            return
        scale = None if self.scaler is None else float(self.scaler.get_scale())
        copy = self.sample(grad, scale)
        contributions = self.call.contribution
        contributions[name] = contributions[name] + copy if name in contributions else copy

    def _batch_dependent_forward(self, path: str, module: nn.Module, args: Any) -> None:
        if not module.training:
            return
        self.batch_dependent.add(path)
        if self.batch_dependent_mode == "eval":
            module.training = False
            module._tp_restore_training = True  # type: ignore[assignment]

    @staticmethod
    def _restore_mode(module: nn.Module, args: Any, output: Any) -> None:
        if vars(module).pop("_tp_restore_training", False):
            module.training = True

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

    def _dropout_wrapper(self, original: Callable[..., Any], function: str) -> Callable[..., Any]:
        spec = DROPOUT_FUNCTIONS[original]

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # only an active dropout is worth naming
            if spec.drops(args, kwargs) and function not in self.dropout.functions:
                self.dropout.functions.append(function)
            args, kwargs = spec.without_dropout(args, kwargs)
            return original(*args, **kwargs)

        return wrapper

    def _record_clip(self, function: str, parameters: list[torch.Tensor]) -> None:
        assert self.call is not None
        names = [self.names.get(id(p), "<unnamed>") for p in parameters]
        grads: dict[str, torch.Tensor | None] = {}
        with_grads = [(name, parameter.grad, self._scale_of(self.owners.get(id(parameter))))
                      for name, parameter in zip(names, parameters, strict=True) if parameter.grad is not None]
        for name, grad, scale in with_grads if self.record_grads else []:
            grads[name] = self.sample(grad, scale)
        norms = tensor_norms([grad for _, grad, _ in with_grads])
        norm = math.sqrt(sum((n / (scale or 1.0)) ** 2 for n, (_, _, scale) in zip(norms, with_grads, strict=True)))
        scales = {scale for _, _, scale in with_grads if scale is not None}
        self._clip_records.append(grads)
        self.call.clips.append(Clip(function, names, bool(scales), max(scales) if scales else None, norm))

    # -- calls ---------------------------------------------------------------------------------------

    def begin_call(self, index: int, after: CallRecord | None = None) -> None:
        """`after`: the call that ended just before, with nothing run since (the next micro-batch of a window): the
        random streams are as it left them, so its fingerprint is this call's start (each costs tens of
        microseconds, a tenth of a tiny model's step)."""
        self.call_index = index
        self._clip_records = []
        self.call = CallRecord(dict.fromkeys(self.optimizers, 0), dict.fromkeys(self.schedulers, 0), [], {},
                               self._rng_fingerprint() if after is None else after.rng_end)
        if self.forwards is not None:
            self.forwards.begin_call(index)

    def end_call(self) -> CallRecord:
        assert self.call is not None
        call, self.call = self.call, None
        call.rng_end = self._rng_fingerprint()
        self._clip_records = []
        if self.forwards is not None:
            call.forwards = self.forwards.end_call()
        return call

    @functools.cached_property
    def stride(self) -> int:
        """The sampling stride, taken at the first sample: a lazy module's parameters have no size before the
        forward that materializes them (one that never ran is left out)."""
        total = sum(p.numel() for pairs in self.optimizer_parameters.values() for _, p in pairs if not is_lazy(p))
        return max(1, total // SAMPLE_ELEMENTS)

    def sample(self, tensor: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """Every `stride`-th element of a (gradient) tensor, as a float64 CPU copy, divided by `scale`."""
        values = tensor.detach()
        if values.layout != torch.strided:
            values = values.to_dense()
        flat = values.reshape(-1)[:: self.stride].to("cpu", torch.float64, copy=True)
        return flat / scale if scale is not None else flat

    def take_step_events(self) -> dict[str, list[StepEvent]]:
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

    def parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """The State's named parameters with values, each once (a lazy module's are not, before its first
        forward)."""
        seen: set[int] = set()
        for module in self.modules.values():
            for parameter in module.parameters():
                name = self.names.get(id(parameter))
                if isinstance(parameter, nn.parameter.UninitializedParameter):
                    continue
                if name is not None and id(parameter) not in seen:
                    seen.add(id(parameter))
                    yield name, parameter
