"""What every observer of training shares: hooks installed and undone as one, gradient copies, and the one rule
for optimizer steps that are not training."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Self

import torch
import torch.nn.functional as F

from trainparity._observe._records import CallRecord
from trainparity._state._tensors import gathered


def grad_copy(tensor: torch.Tensor | None, scale: float | None) -> torch.Tensor | None:
    """A detached CPU copy of a gradient (dense), divided by the scale that still multiplies it."""
    if tensor is None:
        return None
    copy = gathered(tensor).detach().to("cpu", copy=True)
    if copy.layout != torch.strided:  # sparse gradients (nn.Embedding(sparse=True)) compare as dense values
        copy = copy.to_dense()
    return copy / scale if scale is not None else copy


def tensor_norms(tensors: Sequence[torch.Tensor]) -> list[float]:
    """Each tensor's L2 norm, in its own dtype (float64 for float64 tensors), as clip_grad_norm_ computes them: one
    fused reduction on the tensors' device. A DTensor is gathered, a sparse tensor densified."""
    dense = []
    for tensor in tensors:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):  # a DTensor, a tensor subclass
            tensor = gathered(tensor)
        if tensor.layout != torch.strided:
            tensor = tensor.to_dense()
        dense.append(tensor.detach() if tensor.requires_grad else tensor)
    if not dense:
        return []
    norms = torch._foreach_norm(dense)
    if len({(norm.dtype, norm.device) for norm in norms}) == 1:  # one copy out, not one per tensor
        values: list[float] = torch.stack(norms).tolist()
        return values
    return [float(norm) for norm in norms]


def nonfinite_flags(tensors: Sequence[torch.Tensor]) -> list[bool]:
    """Whether each (gradient) tensor holds an inf or a NaN, without copying any: one fused L2-norm reduction on the
    tensors' device and one copy out (an inf or a NaN makes the norm non-finite); only a tensor whose norm is not
    finite is looked at again, element by element, since a sum of squares can also overflow on finite values. A
    DTensor is gathered; a sparse tensor is judged by its stored values."""
    flags = [False] * len(tensors)
    judged: list[int] = []
    values: list[torch.Tensor] = []
    for index, tensor in enumerate(tensors):
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):  # a DTensor, a tensor subclass
            tensor = gathered(tensor)
        if tensor.layout == torch.sparse_coo:
            tensor = tensor._values()
        elif tensor.layout != torch.strided:
            tensor = tensor.to_dense()
        if tensor.numel() and (tensor.is_floating_point() or tensor.is_complex()):
            judged.append(index)
            values.append(tensor.detach())
    if not values:
        return flags
    norms = torch._foreach_norm(values)
    if len({norm.device for norm in norms}) == 1:  # one copy out, not one per tensor
        finite: list[bool] = torch.isfinite(torch.stack(norms)).tolist()
    else:
        finite = [bool(torch.isfinite(norm)) for norm in norms]
    for index, value, norm_finite in zip(judged, values, finite, strict=True):
        flags[index] = not norm_finite and not bool(torch.isfinite(value).all())
    return flags


def creates_state(optimizer: torch.optim.Optimizer) -> bool:
    """A `step()` that is not training: torch.distributed.checkpoint's `get_state_dict` and
    `set_state_dict` step an optimizer that has no state yet with zero gradients and a learning
    rate of 0, to create the state a checkpoint is loaded into. Every observer of optimizer steps
    (recipes' and scripts') passes over it."""
    if optimizer.state:
        return False
    groups = optimizer.param_groups
    return all(float(group.get("lr", 0.0)) == 0.0 for group in groups) and all(
        parameter.grad is None or not bool(parameter.grad.any()) for group in groups for parameter in group["params"])


class HookSet:
    """Hooks and patches that `_install` puts in place on entry, each registering its undoing on `_stack`:
    all removed on exit, and on a failure halfway through installing, exceptions included."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def _install(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._install()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()


def wrap_method(stack: contextlib.ExitStack, obj: Any, name: str, before: Callable[..., None],
                after: Callable[..., None] | None = None) -> None:
    """Shadow `obj.name` with an instance attribute that calls `before` first and `after` last (also when it
    raises), each with the call's arguments; its undoing goes on `stack`."""
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

    stack.callback(undo)


