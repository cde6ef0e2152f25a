"""A world of torch.distributed ranks in the check's children: joining it as torchrun would, and leaving it."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import torch
import torch.distributed as dist

from trainparity._process import _session
from trainparity._process._options import Isolation
from trainparity._process._threads import threads_unavailable
from trainparity._validation import check_argument, check_type

#: what a finished run leaves behind, kept until the child's os._exit: dropping the last reference to a gloo
#: process group (held by DDP's reducer) with the GIL held can deadlock in its destructor (torch 2.13:
#: ~ProcessGroupGloo joins a worker thread that waits for the GIL)
_KEPT: list[Any] = []


@dataclasses.dataclass(frozen=True)
class World:
    """One process's place in a world: its backend, rank and size, and the file store the world meets at."""

    backend: str
    rank: int
    size: int
    #: a file in the check's scratch directory, one per world
    store: str


def validate_backend(backend: object, world_size: int) -> str:
    backend = check_type(backend, str, f"backend= must be a string such as 'gloo', 'threads' or 'nccl', got "
                         f"{type(backend).__name__}")
    check_argument(dist.is_available(),
                   "this torch build has no torch.distributed; install a build with distributed support")
    if backend == "threads":
        unavailable = threads_unavailable()
        check_argument(unavailable is None, f"backend='threads' cannot run here: {unavailable}; use backend='gloo'")
        return backend
    check_argument(dist.is_backend_available(backend),
                   f"backend={backend!r} is not available in this torch build; use backend='gloo' on CPU")
    check_argument(backend != "nccl" or torch.cuda.device_count() >= world_size, f"backend='nccl' needs one GPU per "
                   f"rank: world_size={world_size}, {torch.cuda.device_count()} visible; lower world_size or use "
                   "backend='gloo'")
    return backend


def world_isolation(explicit: object, backend: str) -> Isolation:
    """The isolation of a check that runs worlds of ranks: "process" (children of the fork server), or
    "spawn", the default for nccl, since a child forked from the fork server may be unable to initialize
    CUDA; "inprocess" cannot run several ranks."""
    own: Isolation = "spawn" if backend == "nccl" else "process"
    isolation = _session.isolation(explicit, own, runs=("spawn",) if backend == "nccl" else ("process", "spawn"))
    check_argument(isolation != "inprocess",
                   "isolation='inprocess' cannot run a world of ranks: use 'process' or 'spawn'")
    return isolation


def join(world: World) -> None:
    """Initialize the default process group, with the environment torchrun gives each process (code reads
    LOCAL_RANK to pick a device)."""
    for name, value in (("RANK", world.rank), ("LOCAL_RANK", world.rank), ("WORLD_SIZE", world.size),
                        ("LOCAL_WORLD_SIZE", world.size)):
        os.environ[name] = str(value)
    if world.backend == "nccl":
        torch.cuda.set_device(world.rank % torch.cuda.device_count())
    dist.init_process_group(world.backend, init_method=pathlib.Path(world.store).as_uri(), rank=world.rank,
                            world_size=world.size)


def leave(*kept: Any) -> None:
    """Leave the world once every rank is done, keeping `kept` alive (see `_KEPT`). Called on success only:
    after an error the process exits at once, which tells the peers just as well."""
    dist.barrier()
    _KEPT.extend((*kept, dist.group.WORLD))
    dist.destroy_process_group()
