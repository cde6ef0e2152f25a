"""Any State a user may hold: every tensor kind compares, digests, crosses the wire and renders, in every check.

The property: for generated States (tensor kinds x containers x key types, cycles, deques and OrderedDicts
included; the other containers in test_containers.py), two builds of
the same State compare equal under every comparison a check uses, as they are and after a child's trip
over the wire (digests too), and a State built with one element changed differs at exactly that path.
"""

from __future__ import annotations

import collections
import json
import math
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tensor_kinds import KINDS, KindsRecipe, changed

import trainparity as tp
from trainparity._process import _wire
from trainparity._records import read
from trainparity._state._compare import EXACT, Comparison, Snapshot, compare_snapshots
from trainparity._state._precision import FLOAT64_TOLERANCE
from trainparity._state._snapshot import Digesting, key_text, snapshot_state

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]

#: the comparisons the checks use: exact (resume, scripts), float64's tolerance (accumulation, parallel), a
#: user's declared one
COMPARISONS: list[Comparison] = [EXACT, FLOAT64_TOLERANCE, tp.ToleranceComparison(rtol=1e-3, atol=1e-3)]
#: snapshots as an in-process check holds them, and as a resume child ships them (every tensor digested)
DIGESTINGS = [None, Digesting(above=0)]


def over_the_wire(snapshot: Snapshot, directory: pathlib.Path) -> Snapshot:
    """The snapshot as the parent reads it from a child."""
    _wire.dump(snapshot, directory / "trace")
    return read(Snapshot, _wire.load(directory / "trace"), "snapshot")


def differing_paths(expected: tp.State, actual: tp.State, tmp_path: pathlib.Path) -> Iterator[list[str]]:
    """For every comparison and digesting, the paths at which `actual` differs from `expected`, as compared in
    this process and after both crossed the wire."""
    for digesting in DIGESTINGS:
        e, a = snapshot_state(expected, digesting), snapshot_state(actual, digesting)
        e_wire, a_wire = over_the_wire(e, tmp_path), over_the_wire(a, tmp_path)
        for comparison in COMPARISONS:
            yield [m.path for m in compare_snapshots(e, a, comparison)]
            yield [m.path for m in compare_snapshots(e_wire, a_wire, comparison)]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_equals_itself_and_differs_where_changed(kind: str, tmp_path: pathlib.Path) -> None:
    build = KINDS[kind]
    for paths in differing_paths(tp.State(x=build(0)), tp.State(x=build(0)), tmp_path):
        assert paths == []
    other, suffix = changed(build(0))
    for paths in differing_paths(tp.State(x=build(0)), tp.State(x=other), tmp_path):
        assert paths == [f"x{suffix}"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_survives_the_reference_checkpoint(kind: str, tmp_path: pathlib.Path) -> None:
    saved = tp.State(x=KINDS[kind](0), model=torch.nn.LazyLinear(2))
    tp.save_state(saved, tmp_path / "checkpoint.pt")
    loaded = tp.load_state(tp.State(x=changed(KINDS[kind](0))[0], model=torch.nn.LazyLinear(2)),
                           tmp_path / "checkpoint.pt")
    assert list(compare_snapshots(snapshot_state(saved), snapshot_state(loaded), EXACT)) == []


def test_a_mismatch_of_every_kind_renders_as_ascii() -> None:
    for kind, build in KINDS.items():
        mismatches = list(compare_snapshots(snapshot_state(tp.State(x=build(0))),
                                            snapshot_state(tp.State(x=changed(build(0))[0])), EXACT))
        assert len(mismatches) == 1, kind
        message = mismatches[0].message
        assert message.isascii() and not any(line.endswith(" ") for line in message.splitlines()), (kind, message)
        assert "not equal" in message or "do not match" in message, (kind, message)
        json.dumps([mismatches[0].expected, mismatches[0].actual], allow_nan=True)  # JSON-safe values


def test_values_without_bits_of_their_own_say_so() -> None:
    differing = list(compare_snapshots(snapshot_state(tp.State(x=torch.empty(2, device="meta"))),
                                       snapshot_state(tp.State(x=torch.empty(3, device="meta"))), EXACT))
    assert differing[0].message == ("Values are not equal!\n\nExpected '<Tensor[float32] of shape [2] on the meta "
                                    "device: no values>' but got '<Tensor[float32] of shape [3] on the meta device: "
                                    "no values>'.")
    bits = torch.tensor([1, 2, 3], dtype=torch.uint8)
    opaque = list(compare_snapshots({"x": bits.view(torch.bits8)}, {"x": (bits + 1).view(torch.bits8)}, EXACT))
    assert opaque[0].message.startswith("Tensor-likes are not equal!\n\nMismatched elements: 3 / 3 (100.0%)\n"
                                        "The first at index (0,): bits8 values are bits to torch")


# -- generated States ------------------------------------------------------------------------------------


def numbers() -> st.SearchStrategy[Any]:
    return st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True))


