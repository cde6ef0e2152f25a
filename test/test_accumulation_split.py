"""tp.split_batch: dim 0 of every tensor, through tuples, lists, dicts and dataclasses."""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import types
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import trainparity as tp

pytestmark = [pytest.mark.numeric, pytest.mark.torch_internals]


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    lengths: torch.Tensor
    name: str = "train"


class Pair(NamedTuple):
    inputs: torch.Tensor
    targets: torch.Tensor


def test_nested_containers_keep_their_types() -> None:
    batch = {
        "pair": Pair(torch.arange(8), torch.arange(8) * 10),
        "items": [torch.zeros(8, 3), Batch(torch.ones(8, 2), torch.arange(8))],
        "temperature": torch.tensor(0.5),
        "label": "window",
        "nothing": None,
    }
    parts = tp.split_batch(batch, 4)
    assert len(parts) == 4
    for index, part in enumerate(parts):
        assert isinstance(part["pair"], Pair)
        assert part["pair"].inputs.tolist() == [2 * index, 2 * index + 1]
        assert part["pair"].targets.tolist() == [20 * index, 20 * index + 10]
        assert part["items"][0].shape == (2, 3)
        assert isinstance(part["items"][1], Batch) and part["items"][1].lengths.tolist() == [2 * index, 2 * index + 1]
        assert part["items"][1].name == "train"
        assert part["temperature"] is batch["temperature"]  # batch-level values are shared
        assert (part["label"], part["nothing"]) == ("window", None)


def test_declared_sizes_and_numpy_arrays() -> None:
    x = torch.arange(8)
    parts = tp.split_batch((x, np.arange(8.0)), (3, 3, 2))
    assert [p[0].tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [p[1].tolist() for p in parts] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0]]
    assert parts[0][0].data_ptr() == x.data_ptr()  # views, as torch.split gives


def test_dict_subclasses_are_kept() -> None:
    batch = collections.OrderedDict(b=torch.ones(4), a=torch.zeros(4))
    parts = tp.split_batch(batch, 2)
    assert all(type(p) is collections.OrderedDict and list(p) == ["b", "a"] for p in parts)
    counts = collections.defaultdict(list, {"x": torch.arange(4)})
    assert tp.split_batch(counts, 2)[1]["missing"] == []


class Encoding(collections.UserDict):  # type: ignore[type-arg]
    """A mapping that is no dict, with attribute access and an extra attribute, as transformers' BatchEncoding."""

    def __init__(self, data: dict[str, Any], n_sequences: int) -> None:
        super().__init__(data)
        self.n_sequences = n_sequences

    def __getattr__(self, name: str) -> Any:
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


class Bag(collections.abc.MutableMapping):  # type: ignore[type-arg]
    """A mapping of its own making, its items in an attribute that a shallow copy shares."""

    def __init__(self, **items: Any) -> None:
        self.items_ = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self.items_[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.items_[key] = value

    def __delitem__(self, key: str) -> None:
        del self.items_[key]

    def __iter__(self) -> Any:
        return iter(self.items_)

    def __len__(self) -> int:
        return len(self.items_)


def test_user_dicts_and_mapping_proxies_are_cut_and_kept() -> None:
    batch = Encoding({"input_ids": torch.arange(8).reshape(4, 2), "mask": torch.ones(4, 2)}, 1)
    parts = tp.split_batch(batch, 2)
    assert all(type(part) is Encoding and part.n_sequences == 1 for part in parts)
    assert [part.input_ids.tolist() for part in parts] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert list(batch) == ["input_ids", "mask"] and batch["input_ids"].shape == (4, 2)  # the batch is untouched
    proxies = tp.split_batch(types.MappingProxyType({"x": torch.arange(4)}), 2)
    assert [type(part) for part in proxies] == [types.MappingProxyType] * 2
    assert [part["x"].tolist() for part in proxies] == [[0, 1], [2, 3]]


def test_other_mappings_are_batch_level_values_left_as_they_are() -> None:
    bag = Bag(x=torch.arange(4))
    parts = tp.split_batch({"ids": torch.arange(4), "bag": bag}, 2)
    assert all(part["bag"] is bag for part in parts) and list(bag) == ["x"]


class EncodedBatches(tp.Recipe):
    """Token batches as a tokenizer's mapping (`Encoding`), read by key and by attribute."""

    def __init__(self, accumulation_steps: int = 1) -> None:
        self.accumulation_steps, self.calls = accumulation_steps, 0

    def setup(self) -> tp.State:
        model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Flatten(), torch.nn.Linear(12, 1))
        return tp.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    def batches(self, state: tp.State) -> Any:
        generator = torch.Generator().manual_seed(0)
        while True:
            yield Encoding({"input_ids": torch.randint(0, 16, (8, 3), generator=generator),
                            "labels": torch.randn(8, 1, generator=generator)}, 1)

    def step(self, state: tp.State, batch: Encoding) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(state.model(batch["input_ids"]), batch.labels) / self.accumulation_steps
        loss.backward()
        self.calls += 1
        if self.calls % self.accumulation_steps == 0:
            state.optimizer.step()
            state.optimizer.zero_grad()
        return loss.detach()


