"""Watching autocast while a recipe's `step()` runs: which matmul, convolution and attention ops ran in which
dtype, inside which autocast region, in which module. Nothing in the user's code changes.

- Regions: `torch.autocast` is one class (`torch.amp.autocast_mode.autocast`) that `torch.cpu.amp.autocast`,
  its decorator form and `torch.amp.custom_fwd` all go through. Its `__init__` is wrapped from before the
  recipe's `setup()` (`RegionRequests`: `enabled` as written), its `__enter__` and `__exit__` while the watch is
  on: what a region asked for (device type, dtype, `enabled`), what torch made of it (its `_enabled`: torch
  turns a region off, with a warning, for a device it does not have), and where it was entered (the first frame
  outside torch; for `custom_fwd` the forward it decorates). A region made before that (a decorator applied when
  its class was defined, a context made at import) shows only what torch made of it: where torch turned it off,
  whether it was enabled as written is unknown (`RegionUse.requested` None).
- Ops: a `TorchDispatchMode`, pushed only while a region is open (and, for a recipe that declares
  `autocast_dtype`, while one of the State's modules runs its forward), sees the aten ops after autocast cast
  their inputs. It records the ops of torch's FLOP table (`torch.utils.flop_counter.flop_registry`: `mm`,
  `addmm`, `bmm`, `baddbmm`, the convolutions, the attention kernels, without their backward ops), which are
  the kernels that autocast's lower-precision ops (`linear`, `matmul`, `conv*`, `scaled_dot_product_attention`,
  ...) run as, plus the CPU flash-attention kernel the table misses (counted with the flash formula): the dtype
  each ran in (its widest floating input), its device, and its FLOPs by torch's formula.
- Modules: forward pre/post hooks on the State's modules keep the stack of modules running, so that an op is
  attributed to the innermost one.

Torch keeps no public list of the ops autocast lowers, so none is copied here: the watch sees what autocast did.
An op that ran in float32 or float64 under an enabled region for its device was kept there by autocast (its
float32 policy, `cdist` say) or by its float64 inputs (which autocast never lowers); one that ran so under a
nested region that turned autocast off for its device (`autocast(enabled=False)`, `custom_fwd(cast_inputs=...)`)
escaped it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from trainparity._observe._hooks import HookSet
from trainparity._results._report import relative_paths
from trainparity._state._entries import State, named_state_modules

AUTOCAST = torch.amp.autocast_mode.autocast
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
#: the position of `enabled` among autocast.__init__'s arguments after `self` (device_type, dtype, enabled, ...)
_ENABLED_AT = list(inspect.signature(AUTOCAST.__init__).parameters).index("enabled") - 1


@functools.cache
def formulas() -> dict[Any, Callable[..., int]]:
    """Op packet -> FLOP formula: torch's table without its backward ops, and the CPU flash-attention kernel.
    Read on first use: torch's FLOP counter imports triton where it is installed (a tenth of a second at every
    interpreter's start, script runs included, for the mixed-precision check alone)."""
    from torch.utils.flop_counter import flop_registry

    table: dict[Any, Callable[..., int]] = {packet: formula for packet, formula in flop_registry.items()
                                            if "backward" not in str(packet)}
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    if flash in table and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        table[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = table[flash]
    return table



def low_precision(dtype: str) -> bool:
    """float16, bfloat16 and the 8-bit floats (as `str(dtype)`): what autocast runs its lower-precision ops in."""
    return dtype not in ("torch.float32", "torch.float64")


@functools.lru_cache(maxsize=256)
def _shown(filename: str, working_directory: str) -> str:
    """A file as reports show it: relative to the working directory, else by its name."""
    shown = relative_paths(filename)
    return os.path.basename(shown) if os.path.isabs(shown) else shown


def _display(filename: str, line: int) -> str:
    return f"{_shown(filename, os.getcwd())}:{line}"


def _function(function: Any) -> tuple[str, str]:
    """(qualname, `file:line` of its definition) of a decorated user function."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    name = getattr(function, "__qualname__", repr(function))
    return name, _display(code.co_filename, code.co_firstlineno) if code is not None else "?"


def entered_from(frame: FrameType | None) -> tuple[str, str, str]:
    """(qualname, location, kind) of the user code that entered a region: the first frame outside torch, or the
    function that `torch.amp.custom_fwd` or the autocast decorator wraps."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        name = frame.f_code.co_name
        if name == "decorate_fwd" and "fwd" in frame.f_locals:
            qualname, location = _function(frame.f_locals["fwd"])
            return qualname, location, f"custom_fwd(cast_inputs={frame.f_locals.get('cast_inputs')})"
        if name == "decorate_autocast" and "func" in frame.f_locals:
            qualname, location = _function(frame.f_locals["func"])
            return qualname, location, "autocast decorator"
        frame = frame.f_back
    if frame is None:
        return "<unknown>", "?", "autocast"
    return frame.f_code.co_qualname, _display(frame.f_code.co_filename, frame.f_lineno), "autocast"


@dataclasses.dataclass
class RegionUse:
    """One autocast region (by where it was entered) over one call of `step()`, and the ops that ran in it."""

    function: str
    location: str
    #: "autocast", "autocast decorator" or "custom_fwd(cast_inputs=torch.float32)"
    kind: str
    device_type: str
    dtype: str
    #: `enabled` as written (None: unknown, for a region made before `RegionRequests` and turned off by torch), and
    #: as torch made it
    requested: bool | None
    enabled: bool
    #: whether no other region was open when it was entered
    outermost: bool
    #: the recorded ops that ran inside it (nested regions included): how many, how many in a low dtype, their
    #: names, and their FLOPs in a low and in a full dtype
    ops: int = 0
    low_ops: int = 0
    #: of its full-precision ops: those torch kept so with autocast on for their device (see `AutocastUse`)
    kept_ops: int = 0
    op_names: list[str] = dataclasses.field(default_factory=list)
    low_flops: int = 0
    full_flops: int = 0
    #: of the full FLOPs: those under a nested region that turned autocast off for their device
    escaped_flops: int = 0
    op_devices: list[str] = dataclasses.field(default_factory=list)
    full_dtypes: list[str] = dataclasses.field(default_factory=list)
    #: the regions (`describe()`) that turned autocast off for its full-precision ops
    escapes: list[str] = dataclasses.field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str, str, bool | None]:
        return self.location, self.kind, self.device_type, self.dtype, self.requested

    def describe(self) -> str:
        """`autocast(device_type='cpu', dtype=torch.bfloat16) entered in Recipe.loss (test/x.py:12)`."""
        if self.kind.startswith("custom_fwd"):
            return f"{self.kind} on {self.function} ({self.location})"
        enabled = ", enabled=False" if self.requested is False else ""
        how = "applied as a decorator to" if self.kind == "autocast decorator" else "entered in"
        return (f"autocast(device_type={self.device_type!r}, dtype={self.dtype}{enabled}) {how} {self.function} "
                f"({self.location})")


