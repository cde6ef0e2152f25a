"""Frozen tensors watched through the observed steps: what the frozen check and the optimizer coverage check share.

`FrozenWatch` keeps a copy of each frozen parameter and buffer, read as every check reads a tensor
(`_state/_tensors.py: readable`: dequantized, densified, a nested tensor's components, gathered), and compares
it, bitwise, at the points where the observer can tell what changed it: before each optimizer step (what the
recipe's code or a forward pass did since the last point), after it (what that optimizer did, with the
parameter's `.grad`, its group's weight decay and its optimizer state as they were at the step), and at the
end of each `step()` call. A buffer that changed in a train-mode forward of its module (`ForwardRecorder`) is
blamed on that forward. A buffer is followed by its module and attribute, so one replaced by assignment
(`module.stats = new`) is seen too. The records travel to the parent, where `watch_violations` turns them
into violations with one message per cause.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from trainparity._observe._observer import Observer
from trainparity._observe._records import ForwardRecord
from trainparity._results._violation import Violation
from trainparity._state._compare import EXACT, bitwise_equal, compare_leaves
from trainparity._state._tensors import readable


@dataclasses.dataclass
class Change:
    """A frozen tensor that changed in a `step()` call, and what the run saw change it."""

    #: `parameters.<name>` or `buffers.<name>`
    path: str
    step: int
    #: "optimizer" (inside an optimizer step of the State), "forward" (a train-mode forward of the buffer's
    #: module), or "code" (anything else: the recipe's code, an optimizer the State does not hold)
    by: str
    #: how it differs from its value when it was first seen frozen, in torch.testing's words
    mismatch: str
    #: it required grad at that moment (declared frozen but trainable, or unfrozen during the run)
    trainable: bool = False
    #: "optimizer": the optimizer's entry and class, and at its step the parameter's `.grad` ("none", "zeros" or
    #: "values"), its group's weight decay and the names of its optimizer state
    optimizer: str | None = None
    optimizer_type: str | None = None
    grad: str | None = None
    weight_decay: float | None = None
    optimizer_state: list[str] = dataclasses.field(default_factory=list)
    #: a buffer's module and its class
    module: str | None = None
    module_type: str | None = None

    @property
    def name(self) -> str:
        return self.path.split(".", 1)[1]


@dataclasses.dataclass
class Trainable:
    """A watched parameter that required grad and held a gradient in a `step()` call."""

    path: str
    step: int


@dataclasses.dataclass
class WatchRecord:
    """What the watch saw, in observation order; `stepped`: per parameter, the steps at which an optimizer stepped it
    while it was frozen with a `.grad` that was not None; `frozen`: every path watched, in the order first seen
    frozen."""

    events: list[Change | Trainable] = dataclasses.field(default_factory=list)
    stepped: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    frozen: list[str] = dataclasses.field(default_factory=list)


#: a watched tensor's values: its dense values (a nested tensor's components), or a note where it has none
Values = list[torch.Tensor] | str


def _values(tensor: torch.Tensor | None) -> Values:
    if tensor is None:
        return "<removed>"
    values = readable(tensor.detach())
    return values if isinstance(values, (list, str)) else [values]


def _copy(values: Values) -> Values:
    return values if isinstance(values, str) else [value.clone() for value in values]


def _same(before: Values, after: Values) -> bool:
    if isinstance(before, str) or isinstance(after, str):
        return before == after
    return len(before) == len(after) and all(bitwise_equal(b, a) for b, a in zip(before, after, strict=True))


def _difference(before: Values, after: Values) -> str:
    """How `after` differs from `before`, in the comparison's words (the first component that differs)."""
    if isinstance(before, str) or isinstance(after, str) or len(before) != len(after):
        shown = [v if isinstance(v, str) else f"{len(v)} component(s)" for v in (before, after)]
        return f"Values are not equal!\n\nExpected {shown[0]} but got {shown[1]}."
    for index, (b, a) in enumerate(zip(before, after, strict=True)):
        mismatch = compare_leaves(b.cpu(), a.cpu(), EXACT)  # the message is built where its numbers are read
        if mismatch is not None:
            return mismatch.message + (f"\nThe failure occurred for component {index}." if len(before) > 1 else "")
    return "Values are not equal!"


@dataclasses.dataclass(frozen=True)
class BufferRef:
    """A buffer, followed by its module and attribute, with the module's name and class for the messages."""

    module: nn.Module
    attribute: str
    name: str
    kind: str

    def tensor(self) -> torch.Tensor | None:
        return self.module._buffers.get(self.attribute)


