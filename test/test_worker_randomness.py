"""`tp.check_worker_randomness`: each form of workers (or epochs) sharing randomness FAILs naming its stream, its
fixed twin PASSes, bad input is refused, errors are ERROR results, and no worker is left running."""

from __future__ import annotations

import json
import multiprocessing
import random
from typing import Any

import numpy as np
import pytest
import torch
import worker_datasets as datasets
from torch.utils.data import DataLoader, default_collate
from worker_datasets import augment

import trainparity as tp
from trainparity._process import _session
from trainparity._state._rng import global_states, stream_digest, stream_kind
from trainparity._workers._streams import reachable_streams, snapshot

pytestmark = [pytest.mark.exact, pytest.mark.torch_internals]


def first(result: tp.Result) -> tuple[str, str, int | None, int | None]:
    violation = result.first_violation
    assert violation is not None, result.report()
    return violation.path, violation.kind, violation.epoch, violation.worker


def assert_no_workers_left() -> None:
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("make", [
    lambda: augment.loader(), lambda: augment.stream_loader(), lambda: augment.loader(num_workers=0),
    lambda: datasets.numbers(kind="python"),
])
def test_the_clean_pipelines_pass(make: Any) -> None:
    result = tp.check_worker_randomness(make())
    assert isinstance(result, tp.WorkerRandomnessResult) and result.passed, result.report()
    assert_no_workers_left()


@pytest.mark.parametrize(("fault", "expected"), [
    ("generator_built_in_init", ("dataset.augment.shift.rng", "worker_rng_shared", 0, 1)),
    ("torch_generator_not_reseeded", ("dataset.augment.noise.generator", "worker_rng_shared", 0, 1)),
    ("numpy_seeded_in_worker_init", ("rng.numpy", "worker_rng_shared", 0, 1)),
    ("python_seeded_in_worker_init", ("rng.python", "worker_rng_shared", 0, 1)),
    ("persistent_epoch_seed", ("dataset.rng", "epoch_rng_repeated", 1, 0)),
])
def test_each_fault_fails_naming_its_stream(fault: str, expected: tuple[str, str, int, int]) -> None:
    assert fault in augment.FAULTS
    result = tp.check_worker_randomness(datasets.augmented(fault))
    assert result.outcome is tp.Outcome.FAIL
    assert first(result) == expected
    # the kind is the diagnosis, as in every preflight check (validate.py reads it as the cause)
    assert result.first_violation is not None and result.first_violation.cause == expected[1]
    assert_no_workers_left()


def test_a_generator_set_epoch_builds_in_this_process_is_said_to_be_copied() -> None:
    # The check reads this process's streams after set_epoch, as the workers are about to copy them.
    result = tp.check_worker_randomness(DataLoader(datasets.EpochGenerator(), batch_size=4, num_workers=2), epochs=1)
    first = result.first_violation
    assert first is not None and (first.path, first.kind) == ("dataset.rng", "worker_rng_shared"), result.report()
    assert "It is copied into every worker as it is in this process" in first.message, first.message
    assert_no_workers_left()


def test_messages_say_why_and_how_to_fix() -> None:
    copied = tp.check_worker_randomness(datasets.augmented("generator_built_in_init"), epochs=1).violations[0]
    assert "It is copied into every worker as it is in this process (built once, e.g. in __init__)." in copied.message
    assert ("info.dataset.augment.shift.rng = np.random.default_rng(torch.initial_seed())" in copied.message)
    reseeded = tp.check_worker_randomness(datasets.augmented("numpy_seeded_in_worker_init"), epochs=1).violations[0]
    assert "The worker_init_fn seeds it to the same state in every worker" in reseeded.message
    assert "np.random.seed(torch.initial_seed() % 2**32)" in reseeded.message
    torch_global = tp.check_worker_randomness(DataLoader(datasets.Numbers(kind="none"), batch_size=4, num_workers=2,
                                                         worker_init_fn=datasets.torch_seeded_in_init,
                                                         collate_fn=RandomNoise()), epochs=1)
    assert first(torch_global) == ("rng.torch", "worker_rng_shared", 0, 1)
    assert "do not reseed it with a constant" in torch_global.violations[0].message