@dataclasses.dataclass
class Bypass:
    """Ops that ran in full precision inside an enabled region for their device, per module, region and escape."""

    #: the innermost State module running (None: outside the State's modules)
    module: str | None
    #: the enabled region's `describe()` and its function (the path when no module ran)
    region: str
    region_function: str
    #: the nested region that turned autocast off (None: autocast was on, the inputs were float64)
    escape: str | None
    dtype: str
    ops: list[str] = dataclasses.field(default_factory=list)
    calls: int = 0
    flops: int = 0


@dataclasses.dataclass
class AutocastUse:
    """What the watch saw over one call of `step()`."""

    regions: list[RegionUse] = dataclasses.field(default_factory=list)
    bypasses: list[Bypass] = dataclasses.field(default_factory=list)
    #: full-precision ops under an outermost region disabled as written (`escape` is that region): bypasses when the
    #: step ran other ops in a low dtype, which the judge knows only once the step is over
    disabled_bypasses: list[Bypass] = dataclasses.field(default_factory=list)
    #: FLOPs of the recorded ops inside an enabled region for their device: in a low dtype, and kept in float32
    #: by torch with autocast on there (autocast's float32 policy for the op that called them, such as `cdist`;
    #: a kernel that computes in float32, such as the CPU math path of `scaled_dot_product_attention`)
    low_flops: int = 0
    kept_flops: int = 0
    #: calls and FLOPs of every recorded op by the dtype it ran in (regions and, with a declared dtype, module
    #: forwards)
    calls_by_dtype: dict[str, int] = dataclasses.field(default_factory=dict)
    flops_by_dtype: dict[str, int] = dataclasses.field(default_factory=dict)
    op_devices: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Open:
    """A region open now."""

    instance: Any
    use: RegionUse