def test_accumulation_passes_a_loop_over_a_tokenizers_mapping() -> None:
    result = tp.check_accumulation(EncodedBatches, microbatches=2)
    assert result.passed, result.report()


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_nested_tensors_are_cut_by_their_components(layout: torch.layout) -> None:
    lengths = [2, 3, 1, 2]
    batch = {"tokens": torch.nested.nested_tensor([torch.arange(n) for n in lengths], layout=layout),
             "y": torch.arange(4)}
    parts = tp.split_batch(batch, (3, 1))
    assert [[c.tolist() for c in part["tokens"].unbind()] for part in parts] == [[[0, 1], [0, 1, 2], [0]], [[0, 1]]]
    assert all(part["tokens"].layout == layout for part in parts)


def test_sparse_coo_tensors_are_cut_by_their_rows() -> None:
    dense = torch.arange(12.0).reshape(4, 3) * torch.tensor([1.0, 0.0, 1.0])
    parts = tp.split_batch((dense.to_sparse(), torch.arange(4)), (1, 3))
    assert [part[0].layout for part in parts] == [torch.sparse_coo] * 2
    assert torch.equal(torch.cat([part[0].to_dense() for part in parts]), dense)


def test_short_lists_are_batch_level_values() -> None:
    parts = tp.split_batch({"x": torch.arange(6), "betas": [0.9, 0.999]}, 3)
    assert all(p["betas"] == [0.9, 0.999] for p in parts)


@pytest.mark.parametrize(("batch", "microbatches", "message"), [
    (torch.arange(10), 4, "a batch of 10 samples does not split into 4 equal micro-batches; declare the sizes, "
                          "e.g. microbatches=(3, 3, 2, 2)"),
    (torch.arange(3), 4, "a batch of 3 samples cannot be cut into 4 micro-batches"),
    (torch.arange(8), (4, 5), "microbatches=(4, 5) adds up to 9 samples but the batch has 8"),
    ({"x": torch.zeros(8, 2), "y": torch.zeros(6)}, 2, "batch['x'] has 8 rows along dim 0 but batch['y'] has 6"),
    ({"text": "hello", "scale": torch.tensor(2.0)}, 2, "holds no tensor or array with a batch dimension"),
    ((torch.zeros(4), ["a", "b", "c", "d"]), 2, "batch[1] is a list of 4 plain values, as many as the batch has"),
    ({"x": torch.eye(4).to_sparse_csr()}, 2, "batch['x'] is a torch.sparse_csr tensor, which torch cannot cut along "
                                            "dim 0; pass split="),
    (torch.arange(8), 1, "microbatches= must be at least 2"),
    (torch.arange(8), (8,), "at least 2 micro-batch sizes"),
    (torch.arange(8), (0, 8), "micro-batch sizes must be ints >= 1"),
])
def test_errors_name_the_fix(batch: Any, microbatches: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        tp.split_batch(batch, microbatches)
    assert message in str(raised.value)


def test_microbatches_must_be_an_int_or_sizes() -> None:
    for bad in (2.0, "2", True):
        with pytest.raises(TypeError):
            tp.split_batch(torch.arange(4), bad)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=2, max_size=6), width=st.integers(0, 3))
@example(sizes=[1, 1], width=0)
def test_parts_concatenate_back_to_the_batch(sizes: list[int], width: int) -> None:
    total = sum(sizes)
    batch = {"x": torch.randn(total, width), "ids": torch.arange(total), "pair": (torch.arange(total), 7)}
    parts = tp.split_batch(batch, sizes)
    assert [len(p["ids"]) for p in parts] == sizes
    assert torch.equal(torch.cat([p["x"] for p in parts]), batch["x"])
    assert torch.equal(torch.cat([p["pair"][0] for p in parts]), batch["ids"])
    assert all(p["pair"][1] == 7 for p in parts)
