"""Who is reading: rank and world size, worker and number of workers, seed and epoch.

The rank comes from wherever the job says it (:func:`current_rank`): ``torch.distributed`` once it is
initialised, else the launch environment (torchrun, Lightning's ddp children before their process group
starts, SLURM). A dataset records it when it is built and checks it again in the process that reads
(:class:`RankFollower`): one built before the ranks existed (in a ``LightningDataModule.__init__``, or
pickled into ddp_spawn ranks) learns its rank there. The worker is read inside
``__iter__``/``__getitem__``, where ``get_worker_info()`` knows it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

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
    """``(rank, world_size)`` from ``torch.distributed`` if initialised, else the launch environment
    (:func:`launch_rank`), else ``(0, 1)``.

    Raises:
        ConfigError: for an inconsistent launch environment.
    """
    return said_rank() or (0, 1)


def said_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` as the job says it (``torch.distributed``, else :func:`launch_rank`), or None
    when nothing says anything (a single process, or a DataLoader worker of a spawned rank)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return launch_rank()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"the environment variable {name}={value!r} must be an integer") from None


def launch_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` from the launch environment, or None when it names no rank.

    In order: ``RANK`` and ``WORLD_SIZE`` (torchrun, Accelerate); ``LOCAL_RANK`` with ``WORLD_SIZE``, the
    node from ``GROUP_RANK`` or ``NODE_RANK`` (0 if neither) and ``LOCAL_WORLD_SIZE`` ranks per node
    (Lightning's ddp children before their process group starts have no ``RANK``); ``SLURM_PROCID`` and
    ``SLURM_NTASKS``.

    Raises:
        ConfigError: when the variables contradict each other or themselves (``RANK`` without
            ``WORLD_SIZE``, a rank outside the world, a node rank without ranks per node).
    """
    rank, world_size, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    local_world = _env_int("LOCAL_WORLD_SIZE")
    if local_rank is not None and local_world is not None and not 0 <= local_rank < local_world:
        raise ConfigError(f"the environment says LOCAL_RANK={local_rank} of LOCAL_WORLD_SIZE={local_world}")
    said = "RANK"
    if rank is not None:
        if world_size is None:
            raise ConfigError(f"the environment sets RANK={rank} but no WORLD_SIZE: set both, or neither")
    elif local_rank is not None and world_size is not None:
        node = _env_int("GROUP_RANK")
        node = _env_int("NODE_RANK") if node is None else node
        if node and local_world is None:
            raise ConfigError(
                f"the environment sets LOCAL_RANK={local_rank} on node {node} but neither RANK nor "
                "LOCAL_WORLD_SIZE: the global rank is unknown; set RANK"
            )
        rank, said = (node or 0) * (local_world or 0) + local_rank, "LOCAL_RANK"
    elif _env_int("SLURM_PROCID") is not None and _env_int("SLURM_NTASKS") is not None:
        rank, world_size, said = _env_int("SLURM_PROCID"), _env_int("SLURM_NTASKS"), "SLURM_PROCID"
    else:
        return None
    assert rank is not None and world_size is not None
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(
            f"the environment says rank={rank} (from {said}) of WORLD_SIZE={world_size}: a rank must lie in "
            "[0, world size); check the launcher's variables"
        )
    return rank, world_size


class RankFollower:
    """The rank and world size a dataset or sampler reads as, recorded when it is built and checked again
    in the process that reads (:meth:`follow_rank`), so that one built before the ranks existed learns its
    rank where it runs. Given ones (``rank=``/``world_size=``) are the user's word and stay as they are.

    Subclasses call :meth:`_init_rank` and, when their length depends on the rank, override
    :meth:`_rank_changed`.
    """

    rank: int
    world_size: int

    def _init_rank(self, rank: int | None, world_size: int | None) -> None:
        detected = current_rank()
        self._rank_given = rank is not None or world_size is not None
        self.rank = detected[0] if rank is None else rank
        self.world_size = detected[1] if world_size is None else world_size
        self._rank_used = False  # read as this rank: from then on a different one is refused, not taken

    def follow_rank(self, *, use: bool = True) -> None:
        """Take the rank the running job says (:func:`said_rank`) if it differs from the recorded one and
        nothing was read yet; refuse it once something was.

        Args:
            use (bool): this call reads as the rank (a pass begins), so a later change is refused.
                Defaults to True.

        Raises:
            ConfigError: when the job's rank or world size differ from the ones already read as.
        """
        if self._rank_given:
            return
        said = said_rank()
        if said is not None and said != (self.rank, self.world_size):
            if self._rank_used:
                raise ConfigError(
                    f"{self!r} read as rank {self.rank} of {self.world_size}, but this process is rank {said[0]} "
                    f"of {said[1]}: its part of the epoch would be another rank's. Build it in the process that "
                    "reads it (in LightningDataModule.setup(), after the process group starts), or pass "
                    "rank= and world_size="
                )
            World(*said)  # checks them
            self.rank, self.world_size = said
            self._rank_changed()
        if use:
            self._rank_used = True

    def _rank_changed(self) -> None:
        """Called after :meth:`follow_rank` took a new rank: recompute what depends on it."""


# Accelerate's wrappers that split a loader's batches or samples over the processes themselves
_SPLITTERS = {"BatchSamplerShard", "IterableDatasetShard", "DataLoaderDispatcher", "DataLoaderShard"}


def _called_by_trainer(frame: Any) -> bool:
    """A Hugging Face ``Trainer`` method is further up the stack (it prepares through Accelerate)."""
    while frame is not None:
        if type(frame.f_locals.get("self")).__module__.startswith("transformers."):
            return True
        frame = frame.f_back
    return False


def refuse_second_split(owner: str, world_size: int) -> None:
    """Refuse, at the first batch, a rank-split reader that a framework splits over the ranks again
    (Accelerate's ``prepare`` of a ``DataLoader``): each rank would read half of its part, or rank 0's part
    would be dispatched to every rank. Looks up the calling stack (once per pass) for the framework's
    wrappers; a forked worker still has its parent's frames below its own.

    Raises:
        ConfigError: naming the setting to change.
    """
    if world_size <= 1:
        return
    frame = sys._getframe(1)
    while frame is not None:
        me = frame.f_locals.get("self")
        kind = type(me)
        if kind.__name__ in _SPLITTERS and kind.__module__.startswith("accelerate."):
            if _called_by_trainer(frame):
                how = (
                    "the Hugging Face Trainer prepared its DataLoader through Accelerate, which split it over the "
                    f"{world_size} processes again ({kind.__name__}): return fastdata.Loader(dataset, "
                    "batch_size=...) from the Trainer's get_train_dataloader() instead (Accelerate leaves it as "
                    "it is)"
                )
            else:
                how = (
                    f"accelerator.prepare() split the DataLoader over the {world_size} processes again "
                    f"({kind.__name__}): pass fastdata.Loader(dataset, batch_size=...) to prepare() instead (it "
                    "leaves it as it is)"
                )
            raise ConfigError(
                f"{owner} already reads only this rank's part of the epoch, and {how}, or build the dataset "
                "with rank=0, world_size=1 so that the framework's split is the only one (see docs/frameworks.md)"
            )
        frame = frame.f_back  # type: ignore[assignment]


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
            (:func:`fastdata.core.epoch.pass_token`). Defaults to 0.
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