class SeededOnFirstUse(datasets.Numbers):
    """Builds its generator, from a constant, at its first fetch in each worker."""

    def __getitem__(self, index: int) -> float:
        if "lazy" not in vars(self):
            self.lazy = np.random.default_rng(0)
        return index + float(self.lazy.random())


def test_a_generator_seeded_alike_in_each_worker_is_not_said_to_be_copied() -> None:
    result = tp.check_worker_randomness(DataLoader(SeededOnFirstUse(), batch_size=4, num_workers=2), epochs=1)
    assert first(result) == ("dataset.lazy", "worker_rng_shared", 0, 1)
    assert "Every worker seeds it alike (with a constant" in result.violations[0].message


class RandomNoise:
    """A collate function that adds noise from torch's global generator (randomness in the collate function)."""

    def __call__(self, samples: list[float]) -> torch.Tensor:
        return torch.tensor(samples) + torch.rand(len(samples))


def test_a_shared_generator_repeats_in_every_epoch_of_fresh_workers() -> None:
    result = tp.check_worker_randomness(datasets.augmented("generator_built_in_init"), epochs=3)
    repeated = [(v.path, v.epoch) for v in result.violations if v.kind == "epoch_rng_repeated"]
    assert repeated == [("dataset.augment.shift.rng", 1), ("dataset.augment.noise.generator", 1),
                        ("dataset.augment.shift.rng", 2), ("dataset.augment.noise.generator", 2)]


def test_persistent_workers_that_carry_a_stream_on_are_no_repeat() -> None:
    loader = DataLoader(datasets.Numbers(), batch_size=4, num_workers=2, persistent_workers=True,
                        worker_init_fn=ReseedPerWorker())
    result = tp.check_worker_randomness(loader, epochs=3)
    assert result.passed, result.report()
    assert loader._iterator is None  # the check shut down the persistent workers it started
    assert_no_workers_left()


class ReseedPerWorker:
    def __call__(self, worker_id: int) -> None:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        info.dataset.rng = np.random.default_rng(torch.initial_seed())  # type: ignore[attr-defined]


def test_streams_never_consumed_are_not_judged() -> None:
    result = tp.check_worker_randomness(datasets.numbers(kind="unused"))
    assert result.passed
    assert result.notes[1:] == ["No random stream was consumed while fetching: nothing random to share.",
                                "Not consumed, so not judged: rng.torch, rng.numpy, rng.python, dataset.rng."]


def test_nothing_to_compare_abstains() -> None:
    result = tp.check_worker_randomness(datasets.numbers(), epochs=1, batches=1)
    assert result.outcome is tp.Outcome.ABSTAIN and "nothing to compare" in (result.reason or "")


def test_an_empty_dataset_fetched_by_no_worker_is_said_so() -> None:
    result = tp.check_worker_randomness(DataLoader(datasets.Numbers(size=0), batch_size=4, num_workers=2))
    assert result.outcome is tp.Outcome.ABSTAIN, result.report()
    assert result.reason == ("the loader gave no batch in any epoch (an empty dataset, or a sampler of nothing): "
                             "nothing was observed")
    assert result.notes[0] == ("Observed 2 epochs with no batch fetched by any worker; batches: 0 in epoch 0, "
                               "0 in epoch 1.")


def test_num_workers_0_is_a_note_and_epochs_are_still_compared() -> None:
    clean = tp.check_worker_randomness(augment.loader(num_workers=0))
    assert clean.passed and any(note.startswith("num_workers=0:") for note in clean.notes)
    reset = tp.check_worker_randomness(DataLoader(ResetsEveryEpoch(), batch_size=4))
    assert first(reset) == ("dataset.rng", "epoch_rng_repeated", 1, None)