def _shape(value: Any) -> Any:
    """Tensors as their shapes, lists as tuples: what a FLOP formula reads, hashable."""
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        return tuple(_shape(item) for item in value)
    return value


#: (op packet, the shapes and other arguments of a call) -> its FLOPs: a training step repeats its shapes, and
#: torch's formulas walk their arguments with its pytree (tens of microseconds a call)
_FLOPS: dict[Any, int] = {}


def _flops(packet: Any, formula: Callable[..., int], args: tuple[Any, ...], kwargs: dict[str, Any],
           out: Any) -> int:
    """The op's FLOPs by torch's formula (0 when the formula cannot read these arguments)."""
    try:
        key = (packet, _shape(args), _shape(out), tuple(sorted((k, _shape(v)) for k, v in kwargs.items())))
        known = _FLOPS.get(key)
    except TypeError:  # an unhashable argument: count it without the cache
        key, known = None, None
    if known is not None:
        return known
    raw = getattr(formula, "__wrapped__", None)
    try:
        if raw is not None:  # the formula on shapes
            flops = int(raw(*_shape(args), out_shape=_shape(out), **{k: _shape(v) for k, v in kwargs.items()}))
        else:
            flops = int(formula(*args, out_val=out, **kwargs))
    except Exception:  # noqa: BLE001 - a FLOP count is a weight in a share, never a reason to fail the run
        flops = 0
    if key is not None and len(_FLOPS) < 65536:
        _FLOPS[key] = flops
    return flops


