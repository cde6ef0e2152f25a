"""Autocast coverage, the part of `check_mixed_precision` that judges what `_observe/_autocast.py` saw.

- `autocast_ineffective` (path `autocast.<function that entered the region>`): an autocast region enabled as
  written in which matmul, convolution or attention ops ran, none of them in a low dtype; for a recipe that
  declares `autocast_dtype`, also any outermost region of a step none of whose ops ran in a low dtype, and one
  made before the check whose `enabled` torch overrode (without a declared dtype: a note); or a recipe that
  declares `autocast_dtype` whose `step()` ran those ops in full precision outside any region (path `autocast`).
  The message says why: the region's device type against the tensors' device, `enabled`, a nested region that
  turned autocast off, float64 inputs.
- `autocast_bypassed` (path `modules.<module>`): ops that ran in float32 (or float64) inside an enabled region
  for their device, or under an outermost region disabled as written in a step whose other ops ran in a low
  dtype (the "loss in float32" form, judged as the same region nested would be), per module. Their share of the
  FLOPs, outside the modules `allow_float32` names, may be at most `max_float32_share` (default 0: none); below
  it they are a note. The share's whole is the FLOPs of those ops and of the ops in enabled regions that ran in
  a low dtype (allowed modules included); the FLOPs torch itself kept in float32 are left out of it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from typing import Any, cast

import torch

from trainparity._observe._autocast import AutocastUse, Bypass, RegionUse, low_precision
from trainparity._results._violation import Violation, format_number
from trainparity._validation import InvalidArgument, check_argument

#: what the reports call the ops the watch records (torch's FLOP table)
WATCHED_OPS = "matmul, convolution or attention"


def declared_dtype(recipe_type: type) -> torch.dtype | None:
    """The recipe's `autocast_dtype`, validated (a TypeError names the fix)."""
    declared = getattr(recipe_type, "autocast_dtype", None)
    if declared is None:
        return None
    check_argument(isinstance(declared, torch.dtype) and declared.is_floating_point and declared.itemsize < 4,
                   f"{recipe_type.__name__}.autocast_dtype must be None or the low dtype autocast should run matmuls "
                   f"in (torch.bfloat16 or torch.float16), got {declared!r}")
    return cast(torch.dtype, declared)


@dataclasses.dataclass(frozen=True)
class AutocastRules:
    """The recipe's declared dtype and what the check's arguments allow."""

    declared: str | None
    allow_float32: tuple[str, ...]
    max_float32_share: float

    @classmethod
    def validate(cls, declared: torch.dtype | None, allow_float32: object, max_float32_share: object) -> AutocastRules:
        if allow_float32 is None:
            globs: tuple[str, ...] = ()
        elif isinstance(allow_float32, str):
            globs = (allow_float32,)
        elif isinstance(allow_float32, Sequence) and all(isinstance(g, str) and g for g in allow_float32):
            globs = tuple(allow_float32)
        else:
            raise InvalidArgument("allow_float32= must be None or module-name globs (strings) whose float32 ops inside "
                                  f"autocast are deliberate, e.g. ('attn*',), got {allow_float32!r}")
        check_argument(not isinstance(max_float32_share, bool) and isinstance(max_float32_share, (int, float))
                       and 0.0 <= max_float32_share <= 1.0, "max_float32_share= must be a number in [0, 1] (the share "
                       f"of the FLOPs inside autocast regions that may run in float32), got {max_float32_share!r}")
        return cls(None if declared is None else str(declared), globs, float(cast(float, max_float32_share)))

    def config(self) -> dict[str, Any]:
        """What the result's config shows: only what differs from the defaults, so existing reports keep theirs."""
        shown: dict[str, Any] = {}
        if self.declared is not None:
            shown["autocast_dtype"] = self.declared
        if self.allow_float32:
            shown["allow_float32"] = list(self.allow_float32)
        if self.max_float32_share:
            shown["max_float32_share"] = self.max_float32_share
        return shown

    def allowed(self, module: str | None) -> str | None:
        """The glob of `allow_float32` that allows `module` or a module it belongs to, if any."""
        if module is None:
            return None
        parts = module.split(".")
        names = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        return next((glob for glob in self.allow_float32 for name in names if fnmatch.fnmatchcase(name, glob)), None)


def _ops(region: RegionUse) -> str:
    return f"{region.ops} {WATCHED_OPS} op{'s' if region.ops != 1 else ''} ({', '.join(region.op_names)})"


def _percent(part: int, whole: int) -> str:
    return f"{format_number(100.0 * part / whole if whole else 0.0, 3)}%"


