"""A map-style epoch resumed on another number of ranks (or with another batch size): its batches for this rank.

The plan is :mod:`fastdata.core.epoch`'s; the sampler that ordered the epoch
(:class:`~fastdata.loading.EpochSampler`, :class:`~fastdata.loading.ChunkBatchSampler`,
:class:`~fastdata.loading.ClipBatchSampler`) says what its plan on the saved number of ranks was
(``elastic_base``) and which index lies where in it (``elastic_items``); the batches of this rank come out as
lists of indices, read through a DataLoader's ``batch_sampler`` (:class:`TailBatches`): the tail's batches are
not all of one size (see :mod:`fastdata.core.epoch`), which a DataLoader batching a flat sampler could not
give.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fastdata.core.epoch import Base, Stop, layout, rank_plan
from fastdata.core.errors import ConfigError


@runtime_checkable
class ElasticSampler(Protocol):
    """A sampler whose epoch can be finished on another number of ranks."""

    rank: int
    world_size: int

    def elastic_base(self, world_size: int, batch_size: int, drop_last: bool) -> Base: ...

    def elastic_items(self, world_size: int, batch_size: int, ranks: np.ndarray, positions: np.ndarray) -> Any: ...


@runtime_checkable
class ElasticDataset(Protocol):
    """An iterable dataset that finishes an epoch on another number of ranks itself (``TarShardDataset``):
    its ``load_state_dict`` takes a state with ``history``, and it says how many batches that gives."""

    def elastic_length(self, history: Sequence[Stop]) -> int: ...


def tail_batches(
    sampler: ElasticSampler, history: Sequence[Stop], *, batch_size: int, drop_last: bool = False
) -> list[list[int]]:
    """This rank's batches (lists of indices) of the current epoch, read after the stops of ``history`` on
    ``sampler.world_size`` ranks with batches of at most ``batch_size``.

    Args:
        sampler: the sampler that orders the epoch (at its current epoch).
        history (Sequence[Stop]): the layouts the epoch was read in before, oldest first.
        batch_size (int): this run's batch size.
        drop_last (bool): whether the run that planned the epoch dropped each rank's last short batch
            (a DataLoader's ``drop_last``; a batch sampler's own is its own). Defaults to False.
    """
    first = history[0]
    base = sampler.elastic_base(first.world_size, first.batch_size, drop_last)
    lay = layout(base, history, sampler.world_size, batch_size)
    ranks, positions, bounds = rank_plan(lay, sampler.rank)
    items = np.asarray(sampler.elastic_items(first.world_size, first.batch_size, ranks, positions), dtype=np.int64)
    keep_sorted = bool(getattr(sampler, "sorted_batches", False))
    out = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        batch = items[lo:hi]
        out.append((np.sort(batch) if keep_sorted else batch).tolist())
    return out


class TailBatches:
    """A batch sampler over the batches of a resumed epoch's tail, from batch :attr:`start` on (set before
    each pass; the Loader counts the batches handed out)."""

    def __init__(self, epoch: int, history: Sequence[Stop], batches: list[list[int]]) -> None:
        self.epoch, self.history, self.batches = epoch, tuple(history), batches
        self.start = 0

    def __iter__(self) -> Iterator[list[int]]:
        # a generator: the start is read at the first next(), not at iter() (the DataLoader's iterator
        # calls iter() on its batch sampler twice)
        yield from self.batches[self.start :]

    def __len__(self) -> int:
        return len(self.batches)


def check_elastic(dataset: Any, sampler: Any, iterable: bool) -> None:
    """Refuse, naming the fix, a reader whose epoch cannot be finished on another number of ranks."""
    if iterable:
        if not isinstance(dataset, ElasticDataset):
            raise ConfigError(
                f"{type(dataset).__name__} cannot finish an epoch on another number of ranks or with another "
                "batch size: resume it with the world size and batch size it was saved with"
            )
    elif not isinstance(sampler, ElasticSampler):
        raise ConfigError(
            f"the sampler {type(sampler).__name__} cannot finish an epoch on another number of ranks or with "
            "another batch size (fastdata's EpochSampler, ChunkBatchSampler and ClipBatchSampler can): resume "
            "with the world size and batch size the state was saved with"
        )


__all__ = ["ElasticDataset", "ElasticSampler", "TailBatches", "check_elastic", "tail_batches"]