def _tensors(args: tuple[Any, ...]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.append(arg)
        elif isinstance(arg, (list, tuple)):
            found += [item for item in arg if isinstance(item, torch.Tensor)]
    return found


def _wrapped(original: Callable[..., Any], method: Callable[..., Any]) -> Callable[..., Any]:
    """`original` (an autocast method) calling `method(original, instance, ...)` instead: a function, so that it
    binds to the instance as the method did."""

    @functools.wraps(original)
    def wrapper(instance: Any, *args: Any, **kwargs: Any) -> Any:
        return method(original, instance, *args, **kwargs)

    return wrapper


class _OpMode(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]
    """Records the FLOP-table ops that run while it is pushed."""

    def __init__(self, watch: AutocastWatch) -> None:
        super().__init__()  # type: ignore[no-untyped-call, unused-ignore]
        self.watch = watch

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        formula = formulas().get(packet)
        if formula is not None:
            self.watch.record_op(packet, formula, args, kwargs, out)
        return out


@functools.lru_cache(maxsize=64)
def _torch_enables(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch keeps a region for `device_type` in `dtype` on, made with enabled=True in this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(AUTOCAST(device_type, dtype=dtype, enabled=True)._enabled)
        except (RuntimeError, ValueError, AssertionError):  # torch refuses the dtype for the device outright
            return False


class RegionRequests(HookSet):
    """`enabled` as written for each autocast object made in this thread while it is entered: it is entered before
    the recipe's `setup()`, which may make the context that `step()` enters."""

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()
        self._written: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    def _install(self) -> None:
        original = vars(AUTOCAST)["__init__"]
        AUTOCAST.__init__ = _wrapped(original, self._init)  # type: ignore[method-assign]
        self._stack.callback(setattr, AUTOCAST, "__init__", original)

    def _init(self, original: Callable[..., None], instance: Any, *args: Any, **kwargs: Any) -> None:
        original(instance, *args, **kwargs)
        if threading.get_ident() == self._thread:
            enabled = args[_ENABLED_AT] if len(args) > _ENABLED_AT else kwargs.get("enabled", True)
            self._written[instance] = bool(enabled)

    def requested(self, instance: Any) -> bool | None:
        """`enabled` as written: as recorded; for an object made before, True where torch kept it on, False where
        torch would have kept it on but it is off, and None (unknown) where torch turns such a region off anyway."""
        written = self._written.get(instance)
        if written is not None:
            return written
        if instance._enabled:
            return True
        return False if _torch_enables(str(instance.device), instance.fast_dtype) else None


class AutocastWatch(HookSet):
    """The autocast regions, ops and modules of the calls made while it is entered (see the module docstring).

    `declared_dtype`: the recipe's `autocast_dtype`; the ops of the State's module forwards are then recorded
    outside regions too. `requests`: entered before the recipe's `setup()`. `take()` returns what was seen since it
    was last called.
    """

    def __init__(self, state: State, declared_dtype: torch.dtype | None, requests: RegionRequests) -> None:
        super().__init__()
        self.state = state
        self.declared = declared_dtype is not None
        self.requests = requests
        self._thread = threading.get_ident()
        self._open: list[_Open] = []
        self._modules: list[str] = []
        self._mode = _OpMode(self)
        self._active = 0
        self._use = AutocastUse()
        #: region key -> its record in `_use`
        self._regions: dict[tuple[str, str, str, str, bool | None], RegionUse] = {}
        self._bypasses: dict[tuple[str | None, str, str | None, str], Bypass] = {}

    # -- installing ---------------------------------------------------------------------------------------

    def _install(self) -> None:
        for name, method in (("__enter__", self._enter), ("__exit__", self._exit)):
            original = vars(AUTOCAST)[name]
            setattr(AUTOCAST, name, _wrapped(original, method))
            self._stack.callback(setattr, AUTOCAST, name, original)
        self._stack.callback(self._deactivate_all)
        # One pair of hooks per module, however many entries reach it: a second pair would push its name twice.
        for label, module in named_state_modules(self.state):
            self._stack.callback(module.register_forward_pre_hook(
                functools.partial(self._enter_module, label)).remove)
            self._stack.callback(module.register_forward_hook(
                functools.partial(self._exit_module, label), always_call=True).remove)

    def _here(self) -> bool:
        return threading.get_ident() == self._thread

    def _activate(self) -> None:
        if self._active == 0:
            self._mode.__enter__()  # type: ignore[no-untyped-call, unused-ignore]
        self._active += 1

    def _deactivate(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call, unused-ignore]

    def _deactivate_all(self) -> None:
        if self._active > 0:  # a run interrupted inside a region (a timeout) never exited it
            self._active = 1
            self._deactivate()

    # -- the wrapped autocast methods and module hooks --------------------------------------------------------

    def _enter(self, original: Callable[..., Any], instance: Any) -> Any:
        result = original(instance)
        # A region entered during a backward pass (`custom_bwd`, activation checkpointing's recomputation) repeats
        # the autocast state of its forward, which was judged there.
        if self._here() and torch._C._current_graph_task_id() == -1:
            function, location, kind = entered_from(sys._getframe(2))  # past this method and `_wrapped`
            enabled = bool(instance._enabled)
            use = RegionUse(function, location, kind, str(instance.device), str(instance.fast_dtype),
                            self.requests.requested(instance), enabled, not self._open)
            use = self._regions.setdefault(use.key, use)
            if use not in self._use.regions:
                self._use.regions.append(use)
            self._open.append(_Open(instance, use))
            self._activate()
        return result

    def _exit(self, original: Callable[..., Any], instance: Any, *args: Any) -> Any:
        if self._here() and any(opened.instance is instance for opened in self._open):
            while self._open.pop().instance is not instance:  # regions left open inside it close with it
                self._deactivate()
            self._deactivate()
        return original(instance, *args)

    def _enter_module(self, label: str, module: nn.Module, args: Any) -> None:
        if self._here():
            self._modules.append(label)
            if self.declared and len(self._modules) == 1:
                self._activate()

    def _exit_module(self, label: str, module: nn.Module, args: Any, output: Any) -> None:
        if self._here() and self._modules and self._modules[-1] == label:
            self._modules.pop()
            if self.declared and not self._modules:
                self._deactivate()

    # -- ops ----------------------------------------------------------------------------------------------

    def record_op(self, packet: Any, formula: Callable[..., int], args: tuple[Any, ...], kwargs: dict[str, Any],
                  out: Any) -> None:
        name: str = packet.__name__
        tensors = _tensors(args)
        floating = [t for t in tensors if t.is_floating_point()]
        if not floating or not self._here():
            return
        widest = max(floating, key=lambda t: t.element_size()).dtype
        dtype, device = str(widest), tensors[0].device.type
        flops = _flops(packet, formula, args, kwargs, out)
        low = low_precision(dtype)
        use = self._use
        use.calls_by_dtype[dtype] = use.calls_by_dtype.get(dtype, 0) + 1
        use.flops_by_dtype[dtype] = use.flops_by_dtype.get(dtype, 0) + flops
        if device not in use.op_devices:
            use.op_devices.append(device)
        same_device = [o.use for o in self._open if o.use.device_type == device]
        innermost = same_device[-1] if same_device else None
        outer = next((u for u in reversed(same_device) if u.requested and u.enabled), None)
        escape = innermost if innermost is not None and not innermost.enabled and outer is not None else None
        kept = not low and innermost is not None and innermost.enabled and widest is not torch.float64
        for opened in self._open:
            region = opened.use
            region.ops += 1
            if name not in region.op_names:
                region.op_names.append(name)
            if device not in region.op_devices:
                region.op_devices.append(device)
            if low:
                region.low_ops += 1
                region.low_flops += flops
                continue
            region.full_flops += flops
            region.kept_ops += kept
            if dtype not in region.full_dtypes:
                region.full_dtypes.append(dtype)
            if escape is not None and region.device_type == device:
                region.escaped_flops += flops
                if escape.describe() not in region.escapes:
                    region.escapes.append(escape.describe())
        if outer is None:
            written_off = same_device[0] if same_device and same_device[0].requested is False else None
            if written_off is not None and not low:
                self._add_bypass(use.disabled_bypasses, written_off, written_off.describe(), dtype, name, flops)
            return
        if low:
            use.low_flops += flops
        elif kept:
            use.kept_flops += flops
        else:
            self._add_bypass(use.bypasses, outer, None if escape is None else escape.describe(), dtype, name, flops)

    def _add_bypass(self, found: list[Bypass], region: RegionUse, escape: str | None, dtype: str, name: str,
                    flops: int) -> None:
        """Count one full-precision op of the innermost State module running into its `Bypass` in `found`."""
        module = self._modules[-1] if self._modules else None
        key = (module, region.describe(), escape, dtype)
        bypass = self._bypasses.get(key)
        if bypass is None:
            bypass = self._bypasses[key] = Bypass(module, region.describe(), region.function, escape, dtype)
            found.append(bypass)
        bypass.calls += 1
        bypass.flops += flops
        if name not in bypass.ops:
            bypass.ops.append(name)

    def take(self) -> AutocastUse:
        """What was seen since the last call; the regions still open go on counting into the next."""
        use, self._use = self._use, AutocastUse()
        self._regions, self._bypasses = {}, {}
        for opened in self._open:
            fresh = dataclasses.replace(opened.use, ops=0, low_ops=0, kept_ops=0, op_names=[], low_flops=0,
                                        full_flops=0, escaped_flops=0, op_devices=[], full_dtypes=[], escapes=[])
            self._regions[fresh.key] = opened.use = fresh
            self._use.regions.append(fresh)
        return use