def _ineffective(region: RegionUse, step: int, rules: AutocastRules) -> Violation:
    """Why a region whose ops all ran in full precision did nothing."""
    low = rules.declared or region.dtype
    full = ", ".join(region.full_dtypes) or "full precision"
    devices = ", ".join(region.op_devices)
    if region.requested is False:
        why = (f" is disabled as written (enabled=False, often read from a config flag), while the recipe declares "
               f"autocast_dtype={rules.declared}: its {_ops(region)} ran in {full}. Enable it, or drop autocast_dtype "
               "if this run is meant to train in full precision.")
    elif region.device_type not in region.op_devices:
        off = (f"; torch turned the region off (no usable {region.device_type} device here)"
               if not region.enabled else "")
        why = (f" only changes ops on {region.device_type} tensors, but its {_ops(region)} ran on {devices} tensors, "
               f"in {full}{off}. Autocast on the tensors' device: torch.autocast({region.op_devices[0]!r}, "
               f"dtype={low}), e.g. torch.autocast(x.device.type, ...).")
    elif not region.enabled:
        why = (f" was turned off by torch ({region.dtype} is not supported by {region.device_type} autocast here): "
               f"its {_ops(region)} ran in {full}.")
    elif region.escaped_flops and region.escaped_flops == region.full_flops:
        why = (f": its {_ops(region)} all ran with autocast turned off inside it, by {'; '.join(region.escapes)}, "
               f"in {full}. Remove the nested region, or narrow it to the op that must run in full precision.")
    elif "torch.float64" in region.full_dtypes:
        why = (f": its {_ops(region)} ran in {full}; autocast never lowers float64 inputs (it casts float32 ones). "
               "Keep the model and inputs in float32 under autocast.")
    else:  # the ops torch kept in float32 are not judged: some ran in float64
        why = f": its {_ops(region)} ran in {full}."
    return Violation("autocast_ineffective", f"autocast.{region.function}", region.describe() + why, step=step,
                     expected=low, actual=full, cause="autocast_ineffective")


def _unjudged_region_note(region: RegionUse) -> str:
    """Why an outermost region that lowered nothing, in a recipe that declares no `autocast_dtype`, is not judged."""
    full = ", ".join(region.full_dtypes) or "full precision"
    if region.requested is None:
        text = (f"{region.describe()} was made before the check started and torch turned it off (no usable "
                f"{region.device_type} device, or {region.dtype} unsupported there), so whether it is enabled as "
                f"written cannot be told: its {_ops(region)} ran in {full}.")
    else:
        text = f"{region.describe()} is disabled (enabled=False): its {_ops(region)} ran in {full}."
    return text + " Declare autocast_dtype on the recipe to fail runs in which autocast does nothing."


@dataclasses.dataclass
class _Group:
    """Full-precision ops of one module (region, escape, dtype) over the run."""

    bypass: Bypass
    step: int


def _bypass_text(bypass: Bypass) -> str:
    where = f"Module '{bypass.module}'" if bypass.module is not None else "Code outside the State's modules"
    calls = f"{bypass.calls} call{'s' if bypass.calls != 1 else ''} of {', '.join(bypass.ops)}"
    how = (", a region disabled as written in a step whose other ops ran in a low dtype"
           if bypass.escape == bypass.region else
           f", with autocast turned off by {bypass.escape}" if bypass.escape is not None else
           "; its inputs were torch.float64, which autocast never lowers")
    return f"{where} ran {calls} in {bypass.dtype} inside {bypass.region}{how}"


def _bypass_violations(groups: list[_Group], total: int, rules: AutocastRules) -> tuple[list[Violation], list[str]]:
    """One violation per module whose full-precision FLOPs are not allowed, when their share exceeds the maximum;
    a note otherwise."""
    counted = [g for g in groups if rules.allowed(g.bypass.module) is None]
    full = sum(g.bypass.flops for g in counted)
    share = full / total if total else 0.0
    limit = (f"At most {format_number(100.0 * rules.max_float32_share, 3)}% may run in full precision "
             f"(max_float32_share={format_number(rules.max_float32_share)}) outside the modules allow_float32 names "
             f"({', '.join(map(repr, rules.allow_float32)) or 'none'}).")
    where = "in enabled autocast regions" + (" and in the regions disabled as written beside them" if any(
        g.bypass.escape == g.bypass.region for g in groups) else "")
    # At the default maximum of 0, a bypass whose FLOPs torch cannot count (a share of 0) still fails.
    if counted and (share > rules.max_float32_share or not rules.max_float32_share):
        violations = []
        for group in counted:
            bypass = group.bypass
            name = bypass.module
            allow = f"allow_float32=({name!r},)" if name is not None else "a module of its own"
            amount = (f"{_percent(bypass.flops, total)} of the FLOPs of the {WATCHED_OPS} ops {where} "
                      f"({format_number(bypass.flops, 3)} of {format_number(total, 3)}; in all {_percent(full, total)} "
                      "ran in full precision)"
                      if bypass.flops else
                      "FLOPs that torch's formula cannot count, so at max_float32_share=0 they fail whatever the share")
            violations.append(Violation(
                "autocast_bypassed", f"modules.{name}" if name is not None else f"autocast.{bypass.region_function}",
                f"{_bypass_text(bypass)}: {amount}. {limit} If it is deliberate (a float32 attention, say), allow it "
                f"with {allow}.",
                step=group.step, expected=rules.max_float32_share, actual=float(format_number(share)),
                cause="autocast_bypassed"))
        return violations, []
    shown = []
    for group in groups:
        glob = rules.allowed(group.bypass.module)
        shown.append(f"{_bypass_text(group.bypass)} ({_percent(group.bypass.flops, total)} of the FLOPs"
                     + (f"; allowed by allow_float32 {glob!r})" if glob is not None else ")"))
    if not shown:
        return [], []
    return [], [f"Full-precision ops {where}: {'; '.join(shown)}. Outside the modules "
                f"allow_float32 names, {_percent(full, total)} of the FLOPs ran in full precision "
                f"(max_float32_share={format_number(rules.max_float32_share)})."]