@dataclasses.dataclass
class _Watched:
    #: a parameter, or a buffer's reference
    source: torch.Tensor | BufferRef
    #: its values when it was first seen frozen, and at the last point compared
    reference: Values
    last: Values

    def current(self) -> torch.Tensor | None:
        return self.source.tensor() if isinstance(self.source, BufferRef) else self.source


def _grad_kind(grad: torch.Tensor | None) -> str:
    if grad is None:
        return "none"
    values = grad.detach()
    return "values" if bool((values.to_dense() if values.layout != torch.strided else values).any()) else "zeros"


class FrozenWatch:
    """Watches frozen tensors through observed `step()` calls. Built before the Observer, whose `before_step` and
    `after_step` are its methods; `start` begins the watch once the Observer is installed."""

    def __init__(self) -> None:
        self.record = WatchRecord()
        self._watched: dict[str, _Watched] = {}
        #: parameters watched from the moment they are seen with requires_grad=False: id -> (path, parameter)
        self._candidates: dict[int, tuple[str, torch.Tensor]] = {}
        #: the watched parameters of the optimizer stepping now, with what its step saw
        self._stepping: dict[str, Change] = {}
        self._trainable_seen: set[tuple[str, int]] = set()

    def start(self, observer: Observer, watched: dict[str, torch.Tensor | BufferRef],
              candidates: dict[int, tuple[str, torch.Tensor]]) -> None:
        """Watch `watched` (path -> a parameter, or a buffer's reference) from now on, and each parameter of
        `candidates` from the point it is first seen frozen."""
        self._observer = observer
        self._candidates = dict(candidates)
        for path, source in watched.items():
            self._watch(path, source)

    def _watch(self, path: str, source: torch.Tensor | BufferRef) -> None:
        value = _copy(_values(source.tensor() if isinstance(source, BufferRef) else source))
        self._watched[path] = _Watched(source, value, value)
        self.record.frozen.append(path)

    def _discover(self) -> None:
        for key, (path, parameter) in list(self._candidates.items()):
            if not parameter.requires_grad and path not in self._watched:
                self._watch(path, parameter)
                del self._candidates[key]

    def _compare(self, path: str, by: str, step: int) -> Change | None:
        """The change of `path` since the last point compared, if any (the last point moves to now)."""
        watched = self._watched[path]
        tensor = watched.current()
        current = _values(tensor)
        if _same(watched.last, current):
            return None
        mismatch = _difference(watched.last if _same(watched.reference, current) else watched.reference, current)
        watched.last = _copy(current)
        source = watched.source
        buffer = source if isinstance(source, BufferRef) else None
        return Change(path, step, by, mismatch, trainable=tensor is not None and tensor.requires_grad,
                      module=buffer.name if buffer else None, module_type=buffer.kind if buffer else None)

    def _look(self, step: int) -> None:
        """Compare everything watched (a change is the recipe's code's until an optimizer or a forward is blamed);
        record what required grad and held a gradient."""
        self._discover()
        for path, watched in self._watched.items():
            tensor = watched.current()
            if (tensor is not None and tensor.requires_grad and tensor.grad is not None
                    and (path, step) not in self._trainable_seen):
                self._trainable_seen.add((path, step))
                self.record.events.append(Trainable(path, step))
            change = self._compare(path, "code", step)
            if change is not None:
                self.record.events.append(change)

    # -- the observer's callbacks -------------------------------------------------------------------

    def before_step(self, entry: str, optimizer: torch.optim.Optimizer) -> None:
        if self._observer.call is None:  # a step outside the observed calls
            return
        step = self._observer.call_index
        self._look(step)
        paths = {id(w.source): path for path, w in self._watched.items() if isinstance(w.source, torch.Tensor)}
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                path = paths.get(id(parameter))
                if path is None or path in self._stepping:
                    continue
                grad = _grad_kind(parameter.grad)
                if grad != "none" and not parameter.requires_grad:
                    self.record.stepped.setdefault(path, []).append(step)
                decay = group.get("weight_decay")
                state = [key for key, value in optimizer.state.get(parameter, {}).items()
                         if key != "step" and isinstance(value, torch.Tensor)]
                self._stepping[path] = Change(path, step, "optimizer", "", optimizer=entry,
                                              optimizer_type=type(optimizer).__name__, grad=grad,
                                              weight_decay=None if decay is None else float(decay),
                                              optimizer_state=state)

    def after_step(self, entry: str, optimizer: torch.optim.Optimizer) -> None:
        for path, seen in self._stepping.items():
            change = self._compare(path, "optimizer", seen.step)
            if change is not None:
                self.record.events.append(dataclasses.replace(seen, mismatch=change.mismatch,
                                                              trainable=change.trainable))
        self._stepping.clear()

    def end_call(self, step: int, forwards: ForwardRecord | None) -> None:
        """After `step()` call `step` returned: compare everything; a buffer that a train-mode forward of its module
        changed in the call is blamed on that forward."""
        self._look(step)
        changed = {buffer for forward in (forwards.passes if forwards else []) for buffer in forward.buffers}
        for index, event in enumerate(self.record.events):
            if (isinstance(event, Change) and event.step == step and event.by == "code"
                    and event.path.startswith("buffers.") and event.name in changed):
                self.record.events[index] = dataclasses.replace(event, by="forward")


