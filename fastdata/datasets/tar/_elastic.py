"""``TarShardDataset``: an epoch resumed on another number of ranks (or with another batch size).

The plan is :mod:`fastdata.core.epoch`'s: the epoch's own plan on the saved number of ranks (each rank's span
of the epoch sequence, shuffled within windows, :func:`tar_base` and :func:`tar_positions`), what no rank had
consumed of it, dealt to this run's ranks in the same number of batches each. Each worker computes its rank's
part (an array of epoch positions as long as the rank's share) and reads every ``num_workers``-th batch of it,
as in an epoch of its own; a batch whose samples are all bad gets the substitute of
:mod:`fastdata.datasets`: the next good sample in this rank's order of the tail.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np

from fastdata.core import SKIP, process
from fastdata.core.epoch import (
    Base,
    Stop,
    WindowShuffle,
    World,
    epoch_order,
    layout,
    rank_plan,
    rank_span,
    split_counts,
)
from fastdata.datasets._substitute import find_substitute
from fastdata.datasets.tar._epoch_reader import EpochReader

# ``ds`` below is a TarShardDataset (not imported: it imports this module)
TarShardDataset = Any


def tar_base(ds: TarShardDataset, world_size: int, batch_size: int) -> Base:
    """The epoch's plan of ``ds`` on ``world_size`` ranks with batches of ``batch_size``."""
    lengths = []
    for r in range(world_size):
        n = rank_span(ds.total, r, world_size, ds.remainder)[1]
        lengths.append(n - n % batch_size if ds.drop_last else n)
    return Base(tuple(lengths), batch_size)


def tar_positions(ds: TarShardDataset, base: Base, epoch: int, ranks: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The epoch-sequence positions that rank ``ranks[i]`` of ``base`` reads ``at[i]``-th (window-shuffled)."""
    world_size = len(base.lengths)
    out = np.empty(len(at), dtype=np.int64)
    for r in np.unique(ranks).tolist():
        mine = ranks == r
        start = rank_span(ds.total, r, world_size, ds.remainder)[0]
        shuffled = WindowShuffle(base.lengths[r], ds.window, seed=ds.seed, epoch=epoch, rank=r)
        out[mine] = (start + shuffled.at(at[mine])) % ds.total
    return out


def tail_length(ds: TarShardDataset, history: Sequence[Stop]) -> int:
    """Batches of rank ``ds.rank`` in the epoch read after the stops of ``history``."""
    assert ds.batch_size is not None
    first = history[0]
    base = tar_base(ds, first.world_size, first.batch_size)
    return layout(base, history, ds.world_size, ds.batch_size).batches(ds.rank)


def tail_plan(ds: TarShardDataset, history: Sequence[Stop], epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, bounds)`` of rank ``ds.rank`` in epoch ``epoch`` read after the stops of ``history``: the
    epoch-sequence positions it reads, in order, and where its batches start and end."""
    assert ds.batch_size is not None
    first = history[0]
    base = tar_base(ds, first.world_size, first.batch_size)
    ranks, at, bounds = rank_plan(layout(base, history, ds.world_size, ds.batch_size), ds.rank)
    return tar_positions(ds, base, epoch, ranks, at), bounds


def read_tail(ds: TarShardDataset, world: World, history: Sequence[Stop], first: int, stride: int) -> Iterator[Any]:
    """This worker's batches of the tail: batch ``first``, ``first + stride`` ... of its rank's part."""
    positions, bounds = tail_plan(ds, history, world.epoch)
    order = epoch_order(len(ds.urls), shuffle=ds.shuffle, seed=ds.seed, epoch=world.epoch)
    epoch = EpochReader(ds.source, 0, ds.total, split_counts(ds.source.counts, order), order)
    history = tuple(history)
    try:
        for b in range(first, len(bounds) - 1, stride):
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            batch = epoch.decoded(positions[lo:hi])
            if not batch:
                batch = [_stand_in(ds, epoch, positions, b, lo, hi)]
            # counted before the yield, so that a state taken right after this batch resumes past it
            ds._progress = (process.pid(), world.epoch, b + stride, world.worker, world.num_workers, history)
            yield ds.collate_fn(batch)
    finally:
        ds.source.close()


def _stand_in(ds: TarShardDataset, epoch: EpochReader, positions: np.ndarray, b: int, lo: int, hi: int) -> Any:
    """The substitute for tail batch ``b`` (``positions[lo:hi]``), whose samples were all bad: the next good
    sample after it in this rank's order of the tail, wrapping to its start."""
    shards = epoch.shards_at(positions[lo:hi])
    pipeline = ds.source.pipeline

    def good(slots: list[int]) -> list[tuple[int, Any]]:
        where = positions[slots]
        raw = epoch.raw(where)
        for slot, p in zip(slots, where.tolist()):
            if p in raw:
                sample, _ = pipeline(raw[p])
                if sample is not SKIP:
                    return [(slot, sample)]
        return []

    return find_substitute(
        good,
        chain(range(hi, len(positions)), range(lo)),
        shared=ds._shared,
        owner=repr(ds),
        bad=f"every sample of batch {b} of the resumed epoch ({hi - lo} samples, from {', '.join(shards)})",
        order="this rank's order of the resumed epoch",
        unit="position",
        sources=shards,
    )[1]


__all__ = ["read_tail", "tail_length", "tail_plan", "tar_base", "tar_positions"]
