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
- and the watches a check hands it (`Watch`, each a hook set of its own): dropout switched off
  (`_watches.DropoutOff`), the batch-dependent modules that ran in training mode
  (`_watches.BatchDependentModules`), the forward passes of the State's modules
  (`_forwards.ForwardRecorder`).

The GradScaler's wrappers and the clipping functions' are hook sets of their own (`_ScalerWatch`,
`_ClipWatch`), which the observer always installs: what they see is part of what an optimizer
step took (still scaled, clipped). The clipping and dropout functions are module attributes
shared by the whole process, so in-process observation holds a lock: two observed runs never
overlap.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.nn.utils.clip_grad as clip_grad
from torch import nn
from torch.nn.parameter import is_lazy

from trainparity._compat import GradScaler
from trainparity._observe._forwards import ForwardRecorder
from trainparity._observe._hooks import (
    HookSet,
    Watch,
    creates_state,
    grad_copy,
    nonfinite_flags,
    patch_functions,
    step_closure,
    tensor_norms,
    wrap_method,
)
from trainparity._observe._records import CallRecord, Clip, ScalerStep, StepEvent
from trainparity._observe._watches import DropoutOff
from trainparity._state._entries import State, parameter_names, state_objects, unwrap_module
from trainparity._state._rng import rng_fingerprint
from trainparity._state._tensors import gathered

#: the clipping functions users call, by the name reports use
CLIP_FUNCTIONS: dict[Callable[..., Any], str] = {
    clip_grad.clip_grad_norm_: "clip_grad_norm_",
    clip_grad.clip_grad_norm: "clip_grad_norm",
    clip_grad.clip_grad_value_: "clip_grad_value_",
    torch.nn.utils.clip_grads_with_norm_: "clip_grads_with_norm_",
}
OBSERVATION_LOCK = threading.RLock()
W = TypeVar("W", bound=Watch)
#: how many gradient elements (over all parameters) a diagnosis sample keeps, about
SAMPLE_ELEMENTS = 1 << 20