# -- the judgement (in the parent) ------------------------------------------------------------------


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def _optimizer_reason(change: Change) -> str:
    who = f"optimizer '{change.optimizer}' ({change.optimizer_type})"
    if change.trainable:
        return (f"{who} updated it with the gradient it received: it requires grad (requires_grad=True), so it is "
                "not frozen (see frozen_param_trainable).")
    if change.grad == "none":
        return (f"{who} updated it although its .grad was None: this optimizer does not skip parameters without a "
                "gradient. Build the optimizer from the trainable parameters only.")
    held = ("all zeros: a gradient from before it was frozen, which zero_grad(set_to_none=False) zeroes but keeps"
            if change.grad == "zeros" else "a gradient from before it was frozen, which nothing set to None")
    movers = []
    if change.optimizer_state:
        movers.append(f"its optimizer state from before the freeze ({', '.join(change.optimizer_state)})")
    if change.weight_decay:
        movers.append(f"its group's weight_decay={change.weight_decay:g}")
    moved = f", and {_listed(movers)} moved it" if movers else ""
    return (f"{who} stepped it: its .grad is not None ({held}), so the optimizer does not skip it{moved}. Set "
            "its gradient to None when freezing it (p.grad = None, or optimizer.zero_grad() with the default "
            "set_to_none=True), or build the optimizer from the trainable parameters only.")


def change_violation(change: Change, declared: bool) -> Violation:
    """The violation for a watched tensor that changed, its message saying what changed it."""
    n, name = change.step, change.name
    if change.path.startswith("buffers."):
        module = f"{change.module_type} '{change.module}'"
        if change.by == "forward":
            text = (f"Buffer '{name}' of frozen {module} changed in step {n}: the module ran its forward in train mode "
                    "and updated it (a BatchNorm's running statistics). Keep a frozen module in eval mode: call "
                    ".eval() on it after every model.train(), or override the model's train() to do so (mmcv's "
                    "norm_eval).")
            cause = "frozen_module_in_train_mode"
        else:
            text = (f"Buffer '{name}' of frozen {module} changed in step {n} outside a train-mode forward of its "
                    "module: the recipe's code wrote it.")
            cause = "frozen_buffer_changed"
        return Violation("frozen_buffer_changed", change.path, f"{text}\n\n{change.mismatch}", step=n, cause=cause)
    what = "declared frozen" if declared else "frozen"
    if change.by == "optimizer":
        text = f"Parameter '{name}' ({what}) changed in step {n}: {_optimizer_reason(change)}"
    else:
        text = (f"Parameter '{name}' ({what}) changed in step {n} outside any optimizer step of the State: the "
                "recipe's code wrote it (an in-place update, copy_, load_state_dict), or an optimizer the State "
                "does not hold stepped it.")
        if change.trainable and not declared:
            text += (" It requires grad again: it was unfrozen during the run; if that is meant, declare the "
                     "parameters meant to stay frozen with frozen=.")
    cause = "frozen_param_trainable" if change.trainable else "frozen_param_changed"
    return Violation("frozen_param_changed", change.path, f"{text}\n\n{change.mismatch}", step=n, cause=cause)


def trainable_violation(event: Trainable, declared: bool) -> Violation:
    name = event.path.split(".", 1)[1]
    if declared:
        text = (f"Parameter '{name}' is declared frozen, but it requires grad and held a gradient in step "
                f"{event.step}: nothing froze it. Freeze it where the model is built (requires_grad_(False)): a "
                "freeze applied only in train() never runs when nothing calls model.train() (mmpretrain issue 702).")
    else:
        text = (f"Parameter '{name}' was frozen, but it requires grad again and held a gradient in step "
                f"{event.step}: it was unfrozen during the run. If that is meant, declare the parameters meant to "
                "stay frozen with frozen=.")
    return Violation("frozen_param_trainable", event.path, text, step=event.step, cause="frozen_param_trainable")


def watch_violations(record: WatchRecord, declared: bool) -> list[Violation]:
    """The watch's violations in observation order."""
    return [change_violation(e, declared) if isinstance(e, Change) else trainable_violation(e, declared)
            for e in record.events]