class Watch(HookSet):
    """One concern of an observed run (dropout, batch-dependent modules, forward passes) that a check hands the
    `Observer` in its list of watches: installed after the observer's own hooks, removed with them, and told when
    each observed call of `step()` begins and ends."""

    def begin_call(self, index: int) -> None:
        """A call of `step()` begins (`index`: its number in the run)."""

    def end_call(self, call: CallRecord) -> None:
        """The call ends: what the watch saw of it goes into its record."""


def step_closure(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The closure an optimizer step hook's call passes (`optimizer.step(closure)`), or None. The hooks get the
    call's arguments with the optimizer itself first."""
    positional = args[1:] if args and args[0] is optimizer else args
    return positional[0] if positional else kwargs.get("closure")


@dataclasses.dataclass(frozen=True)
class FunctionalDropout:
    """A functional dropout of `torch.nn.functional`, and how a call of it says whether it drops."""

    name: str
    #: where its probability is passed (position, keyword), and its default
    position: int
    keyword: str
    default: float
    #: the default of its `training` argument, passed right after the probability; None: it has none (it drops
    #: whenever its probability is above 0)
    training: bool | None

    def probability(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[self.position] if len(args) > self.position else kwargs.get(self.keyword, self.default)

    def drops(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether the call drops: a probability above 0, in training."""
        if self.training is None:
            active: Any = True
        elif len(args) > self.position + 1:
            active = args[self.position + 1]
        else:
            active = kwargs.get("training", self.training)
        return bool(self.probability(args, kwargs)) and bool(active)

    def without_dropout(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments with its probability set to 0."""
        if len(args) > self.position:
            return (*args[:self.position], 0.0, *args[self.position + 1:]), kwargs
        return args, {**kwargs, self.keyword: 0.0}


#: the functional dropouts (`nn.MultiheadAttention` calls `scaled_dot_product_attention(dropout_p=...)`)
DROPOUT_FUNCTIONS: dict[Callable[..., Any], FunctionalDropout] = {
    F.dropout: FunctionalDropout("F.dropout", 1, "p", 0.5, True),
    F.dropout1d: FunctionalDropout("F.dropout1d", 1, "p", 0.5, True),
    F.dropout2d: FunctionalDropout("F.dropout2d", 1, "p", 0.5, True),
    F.dropout3d: FunctionalDropout("F.dropout3d", 1, "p", 0.5, True),
    F.alpha_dropout: FunctionalDropout("F.alpha_dropout", 1, "p", 0.5, False),
    F.feature_alpha_dropout: FunctionalDropout("F.feature_alpha_dropout", 1, "p", 0.5, False),
    F.scaled_dot_product_attention: FunctionalDropout("F.scaled_dot_product_attention", 4, "dropout_p", 0.0, None),
}


#: torch's namespaces by module name: how many names each held when indexed, and each of its names by the id of
#: the function it held then, a router counted as the function it routes (`_torch_names`)
_TORCH_INDEX: dict[str, tuple[int, dict[int, list[str]]]] = {}


def _torch_names(namespace: Any, function: Callable[..., Any]) -> list[str]:
    """The names under which one of torch's namespaces holds `function` (or its router) now. Its few hundred names are
    indexed once (again if it gains or loses names), not walked at every check: each name found is checked to hold
    `function` or its router still, so a name rebound since is passed over."""
    names = vars(namespace)
    size, index = _TORCH_INDEX.get(namespace.__name__, (-1, {}))
    if size != len(names):
        index = {}
        for attribute, value in names.items():
            index.setdefault(id(_Routes.originals.get(id(value), value)), []).append(attribute)
        _TORCH_INDEX[namespace.__name__] = (len(names), index)
    held = (function, _Routes.routers.get(id(function)))
    return [attribute for attribute in index.get(id(function), []) if any(names.get(attribute) is h for h in held)]


class _Routes:
    """Where torch's functions are patched, a router takes their place for as long as any patch holds the place: it
    calls the wrapper of the thread that calls it, or the function itself in a thread that patched nothing. So the
    ranks of a threaded world (`backend="threads"`), threads of one process, each observe their own calls."""

    lock = threading.Lock()
    #: id(function) -> its router, and id(router) -> the function
    routers: dict[int, Callable[..., Any]] = {}
    originals: dict[int, Callable[..., Any]] = {}
    #: (id(namespace), attribute) -> how many patches hold the router there
    holds: Counter[tuple[int, str]] = Counter()
    #: per thread: id(function) -> the wrapper that thread's patch installed
    local = threading.local()

    @classmethod
    def wrappers(cls) -> dict[int, Callable[..., Any]]:
        if not hasattr(cls.local, "wrappers"):
            cls.local.wrappers = {}
        wrappers: dict[int, Callable[..., Any]] = cls.local.wrappers
        return wrappers

    @classmethod
    def router(cls, function: Callable[..., Any]) -> Callable[..., Any]:
        router = cls.routers.get(id(function))
        if router is None:
            @functools.wraps(function)
            def route(*args: Any, **kwargs: Any) -> Any:
                return cls.wrappers().get(id(function), function)(*args, **kwargs)

            router = cls.routers[id(function)] = route
            cls.originals[id(route)] = function
        return router

    @classmethod
    def hold(cls, namespace: Any, attribute: str, function: Callable[..., Any]) -> None:
        with cls.lock:
            cls.holds[id(namespace), attribute] += 1
            setattr(namespace, attribute, cls.router(function))

    @classmethod
    def release(cls, namespace: Any, attribute: str, function: Callable[..., Any]) -> None:
        with cls.lock:
            cls.holds[id(namespace), attribute] -= 1
            if cls.holds[id(namespace), attribute] == 0:
                del cls.holds[id(namespace), attribute]
                setattr(namespace, attribute, function)


#: modules that a recipe class's MRO may pass through and that hold none of the recipe's code
_NOT_THE_RECIPES = frozenset({"builtins", "typing", "abc"})


def patch_functions(stack: contextlib.ExitStack, recipe_type: type, functions: dict[Callable[..., Any], str],
                    make_wrapper: Callable[[Callable[..., Any], str], Callable[..., Any]],
                    namespaces: Sequence[Any] | None = None) -> None:
    """Have `make_wrapper(function, name)` called in place of `functions` (torch's, each named) by this thread, in
    torch's namespaces and in the recipe's own modules, where `from torch.nn.utils import clip_grad_norm_` bound the
    name at import (`_Routes`); each undoing goes on `stack`. A function this thread has patched already keeps its
    first wrapper. `namespaces`: torch's modules that hold the functions (by default `torch.nn.utils`, its
    `clip_grad` and `torch.nn.functional`)."""
    import torch.nn.utils.clip_grad as clip_grad

    # a function read from torch's namespace while another thread's patch holds it is that patch's router
    functions = {_Routes.originals.get(id(function), function): name for function, name in functions.items()}
    torch_namespaces: list[Any] = [torch.nn.utils, clip_grad, F] if namespaces is None else list(namespaces)
    # the modules of the recipe's classes but Python's and our private ones (`object`, `Generic`, `tp.Recipe`): those
    # call none of the recipe's functions (a quickstart's recipe, in trainparity.quickstarts, is looked through)
    recipe_namespaces = [sys.modules[c.__module__] for c in recipe_type.__mro__ if c.__module__ in sys.modules
                         and c.__module__ not in _NOT_THE_RECIPES and not c.__module__.startswith("trainparity._")]
    found: list[tuple[Any, str, Callable[..., Any]]] = []
    for namespace in torch_namespaces:
        found += [(namespace, attribute, original) for original in functions
                  for attribute in _torch_names(namespace, original)]
    # by id: a module of the user's may hold hundreds of names, each looked up once; `functions` holds each function
    # and `_Routes` each router, so their ids are no other object's
    by_id = {id(original): original for original in functions}
    by_id.update({id(_Routes.routers[key]): original for key, original in list(by_id.items())
                  if key in _Routes.routers})
    for namespace in dict.fromkeys(recipe_namespaces):
        if namespace in torch_namespaces:
            continue
        found += [(namespace, attribute, by_id[id(value)]) for attribute, value in list(vars(namespace).items())
                  if id(value) in by_id]
    for namespace, attribute, original in found:
        _Routes.hold(namespace, attribute, original)
        stack.callback(_Routes.release, namespace, attribute, original)
    wrappers = _Routes.wrappers()
    for original, name in functions.items():
        if id(original) not in wrappers:
            wrappers[id(original)] = make_wrapper(original, name)
            stack.callback(wrappers.pop, id(original))