class ResetsEveryEpoch(datasets.Numbers):
    """Reseeds its generator with a constant whenever an epoch starts (set_epoch)."""

    def set_epoch(self, epoch: int) -> None:
        self.rng = np.random.default_rng(0)


def test_batches_limits_each_epoch_and_the_loader_is_given_back_as_it_was() -> None:
    loader = augment.loader()
    init, collate = loader.worker_init_fn, loader.collate_fn
    result = tp.check_worker_randomness(loader, batches=3)
    assert result.passed and result.config["batches"] == 3
    assert "batches: 3 in epoch 0, 3 in epoch 1." in result.notes[0]
    assert (loader.worker_init_fn, loader.collate_fn) == (init, collate)
    assert_no_workers_left()
    index, images, labels = next(iter(loader))
    assert images.shape == (augment.BATCH, 1, augment.SIZE, augment.SIZE)


def test_a_stateful_dataloader_is_checked_like_a_dataloader() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")  # the test-only torchdata extra
    loader = stateful.StatefulDataLoader(datasets.Numbers(), batch_size=4, num_workers=2, persistent_workers=True)
    result = tp.check_worker_randomness(loader, epochs=2)
    assert first(result) == ("dataset.rng", "worker_rng_shared", 0, 1)
    assert_no_workers_left()