def leaves() -> st.SearchStrategy[Any]:
    """A leaf of the plan: a tensor kind with its seed, or a plain value."""
    return st.one_of(st.tuples(st.just("tensor"), st.tuples(st.sampled_from(sorted(KINDS)), st.integers(0, 1000))),
                     st.tuples(st.just("value"), st.one_of(numbers(), st.none(), st.text(max_size=3))))


KEYS = st.one_of(st.text(alphabet="abc_", min_size=1, max_size=3), st.integers(-3, 3),
                 st.tuples(st.integers(0, 2), st.sampled_from(["q", "k"])), st.none())
PLANS = st.recursive(
    leaves(),
    lambda children: st.one_of(
        st.tuples(st.just("dict"), st.dictionaries(KEYS, children, max_size=3)),
        st.tuples(st.just("list"), st.lists(children, max_size=3)),
        st.tuples(st.just("tuple"), st.lists(children, max_size=3)),
        st.tuples(st.just("cycle"), st.lists(children, max_size=2)),
        st.tuples(st.just("deque"), st.lists(children, max_size=3)),
        st.tuples(st.just("ordered"), st.dictionaries(KEYS, children, max_size=3)),
    ),
    max_leaves=8,
)


def changed_value(value: Any) -> Any:
    """A plain value clearly different from `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        # -value - 1: inside int64's range if it was (a list of such numbers is one tensor), outside if not, and
        # far from it under every tolerance (value ^ 1 is not: 998 and 999 are close under rtol=1e-3)
        return ~value
    if isinstance(value, float):
        return value + 1 + abs(value) if math.isfinite(value) and abs(value) < 1e300 else 0.5
    return "none" if value is None else f"{value}x"  # no number: a list of numbers is one tensor leaf


class Build:
    """A State built from a plan, with leaf number `change` (in build order) changed; records each leaf's path."""

    def __init__(self, plan: Any, change: int | None = None) -> None:
        self.change, self.count, self.paths = change, 0, []
        self.state = tp.State(entry=self.build(plan, "entry"))

    def build(self, plan: Any, path: str) -> Any:
        kind, content = plan
        if kind in ("tensor", "value"):
            value = KINDS[content[0]](content[1]) if kind == "tensor" else content
            suffix = ""
            if self.count == self.change:
                value, suffix = changed(value) if kind == "tensor" else (changed_value(value), "")
            self.count += 1
            self.paths.append(path + suffix)
            return value
        if kind in ("dict", "ordered"):
            texts = [key_text(key) for key in content]
            mapping = {key: self.build(item, f"{path}.{repr(key) if texts.count(key_text(key)) > 1 else key_text(key)}")
                       for key, item in content.items()}
            return collections.OrderedDict(mapping) if kind == "ordered" else mapping
        items = [self.build(item, f"{path}.{index}") for index, item in enumerate(content)]
        if kind == "cycle":
            items.append(items)  # the list holds itself
        if kind == "deque":
            return collections.deque(items, maxlen=len(items) + 1)
        return tuple(items) if kind == "tuple" else items


