"""Who is reading: rank and world size, worker and number of workers, seed and epoch.

The rank is read when a dataset is built (in the training process, after ``init_process_group``);
the worker is read inside ``__iter__``/``__getitem__``, where ``get_worker_info()`` knows it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fastdata.core.errors import ConfigError


@dataclass(frozen=True)
class World:
    """Where one reader sits among all readers of a job.

    Attributes:
        rank (int): this process's rank among ``world_size`` training processes. Defaults to 0.
        world_size (int): number of training processes. Defaults to 1.
        worker (int): this DataLoader worker's id, 0 in the main process. Defaults to 0.
        num_workers (int): DataLoader workers per rank; 1 when reading in the main process.
        seed (int): the job's seed. Defaults to 0.
        epoch (int): the current epoch. Defaults to 0.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    seed: int = 0
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank={self.rank} must lie in [0, world_size={self.world_size})")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ConfigError(f"worker={self.worker} must lie in [0, num_workers={self.num_workers})")

    @property
    def total_workers(self) -> int:
        """Readers in the whole job: ``world_size * num_workers``."""
        return self.world_size * self.num_workers

    @property
    def global_worker(self) -> int:
        """This reader's position among all readers of the job."""
        return self.rank * self.num_workers + self.worker

    @classmethod
    def detect(cls, seed: int = 0, epoch: int = 0) -> World:
        """The world of the calling process: rank, world size, worker and number of workers.

        Rank and world size come from ``torch.distributed`` when it is initialised, else from the
        ``RANK``/``WORLD_SIZE`` environment variables that ``torchrun`` sets, else 0 and 1.
        """
        rank, world_size = current_rank()
        worker, num_workers = current_worker()
        return cls(rank, world_size, worker, num_workers, seed, epoch)


def current_rank() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` if initialised, else the environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        rank = int(os.environ.get("RANK", "0"))
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as e:
        raise ConfigError(f"RANK/WORLD_SIZE must be integers: {e}") from None
    return rank, world_size


_thread = threading.local()  # the worker a loader thread stands for (see acting_as_worker)


@contextmanager
def acting_as_worker(worker: int, num_workers: int, token: int = 0) -> Iterator[None]:
    """Make :func:`current_worker` report ``(worker, num_workers)`` in the calling thread while inside.

    A loader thread (``fd.Loader(workers="threads")``) reads the plan of one DataLoader worker: every
    fastdata part that asks which worker it is (sharding, counters, read-ahead strides) asks here, so a
    thread stands for worker ``worker`` exactly as a worker process would. Other threads are unaffected.

    Args:
        worker, num_workers (int): the worker the thread stands for.
        token (int): the same in every thread of one set of loader threads, different from the next set's
            (as a DataLoader iterator's ``base_seed`` is for its workers): tells passes apart
            (:func:`fastdata.core.epoch._seeding.pass_token`). Defaults to 0.
    """
    World(worker=worker, num_workers=num_workers)  # checks the pair
    before = getattr(_thread, "worker", None), getattr(_thread, "token", 0)
    _thread.worker, _thread.token = (worker, num_workers), token
    try:
        yield
    finally:
        _thread.worker, _thread.token = before


def acting_token() -> int:
    """The ``token`` of the loader threads the calling thread belongs to (0 outside them)."""
    return int(getattr(_thread, "token", 0))


def acting_worker() -> tuple[int, int] | None:
    """``(worker, num_workers)`` the calling loader thread stands for, or None outside one."""
    return getattr(_thread, "worker", None)


def worker_process() -> tuple[int, int]:
    """``(worker_id, num_workers)`` of this DataLoader worker process, ``(0, 1)`` in the main process,
    whichever loader thread asks: for what a process holds once for all its threads (a thread pool)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


def current_worker() -> tuple[int, int]:
    """``(worker_id, num_workers)`` inside a DataLoader worker (or a loader thread standing for one, see
    :func:`acting_as_worker`), ``(0, 1)`` in the main process."""
    acting = getattr(_thread, "worker", None)
    if acting is not None:
        return acting  # type: ignore[no-any-return]
    return worker_process()
