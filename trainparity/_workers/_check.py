"""`check_worker_randomness`: iterate the user's DataLoader for a few epochs and judge the random streams that its
workers consume while they fetch.

The check puts its recording `worker_init_fn` and `collate_fn` (`_record.py`) on the loader, around the user's
own, and iterates `epochs` epochs (or `batches` batches of each) in this process the way `check_coverage` reads
its iterables (`_batches/_reading.py`): an exception of the user's pipeline is an ERROR result with its
traceback, and past `timeout` the reading is interrupted and the workers are killed. Whatever happens, the
loader gets its own functions back and every worker the check started is shut down, persistent ones included.
The records are judged by `_judge.py`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable
from typing import Any

from torch.utils.data import DataLoader

from trainparity._batches._reading import ReadingTimedOut, UserCodeFailed, release_iterator, start_iterator
from trainparity._process import _session
from trainparity._process._alarm import DeadlinePassed, interrupted_at
from trainparity._process._options import Deadline
from trainparity._recipe._recipe import set_loader_epoch
from trainparity._results._result import WorkerRandomnessResult
from trainparity._results._violation import JsonValue
from trainparity._validation import InvalidArgument, check_argument, check_int, check_optional_int
from trainparity._workers._judge import Epoch, judge_workers
from trainparity._workers._record import Fetch, Fetched, RecordingCollate, RecordingInit, begin, end, roots
from trainparity._workers._streams import snapshot


def _validate(loader: object, epochs: object, batches: object) -> DataLoader[Any]:
    if not isinstance(loader, DataLoader):
        what = type(loader).__name__
        if isinstance(loader, (str, bytes)) or not isinstance(loader, Iterable):
            raise InvalidArgument(f"loader= must be a torch.utils.data.DataLoader, got {what}, which is not iterable")
        raise InvalidArgument(f"loader= must be a torch.utils.data.DataLoader (or a subclass, such as torchdata's "
                              f"StatefulDataLoader), got {what}: the check records inside the loader's workers "
                              "through its worker_init_fn and collate_fn")
    check_int("epochs", epochs, 1, "epochs of the loader iterated")
    check_optional_int("batches", batches, 1, "whole epochs")
    check_argument(not loader.persistent_workers or getattr(loader, "_iterator", None) is None, "loader= already has "
                   "persistent workers running (it was iterated before): the check must start the workers itself to "
                   "record inside them; pass a loader that has not been iterated (a new one from the function that "
                   "builds it)")
    return loader


def _read_epoch(loader: DataLoader[Any], number: int, batches: int | None, token: str, user_collate: Any) -> Epoch:
    """One epoch's records; the user's errors become `UserCodeFailed`, a timeout `ReadingTimedOut`."""
    phase = f"epoch {number}"
    fetches: list[Fetch] = []
    iterator: Any = None
    finished = late = False
    try:
        try:
            set_loader_epoch(loader, number)  # as a training loop does before each epoch
        except Exception as error:  # noqa: BLE001 - the user's set_epoch failed: an ERROR result
            raise UserCodeFailed(error, phase, None) from error
        # After set_epoch, which may build the epoch's generators here, to be copied into the workers.
        main = snapshot(roots(loader.dataset, user_collate), globals_too=False)[0]
        if loader.num_workers == 0:
            begin(token, loader.dataset, user_collate)
        try:
            iterator = start_iterator(loader)
        except Exception as error:  # noqa: BLE001 - the user's sampler or worker start failed: an ERROR result
            raise UserCodeFailed(error, phase, None) from error
        while batches is None or len(fetches) < batches:
            try:
                item = next(iterator)
            except StopIteration:
                finished = True
                break
            except Exception as error:  # noqa: BLE001 - the user's dataset, transform or collate raised: ERROR
                raise UserCodeFailed(error, f"{phase}, batch {len(fetches)}", None) from error
            if not isinstance(item, Fetched):
                raise TypeError(f"check_worker_randomness: batch {len(fetches)} of {phase} did not come from the "
                                f"loader's collate_fn ({type(loader).__name__} bypasses it?): nothing was recorded")
            fetches.append(item.record)
    except DeadlinePassed as interruption:
        late = True
        raise ReadingTimedOut(interruption, f"{phase}, batch {len(fetches)}", None) from None
    finally:
        release_iterator(iterator, loader, finished, late)
        del iterator
    return Epoch(fetches, main)


@_session.recorded
def check_worker_randomness(
    loader: DataLoader[Any],
    *,
    epochs: int = 2,
    batches: int | None = None,
    timeout: float | None = None,
) -> WorkerRandomnessResult:
    """Check that the loader's workers do not share random streams, and that epochs do not repeat them.

    Iterates `loader` (its workers, `persistent_workers`, `worker_init_fn` and sampler as given) for `epochs`
    epochs, or `batches` batches of each, calling `set_epoch(epoch)` before each on its sampler and its dataset
    where they define it, as a training loop does, and records in each worker, before and after every batch, the
    state of torch's, numpy's and Python's global generators and of every `np.random.Generator`, `RandomState`,
    `torch.Generator` and `random.Random` reachable from the dataset's attributes. A stream consumed from the same
    state by two workers of an epoch is `worker_rng_shared`; one whose states repeat an earlier epoch's,
    `epoch_rng_repeated`. Streams never consumed are not judged. `timeout` bounds the whole check (None: no
    limit); the reading is interrupted past it and the workers killed. Never raises for a FAIL; misuse raises
    TypeError/ValueError.
    """
    deadline = None if timeout is None else Deadline.after(timeout)
    checked = _validate(loader, epochs, batches)
    workers = checked.num_workers
    persistent = bool(checked.persistent_workers) and workers > 0
    config: dict[str, JsonValue] = {"dataset": type(checked.dataset).__name__, "epochs": epochs,
                                    "num_workers": workers, "persistent_workers": persistent}
    if batches is not None:
        config["batches"] = batches
    token = uuid.uuid4().hex
    user_init, user_collate = checked.worker_init_fn, checked.collate_fn
    checked.worker_init_fn = RecordingInit(token, user_init, user_collate)
    checked.collate_fn = RecordingCollate(token, user_collate)
    observed: list[Epoch] = []
    try:
        with contextlib.nullcontext() if deadline is None else interrupted_at(deadline):
            for number in range(epochs):
                observed.append(_read_epoch(checked, number, batches, token, user_collate))
    except UserCodeFailed as failure:
        return failure.result(config, WorkerRandomnessResult)
    except ReadingTimedOut as late:
        assert deadline is not None
        return late.result(config, deadline, WorkerRandomnessResult)
    finally:
        checked.worker_init_fn, checked.collate_fn = user_init, user_collate
        running = getattr(checked, "_iterator", None)  # the persistent workers the check started
        if running is not None:
            with contextlib.suppress(Exception):  # the result being returned matters more than an error in cleanup
                running._shutdown_workers()
            checked._iterator = None
        end(token)
    return judge_workers(observed, config, persistent)
