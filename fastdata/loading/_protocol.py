"""What a fastdata dataset, and a resumable sampler, offer: the protocols the loading layer works through.

:class:`fastdata.Loader`, :func:`fastdata.loading.build_dataloader` and the benchmark harness take
any object that has these members (``isinstance`` works on each: they are ``runtime_checkable``), so a
dataset written outside fastdata can join by offering them. Split by what really differs:

- :class:`Dataset`: every fastdata dataset (rank, world size, seed, the shared epoch, the calling
  worker's world, ``close``);
- :class:`MapDataset`: a map-style one, read through its rank-aware ``sampler()``;
- :class:`BatchingDataset`: an iterable one that deals whole batches and resumes (``TarShardDataset``);
- :class:`Collating`: a dataset with its own faster ``collate`` (``HDF5Dataset``);
- :class:`Resumable`, :class:`ResumableSampler`, :class:`ResumableBatchSampler`: what can save and load
  a :class:`~fastdata.core.epoch.ResumeState`; :class:`Planned`: a dataset whose resume states name its
  data (``resume_plan()``).

A plain torch dataset, without these members, is read by :class:`fastdata.Loader` too: a map-style one through
an :class:`~fastdata.loading.EpochSampler` over its indices, an ``IterableDataset`` as it is (see the
Loader's ``dataset`` argument).

The two members core calls itself (``worker_world``, ``warm``) are declared in :mod:`fastdata.core.epoch`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from fastdata.core.epoch import Remainder, WorkerAware


@runtime_checkable
class Resumable(Protocol):
    """Saves where it stands and resumes from it (a :class:`~fastdata.core.epoch.ResumeState` as a dict)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class Planned(Protocol):
    """A dataset that names what its order depends on, beyond its size and seed (its shards, a Mix's sources):
    the keys a resume state records and is checked against (:data:`fastdata.core.epoch.PLAN_KEYS`)."""

    def resume_plan(self) -> dict[str, int]: ...


@runtime_checkable
class ResumableSampler(Resumable, Protocol):
    """A sampler that follows the epoch and resumes mid-epoch (:class:`fastdata.loading.EpochSampler`)."""

    @property
    def epoch(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...


@runtime_checkable
class RankSampler(Protocol):
    """A sampler that splits ``n`` indices over ranks by a remainder policy: the Loader can then tell
    whether ``drop_last`` leaves some rank without a batch, before any rank starts."""

    n: int
    world_size: int
    remainder: Remainder


@runtime_checkable
class ResumableBatchSampler(ResumableSampler, Protocol):
    """A batch sampler that resumes (:class:`~fastdata.loading.ChunkBatchSampler`): it yields
    lists of indices, ``batch_size`` at a time, and counts its position in samples (whole batches)."""

    batch_size: int
    drop_last: bool

    @property
    def samples(self) -> int:
        """Indices this rank reads per epoch (before ``drop_last``)."""
        ...


@runtime_checkable
class Dataset(WorkerAware, Protocol):
    """What every fastdata dataset offers, map-style or iterable."""

    rank: int
    world_size: int
    seed: int

    @property
    def epoch(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def close(self) -> None: ...

    def __len__(self) -> int: ...


@runtime_checkable
class MapDataset(Dataset, Protocol):
    """A map-style fastdata dataset: random access, read in the order of its rank-aware ``sampler()``.

    fastdata's also offer ``warm()`` (:class:`~fastdata.core.epoch.Warmable`), which
    :data:`fastdata.worker_init_fn` calls in each worker.
    """

    def sampler(self, *, shuffle: bool = True, remainder: Remainder = "drop") -> ResumableSampler: ...

    def __getitem__(self, index: int) -> Any: ...


@runtime_checkable
class BatchingDataset(Dataset, Resumable, Protocol):
    """An iterable fastdata dataset that plans its own epoch: with ``batch_size`` set it yields whole
    batches, the same for any ``num_workers``, and resumes mid-epoch (``TarShardDataset(batch_size=...)``).

    ``len()`` counts batches when ``batch_size`` is set; ``total`` counts the samples of the whole dataset.
    """

    batch_size: int | None
    shuffle: bool
    remainder: Remainder
    drop_last: bool
    total: int

    def __iter__(self) -> Iterator[Any]: ...


@runtime_checkable
class Collating(Protocol):
    """A dataset with its own ``collate``, preferred over ``default_collate`` for the batches it is read in."""

    def collate(self, samples: Sequence[Any]) -> Any: ...


__all__ = [
    "BatchingDataset",
    "Collating",
    "Dataset",
    "MapDataset",
    "RankSampler",
    "Resumable",
    "ResumableBatchSampler",
    "ResumableSampler",
]