def _float(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class _ScalerWatch(HookSet):
    """The State's one enabled GradScaler: which optimizers' gradients it unscaled since its last update, the
    `scaler.step()` running now, and the loss scale each of the call's scaler steps left."""

    def __init__(self, observer: Observer, scaler: GradScaler) -> None:
        super().__init__()
        self.observer, self.scaler = observer, scaler
        #: the optimizer entries whose gradients `scaler.unscale_` unscaled since the last `scaler.update()`
        self.unscaled: set[str] = set()
        #: the `scaler.step()` call running now, if any
        self.running: ScalerStep | None = None

    def _install(self) -> None:
        wrap_method(self._stack, self.scaler, "unscale_", self._unscale)
        wrap_method(self._stack, self.scaler, "step", self._step_begin, self._step_end)
        wrap_method(self._stack, self.scaler, "update", self._update, self._updated)

    def scale_of(self, entry: str | None) -> float | None:
        """The factor that still multiplies `entry`'s gradients, or None when they are unscaled."""
        return None if entry in self.unscaled else float(self.scaler.get_scale())

    def _unscale(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        entry = self.observer.entry_of(optimizer)
        if entry is not None:
            self.unscaled.add(entry)

    def _step_begin(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        entry, call = self.observer.entry_of(optimizer), self.observer.call
        if call is not None and entry is not None:
            self.running = ScalerStep(entry, float(self.scaler.get_scale()))
            call.scaler_steps.append(self.running)

    def _step_end(self, *args: Any, **kwargs: Any) -> None:
        self.running = None

    def _update(self, *args: Any, **kwargs: Any) -> None:
        self.unscaled.clear()

    def _updated(self, *args: Any, **kwargs: Any) -> None:
        if self.observer.call is None:
            return
        for step in self.observer.call.scaler_steps:
            if step.scale_after is None:
                step.scale_after = float(self.scaler.get_scale())


def _applied_norm(function: str, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> float | None:
    """The norm a clipping call scaled by (see `Clip.applied`), its DTensor gathered."""
    if function == "clip_grads_with_norm_":  # (parameters, max_norm, total_norm, ...): `args` follow parameters
        given = args[1] if len(args) > 1 else kwargs.get("total_norm")
    elif function.startswith("clip_grad_norm"):
        given = result
    else:
        return None
    return None if given is None else _float(gathered(given) if isinstance(given, torch.Tensor) else given)


class _ClipWatch(HookSet):
    """The clipping functions (`CLIP_FUNCTIONS`, wherever the recipe's modules imported them): each outermost call
    in an observed call of `step()`, its parameters, the norm it was given, and a sample of the gradients before it
    clipped them (`before`, for the next optimizer step's `StepEvent.pre_clip`)."""

    def __init__(self, observer: Observer) -> None:
        super().__init__()
        self.observer = observer
        #: per clip of the call running now: parameter name -> a sample of its gradient before the clip
        self.before: list[dict[str, torch.Tensor | None]] = []
        self._depth = 0

    def _install(self) -> None:
        patch_functions(self._stack, self.observer.recipe_type, CLIP_FUNCTIONS, self._wrapper)

    def _wrapper(self, original: Callable[..., Any], function: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            record = None
            if self._depth == 0 and self.observer.call is not None:
                # Materialize a generator once, so that the original sees the same parameters.
                parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                record = self._record(function, parameters)
            self._depth += 1
            try:
                result = original(parameters, *args, **kwargs)
            finally:
                self._depth -= 1
            if record is not None:
                record.applied = _applied_norm(function, args, kwargs, result)
            return result

        return wrapper

    def _record(self, function: str, parameters: list[torch.Tensor]) -> Clip:
        observer = self.observer
        assert observer.call is not None
        names = [observer.names.get(id(p), "<unnamed>") for p in parameters]
        grads: dict[str, torch.Tensor | None] = {}
        with_grads = [(name, parameter.grad, observer.scale_of(observer.owners.get(id(parameter))))
                      for name, parameter in zip(names, parameters, strict=True) if parameter.grad is not None]
        for name, grad, scale in with_grads if observer.record_grads else []:
            grads[name] = observer.sample(grad, scale)
        norms = tensor_norms([grad for _, grad, _ in with_grads])
        norm = math.sqrt(sum((n / (scale or 1.0)) ** 2 for n, (_, _, scale) in zip(norms, with_grads, strict=True)))
        scales = {scale for _, _, scale in with_grads if scale is not None}
        self.before.append(grads)
        clip = Clip(function, names, bool(scales), max(scales) if scales else None, norm)
        observer.call.clips.append(clip)
        return clip

    def pre_clip(self, grads: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """Of the parameters in `grads`, the sample of each one's gradient before the call's first clip of it."""
        found: dict[str, torch.Tensor] = {}
        for record in self.before:
            for name, grad in record.items():
                if name in grads and name not in found and grad is not None:
                    found[name] = grad
        return found


class Observer(HookSet):
    """Hooks on one State's objects; use as a context manager around the observed calls.

    Between `begin_call()` and `end_call()` everything observed is attributed to that call. Its own hooks
    observe the optimizer steps, the schedulers' steps, the State's one enabled GradScaler and the clipping
    functions; `watches` (`DropoutOff`, `BatchDependentModules`, `ForwardRecorder`) add what a check asks for.
    `record_contributions` turns on the per-parameter gradient hooks (a sample per backward).
    `before_step(entry, optimizer)` runs in every optimizer step pre-hook, first, and `after_step(entry,
    optimizer)` in every post-hook, last (neither for a step that only creates an optimizer's state).
    `fingerprint_rng=False` leaves the RNG fingerprints of calls and steps empty (each costs a fraction of a
    millisecond). `record_grads=False` leaves the step events' gradients and the clip records' gradient samples
    empty: a caller that reads what it needs of the gradients in its step callbacks spares a copy of every gradient
    per step. `check_finite` names, in each step event, the parameters whose gradient held an inf or a NaN when the
    step took it (`StepEvent.nonfinite`, one fused reduction per step, no copy), and whether `scaler.step()` told a
    fused optimizer to skip the update (`StepEvent.told_to_skip`).

    What serves only to diagnose (the contributions, the gradients before a clip) is kept as a
    sample of at most about `SAMPLE_ELEMENTS` elements over all parameters, so that observing a
    large model costs little more than training it.
    """

    def __init__(
        self,
        state: State,
        recipe_type: type,
        watches: Sequence[Watch] = (),
        *,
        record_contributions: bool = False,
        before_step: Callable[[str, torch.optim.Optimizer], None] | None = None,
        after_step: Callable[[str, torch.optim.Optimizer], None] | None = None,
        fingerprint_rng: bool = True,
        record_grads: bool = True,
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        kinds = {type(watch) for watch in watches}
        # ForwardRecorder names the dropouts that dropped and the draws of each pass: under DropoutOff none drop, and
        # it would describe another run than the recipe's
        assert not {ForwardRecorder, DropoutOff} <= kinds, "ForwardRecorder and DropoutOff observe different runs"
        self.state, self.recipe_type, self.watches = state, recipe_type, list(watches)
        self.record_contributions, self.record_grads, self.check_finite = record_contributions, record_grads, \
            check_finite
        self._rng_fingerprint: Callable[[], str] = rng_fingerprint if fingerprint_rng else str
        self.before_step_callback, self.after_step_callback = before_step, after_step
        self.names = parameter_names(state)
        self.optimizers = dict(state_objects(state, torch.optim.Optimizer))
        self.schedulers = dict(state_objects(state, torch.optim.lr_scheduler.LRScheduler))
        self.modules = {entry: unwrap_module(module) for entry, module in state_objects(state, nn.Module)}
        scalers = [v for _, v in state_objects(state, GradScaler) if v.is_enabled()]
        # With several enabled scalers we cannot tell which one scaled a gradient: record them as they are.
        self.scaling = _ScalerWatch(self, scalers[0]) if len(scalers) == 1 else None
        self.clipping = _ClipWatch(self)
        #: optimizer entry -> [(parameter name, parameter)] in param_groups order
        self.optimizer_parameters = {
            entry: [(self.names.get(id(p), f"{entry}.param{i}"), p) for i, p in enumerate(self._params_of(opt))]
            for entry, opt in self.optimizers.items()
        }
        self.owners: dict[int, str] = {}
        for entry, pairs in self.optimizer_parameters.items():
            for _, parameter in pairs:
                self.owners.setdefault(id(parameter), entry)
        #: optimizers whose running `step()` only creates their state (`creates_state`)
        self._creating_state: set[str] = set()
        #: optimizers whose running `step(closure)` computes its gradients: they are read in the post-hook
        self._closure_steps: set[str] = set()
        self.call: CallRecord | None = None
        self.call_index = 0
        self.step_events: dict[str, list[StepEvent]] = {entry: [] for entry in self.optimizers}
        self._steps_seen = 0
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
            wrap_method(stack, scheduler, "step", functools.partial(self._scheduler_step, entry))
        if self.scaling is not None:
            stack.enter_context(self.scaling)
        if self.record_contributions:
            self._hook_contributions()
        stack.enter_context(self.clipping)
        for watch in self.watches:
            stack.enter_context(watch)

    def _hook_contributions(self) -> None:
        lazy: list[tuple[str, torch.Tensor]] = []
        for pairs in self.optimizer_parameters.values():
            for name, parameter in pairs:
                if is_lazy(parameter):
                    lazy.append((name, parameter))
                elif parameter.requires_grad:
                    self._hook_contribution(name, parameter)
        if lazy:
            self._hook_when_materialized(lazy)

    # -- the hooks -----------------------------------------------------------------------------------

    @property
    def scaler(self) -> GradScaler | None:
        """The State's one enabled GradScaler, observed (None: none, or several)."""
        return None if self.scaling is None else self.scaling.scaler

    def watch(self, kind: type[W]) -> W:
        """The watch of this type the observer was given."""
        return next(watch for watch in self.watches if isinstance(watch, kind))

    def entry_of(self, optimizer: object) -> str | None:
        """The State entry of an optimizer (None: not one of the State's)."""
        return next((e for e, o in self.optimizers.items() if o is optimizer), None)

    def scale_of(self, entry: str | None) -> float | None:
        """The factor that still multiplies `entry`'s gradients, or None when they are unscaled."""
        return None if self.scaling is None else self.scaling.scale_of(entry)

    def _before_step(self, entry: str, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if creates_state(optimizer):
            self._creating_state.add(entry)
            return
        if self.before_step_callback is not None:
            self.before_step_callback(entry, optimizer)
        if self.call is None:
            return
        scale = self.scale_of(entry)
        # A closure (`optimizer.step(closure)`) computes the gradients inside the step: they are read after it.
        closure = step_closure(optimizer, args, kwargs)
        grads = {} if closure is not None else self._grads(entry, scale, len(self.step_events[entry]))
        if closure is not None:
            self._closure_steps.add(entry)
        pre_clip = self.clipping.pre_clip(grads)
        self._steps_seen += 1
        running = None if self.scaling is None else self.scaling.running
        if running is not None and running.optimizer == entry:
            running.order = self._steps_seen
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
        running = None if self.scaling is None else self.scaling.running
        if running is None or running.optimizer != entry:
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
        if self.scaling is not None:
            self.scaling.unscaled.discard(entry)
        if self.call is not None:
            self.call.steps[entry] += 1
        if self.after_step_callback is not None:
            self.after_step_callback(entry, optimizer)

    def _scheduler_step(self, entry: str, *args: Any, **kwargs: Any) -> None:
        if self.call is not None:
            self.call.scheduler_steps[entry] += 1

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


    # -- calls ---------------------------------------------------------------------------------------

    def begin_call(self, index: int, after: CallRecord | None = None) -> None:
        """`after`: the call that ended just before, with nothing run since (the next micro-batch of a window): the
        random streams are as it left them, so its fingerprint is this call's start (each costs tens of
        microseconds, a tenth of a tiny model's step)."""
        self.call_index = index
        self.clipping.before = []
        self.call = CallRecord(dict.fromkeys(self.optimizers, 0), dict.fromkeys(self.schedulers, 0), [], {},
                               self._rng_fingerprint() if after is None else after.rng_end)
        for watch in self.watches:
            watch.begin_call(index)

    def end_call(self) -> CallRecord:
        assert self.call is not None
        call, self.call = self.call, None
        call.rng_end = self._rng_fingerprint()
        self.clipping.before = []
        for watch in self.watches:
            watch.end_call(call)
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