def numbers_only(plan: Any) -> bool:
    """A list or tuple of plain numbers (no cycle): a snapshot holds it as one tensor at the list's path."""
    kind, content = plan
    return (kind in ("list", "tuple", "deque") and bool(content)
            and all(k == "value" and isinstance(v, (bool, int, float)) for k, v in content)
            and all(-2**63 <= v < 2**63 for _, v in content if isinstance(v, int) and not isinstance(v, bool)))


def expected_path(plan: Any, leaf_path: str) -> str:
    """Where the change of the leaf at `leaf_path` shows: its own path, or that of its list of numbers."""
    def walk(node: Any, path: str) -> str | None:
        kind, content = node
        if kind in ("tensor", "value"):
            return None
        if numbers_only(node) and leaf_path.startswith(f"{path}."):
            return path
        children = content.items() if kind in ("dict", "ordered") else enumerate(content)
        for key, child in children:
            found = walk(child, f"{path}.{key_text(key)}")
            if found is not None:
                return found
        return None
    return walk(plan, "entry") or leaf_path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=PLANS, choice=st.integers(0, 7))
@example(plan=("cycle", [("tensor", ("empty", 0))]), choice=0)
@example(plan=("dict", {(0, "q"): ("tensor", ("nested", 1)), 1: ("value", 2**70)}), choice=0)
@example(plan=("list", [("value", 2**70), ("value", 1)]), choice=1)
@example(plan=("list", [("value", 998), ("value", 0.0)]), choice=0)
@example(plan=("deque", [("ordered", {1: ("value", 2.5)}), ("value", "a")]), choice=0)
def test_generated_states_compare_equal_differ_at_the_changed_path_and_are_restored(plan: Any, choice: int,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("wire")
    first, second = Build(plan), Build(plan)
    for paths in differing_paths(first.state, second.state, tmp_path):
        assert paths == []
    if not first.paths:
        return
    index = choice % len(first.paths)
    changed_build = Build(plan, change=index)
    where = expected_path(plan, changed_build.paths[index])
    for paths in differing_paths(first.state, changed_build.state, tmp_path):
        assert paths == [where]
    tp.save_state(first.state, tmp_path / "checkpoint.pt")  # and the reference checkpoint restores the change
    restored = tp.load_state(changed_build.state, tmp_path / "checkpoint.pt")
    assert [m.path for m in compare_snapshots(snapshot_state(first.state), snapshot_state(restored), EXACT)] == []


# -- the checks themselves -----------------------------------------------------------------------------------


def test_a_state_of_every_kind_resumes(tmp_path: pathlib.Path) -> None:
    result = tp.check_resume(KindsRecipe, steps=4, resume_at=2, timeout=60)
    assert result.outcome is tp.Outcome.PASS, result.report()


@pytest.mark.parametrize("kind", ["empty", "dtype_float8_e4m3fn", "dtype_bool", "dtype_complex64", "dtype_uint32",
                                  "dtype_bits8", "sparse_coo", "nested", "quantized", "offset_view", "digested",
                                  "expanded", "sliding_windows"])
def test_a_kind_the_checkpoint_lost_fails_at_its_path(kind: str) -> None:
    result = tp.check_resume(KindsRecipe(fault=kind), steps=4, resume_at=2, timeout=60)
    assert result.outcome is tp.Outcome.FAIL, result.report()
    suffix = changed(KINDS[kind](0))[1]
    first = result.first_violation
    assert first is not None and (first.path, first.cause) == (f"kinds.{kind}{suffix}", "not_restored"), result.report()
    assert result.report().isascii()


def test_a_state_of_every_kind_accumulates() -> None:
    result = tp.check_accumulation(KindsRecipe, microbatches=2, cycles=2)
    assert result.outcome is tp.Outcome.PASS, result.report()


def test_the_preflight_checks_read_a_state_of_every_kind() -> None:
    assert tp.check_optimizer_coverage(KindsRecipe).outcome is tp.Outcome.PASS
    assert tp.check_mixed_precision(KindsRecipe).outcome is tp.Outcome.PASS