def autocast_findings(steps: list[tuple[int, AutocastUse]], rules: AutocastRules
                      ) -> tuple[dict[int, list[Violation]], list[str]]:
    """The autocast violations of each step (ineffective regions at every step they recur, then the modules whose
    full-precision ops are too many, at the step they first ran), and the notes."""
    found: dict[int, list[Violation]] = {step: [] for step, _ in steps}
    notes: list[str] = []
    groups: dict[tuple[str | None, str, str | None, str], _Group] = {}
    total = 0
    kept = 0
    for step, use in steps:
        # A region disabled as written in a step that ran other ops in a low dtype is judged by its ops, as bypasses.
        lowered = any(low_precision(dtype) for dtype in use.calls_by_dtype)
        bypasses = use.bypasses + use.disabled_bypasses if lowered else use.bypasses
        for region in use.regions:
            judged = region.requested is True or (rules.declared is not None and region.outermost and (
                not lowered or region.requested is None))
            if not judged:
                note = _unjudged_region_note(region)
                if region.outermost and region.ops and region.low_ops == 0 and not (
                        lowered and region.requested is False) and note not in notes:
                    notes.append(note)
                continue
            if region.ops == region.kept_ops:
                note = (f"{region.describe()} ran no {WATCHED_OPS} op that autocast lowers: it changed nothing there."
                        if region.ops == 0 else "")
                if note and note not in notes:
                    notes.append(note)
            elif region.low_ops == 0:
                found[step].append(_ineffective(region, step, rules))
        calls = sum(use.calls_by_dtype.values())
        if rules.declared is not None and calls and not found[step] and not lowered:
            dtypes = ", ".join(sorted(use.calls_by_dtype))
            where = ("step() entered no autocast region" if not use.regions else
                     "they ran outside its autocast regions")
            found[step].append(Violation(
                "autocast_ineffective", "autocast",
                f"The recipe declares autocast_dtype={rules.declared}, but none of the {calls} {WATCHED_OPS} ops of "
                f"step() ran in a low dtype ({dtypes}): {where}. Run the forward under "
                f"torch.autocast(device_type, dtype={rules.declared}).", step=step, expected=rules.declared,
                actual=dtypes, cause="autocast_ineffective"))
        total += use.low_flops + sum(b.flops for b in bypasses)
        kept += use.kept_flops
        for bypass in bypasses:
            key = (bypass.module, bypass.region, bypass.escape, bypass.dtype)
            if key in groups:
                group = groups[key].bypass
                group.calls += bypass.calls
                group.flops += bypass.flops
                group.ops += [op for op in bypass.ops if op not in group.ops]
            else:
                groups[key] = _Group(dataclasses.replace(bypass, ops=list(bypass.ops)), step)
    violations, bypass_notes = _bypass_violations(list(groups.values()), total, rules)
    for violation in violations:
        assert violation.step is not None
        found[violation.step].append(violation)
    notes += bypass_notes
    if kept:
        notes.append(f"Torch kept {format_number(kept, 3)} FLOPs of {WATCHED_OPS} ops in float32 with autocast on for "
                     "their device (autocast's float32 policy for the op that called them, such as cdist, or a kernel "
                     "that computes in float32, such as the CPU math path of scaled_dot_product_attention): not "
                     "judged.")
    if rules.declared is not None and not any(use.calls_by_dtype for _, use in steps):
        notes.append(f"The recipe declares autocast_dtype={rules.declared}, but no {WATCHED_OPS} op ran in its "
                     "modules' forward or in an autocast region: nothing to judge.")
    return found, notes