def test_spawned_workers_are_recorded_alike() -> None:
    loader = DataLoader(datasets.Numbers(), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    result = tp.check_worker_randomness(loader, epochs=1)
    assert first(result) == ("dataset.rng", "worker_rng_shared", 0, 1)
    assert_no_workers_left()


def test_a_fetch_that_raises_is_an_error_with_its_traceback_and_no_workers_left() -> None:
    result = tp.check_worker_randomness(datasets.numbers(broken_at=9))
    assert result.outcome is tp.Outcome.ERROR and result.error is not None
    assert result.error.kind == "raised" and result.error.exc_type == "ValueError"
    assert result.error.phase == "epoch 0, batch 2"
    assert "sample 9 is corrupt" in result.error.message and "in __getitem__" in result.error.message
    assert isinstance(result.exception, ValueError)
    assert_no_workers_left()
    with pytest.raises(ValueError, match="sample 9 is corrupt"):
        tp.assert_worker_randomness(datasets.numbers(broken_at=9))
    assert_no_workers_left()


def test_a_worker_init_fn_that_raises_is_an_error() -> None:
    loader = DataLoader(datasets.Numbers(), batch_size=4, num_workers=2, worker_init_fn=datasets.RaisingInit())
    result = tp.check_worker_randomness(loader)
    assert result.outcome is tp.Outcome.ERROR and result.error is not None and result.error.exc_type == "OSError"
    assert "cannot open its shard" in result.error.message
    assert_no_workers_left()


@pytest.mark.parametrize(("loader", "kwargs", "error", "message"), [
    (3, {}, TypeError, "loader= must be a torch.utils.data.DataLoader, got int, which is not iterable"),
    ([1, 2], {}, TypeError, r"loader= must be a torch.utils.data.DataLoader \(or a subclass"),
    (None, {"epochs": 0}, ValueError, r"epochs= must be an int >= 1"),
    (None, {"epochs": True}, ValueError, r"epochs= must be an int >= 1"),
    (None, {"batches": 0}, ValueError, r"batches= must be None \(whole epochs\) or an int >= 1"),
    (None, {"timeout": 0}, ValueError, "timeout= must be a positive number"),
])
def test_misuse_raises_naming_the_fix(loader: Any, kwargs: dict[str, Any], error: type[Exception],
                                      message: str) -> None:
    with pytest.raises(error, match=message):
        tp.check_worker_randomness(datasets.numbers() if loader is None else loader, **kwargs)


def test_a_loader_with_running_persistent_workers_is_refused() -> None:
    loader = DataLoader(datasets.Numbers(), batch_size=4, num_workers=2, persistent_workers=True)
    next(iter(loader))
    try:
        with pytest.raises(ValueError, match="already has persistent workers running"):
            tp.check_worker_randomness(loader)
    finally:
        loader._iterator._shutdown_workers()  # type: ignore[union-attr]


def test_streams_reachable_from_the_dataset_and_their_digests() -> None:
    class Transform:
        def __init__(self) -> None:
            self.generators = {"noise": torch.Generator().manual_seed(1)}
            self.chain = [random.Random(2), np.random.RandomState(3)]

    class Data(torch.utils.data.Dataset[int]):
        def __init__(self) -> None:
            self.transform = Transform()
            self.model = torch.nn.Sequential(torch.nn.Linear(1, 1))
            self.model.rng = np.random.default_rng(4)
            self.again = self.transform.chain[0]  # the same stream by two paths: its shortest one

    found = [(path, kind) for path, kind, _ in reachable_streams(Data(), "dataset", set())]
    assert found == [("dataset.again", "random.Random"), ("dataset.model.rng", "numpy.random.Generator"),
                     ("dataset.transform.generators.noise", "torch.Generator"),
                     ("dataset.transform.chain.1", "numpy.random.RandomState")]
    generator = np.random.default_rng(0)
    before = stream_digest("numpy.random.Generator", generator)
    assert stream_digest("numpy.random.Generator", np.random.default_rng(0)) == before
    generator.random()
    assert stream_digest("numpy.random.Generator", generator) != before
    assert stream_kind(random.SystemRandom()) is None
    states = global_states()
    np.random.random()
    changed = global_states()
    assert [path for path in states if states[path] != changed[path]] == ["rng.numpy"]
    assert list(snapshot([("dataset", Data())], globals_too=False)[1].values()).count("random.Random") == 1


def test_the_session_hears_it_and_json_is_deterministic() -> None:
    heard: list[tp.Result] = []
    _session.add_listener(heard.append)
    try:
        result = tp.check_worker_randomness(datasets.augmented("python_seeded_in_worker_init"), epochs=1)
    finally:
        _session.remove_listener(heard.append)
    assert [r.check for r in heard] == ["worker_randomness"]
    document = json.loads(result.to_json())
    assert document["check"] == "worker_randomness" and document["counts"] == {"worker_rng_shared": 1}
    assert document["first_violation"]["path"] == "rng.python" and document["first_violation"]["worker"] == 1
    assert result.to_json() == tp.check_worker_randomness(datasets.augmented("python_seeded_in_worker_init"),
                                                          epochs=1).to_json()


def test_assertions_and_the_mixin() -> None:
    assert tp.assert_worker_randomness(augment.loader(), epochs=1).passed
    with pytest.raises(AssertionError, match=r"^trainparity worker_randomness check: FAIL at rng.numpy "
                                             r"\(worker_rng_shared, epoch 0\)"):
        tp.assert_worker_randomness(datasets.augmented("numpy_seeded_in_worker_init"), epochs=1)

    class Case(tp.TestCase):
        def runTest(self) -> None:
            self.assertWorkerRandomness(augment.stream_loader())
            with self.assertRaises(self.failureException):
                self.assertWorkerRandomness(datasets.augmented("persistent_epoch_seed"))
            with self.assertRaises(__import__("unittest").SkipTest):
                self.assertWorkerRandomness(datasets.numbers(), epochs=1, batches=1, abstain="skip")

    outcome = Case().run()
    assert outcome is not None and outcome.wasSuccessful(), outcome.failures + outcome.errors
    assert_no_workers_left()


def test_batches_without_automatic_batching_are_recorded() -> None:
    loader = DataLoader(datasets.Numbers(size=8), batch_size=None, num_workers=2)
    result = tp.check_worker_randomness(loader, epochs=1)
    assert first(result) == ("dataset.rng", "worker_rng_shared", 0, 1)
    assert "batches: 8 in epoch 0." in result.notes[0]


def test_a_user_collate_object_is_searched_for_streams() -> None:
    class Mixup:
        def __init__(self) -> None:
            self.rng = np.random.default_rng(0)

        def __call__(self, samples: list[float]) -> torch.Tensor:
            return default_collate(samples) * float(self.rng.random())

    loader = DataLoader(datasets.Numbers(kind="none"), batch_size=4, num_workers=2, collate_fn=Mixup())
    assert first(tp.check_worker_randomness(loader, epochs=1)) == ("collate_fn.rng", "worker_rng_shared", 0, 1)


class Collator:
    """A collate function that is a method of an object holding its generator (`collate_fn=collator.collate`)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def collate(self, samples: list[float]) -> torch.Tensor:
        return default_collate(samples) * float(self.rng.random())


class NumbersWithCollate(datasets.Numbers, Collator):
    """A dataset whose own method is the collate function: its streams are the dataset's, found once."""

    def __init__(self) -> None:
        datasets.Numbers.__init__(self, kind="none")
        Collator.__init__(self)


class NumbersWithTransform(datasets.Numbers):
    """A dataset whose transform's method is the collate function (`collate_fn=dataset.transform.collate`)."""

    def __init__(self) -> None:
        super().__init__(kind="none")
        self.transform = Collator()


class DataModule:
    """Holds the dataset, and collates with its transform (a LightningDataModule's shape)."""

    def __init__(self) -> None:
        self.data = NumbersWithTransform()

    def collate(self, samples: list[float]) -> torch.Tensor:
        return self.data.transform.collate(samples)


def test_a_stream_both_the_dataset_and_the_collate_method_reach_is_named_once() -> None:
    data = NumbersWithTransform()
    module = DataModule()
    for loader in (DataLoader(data, batch_size=4, num_workers=2, collate_fn=data.transform.collate),
                   DataLoader(module.data, batch_size=4, num_workers=2, collate_fn=module.collate)):
        result = tp.check_worker_randomness(loader, epochs=1)
        assert {violation.path for violation in result.violations} == {"dataset.transform.rng"}, result.report()


def test_the_object_of_a_collate_method_is_searched_for_streams() -> None:
    loader = DataLoader(datasets.Numbers(kind="none"), batch_size=4, num_workers=2, collate_fn=Collator().collate)
    assert first(tp.check_worker_randomness(loader, epochs=1)) == ("collate_fn.__self__.rng", "worker_rng_shared",
                                                                    0, 1)
    data = NumbersWithCollate()
    result = tp.check_worker_randomness(DataLoader(data, batch_size=4, num_workers=2, collate_fn=data.collate),
                                        epochs=1)
    assert first(result) == ("dataset.rng", "worker_rng_shared", 0, 1)
    assert {violation.path for violation in result.violations} == {"dataset.rng"}


@pytest.mark.parametrize(("argv", "status", "headline"), [
    (["worker-randomness", "worker_datasets:augmented"], 0, "trainparity worker_randomness check: PASS"),
    (["worker-randomness", "worker_datasets:augmented(fault='persistent_epoch_seed')", "--epochs", "3"], 1,
     "trainparity worker_randomness check: FAIL at dataset.rng (epoch_rng_repeated, epoch 1)"),
    (["worker-randomness", "worker_datasets:numbers(broken_at=2)", "--batches", "2"], 3,
     "trainparity worker_randomness check: ERROR"),
    (["worker-randomness", "worker_datasets:raises_building"], 3, "trainparity worker_randomness check: ERROR"),
])
def test_command_line(argv: list[str], status: int, headline: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(argv) == status
    assert capsys.readouterr().out.startswith(headline + "\n")
    assert_no_workers_left()


@pytest.mark.parametrize(("argv", "message"), [
    (["worker-randomness", "worker_datasets:not_a_loader"], "loader= must be a torch.utils.data.DataLoader"),
    (["worker-randomness", "worker_datasets:numbers", "--epochs", "0"], "epochs= must be an int >= 1"),
    (["worker-randomness", "worker_datasets:no_such_factory"], "has no attribute 'no_such_factory'"),
])
def test_command_line_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainparity._cli import main

    assert main(argv) == 4
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
