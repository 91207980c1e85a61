"""Resuming an epoch on another number of ranks: which samples each new rank reads. Pure, no I/O.

An epoch is planned for ``N`` ranks with batches of ``B`` (:mod:`fastdata.core.epoch`): rank ``r`` reads its
part of the epoch's sequence in order, ``B`` at a time. A state saved after ``k`` batches says that every rank
consumed the first ``k`` batches of its part (a rank with fewer had consumed all of its own). Resumed on ``M``
ranks with batches of ``B'``, the epoch is finished in a *tail layout*:

1. **what is left**: the unconsumed rest of each old rank's part, in that rank's order, old ranks one after
   the other: one sequence ``R`` of ``L`` samples, each of them exactly once;
2. **chunks**: ``R`` is cut into chunks of ``B'`` samples (the last one shorter); with ``keep_batches`` (batches
   whose samples must stay together, say of one source) a chunk never crosses a batch of the old layout;
3. **equal batches per rank**: ``b = ceil(chunks / M)``; while there are fewer than ``M * b`` chunks, the
   largest one (the later one among equals) is split in two, so up to ``M - 1`` batches of the tail are
   smaller than ``B'``. Only when fewer samples are left than ``M * b`` (fewer than ``M`` left, or ``B' = 1``
   with ``L`` not a multiple of ``M``) are the missing batches padded with one sample each, the first ones of
   ``R`` read a second time;
4. **new ranks**: rank ``m`` reads chunks ``m * b .. (m + 1) * b - 1``, one batch each: a contiguous run of ``R``.

A tail can itself be stopped and resumed elsewhere: :func:`layout` stacks one tail per :class:`Stop`. Every
position of the newest layout traces back to a (rank, position) of the epoch's own plan
(:meth:`Layout.origin`), which the dataset or sampler turns into a sample.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastdata.core.epoch._resume import Stop
from fastdata.core.errors import ConfigError


@dataclass(frozen=True)
class Base:
    """The epoch's own plan, as a layout: what each rank of it reads.

    Attributes:
        lengths (tuple[int, ...]): samples of each rank's part (after ``drop_last``), one per rank.
        batch_size (int): samples per batch (each rank's last batch may be shorter).
        keep_batches (bool): a later layout never puts samples of two batches of this one into one batch
            (each batch is of one source). Defaults to False.
    """

    lengths: tuple[int, ...]
    batch_size: int
    keep_batches: bool = False


class Layout:
    """Who reads what in one layout of an epoch: per rank, a sequence of positions cut into batches."""

    lengths: np.ndarray  # samples per rank

    @property
    def world_size(self) -> int:
        return len(self.lengths)

    def bounds(self, rank: int) -> np.ndarray:
        """Where rank ``rank``'s batches start and end: ``[0, ..., length]``."""
        raise NotImplementedError

    def batches(self, rank: int) -> int:
        return len(self.bounds(rank)) - 1

    def origin(self, ranks: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rank, position)`` in the epoch's own plan of each ``(ranks[i], positions[i])`` of this layout."""
        raise NotImplementedError


class BaseLayout(Layout):
    """The epoch's own plan (:class:`Base`)."""

    def __init__(self, base: Base) -> None:
        self.lengths = np.asarray(base.lengths, dtype=np.int64)
        self.batch_size = base.batch_size

    def bounds(self, rank: int) -> np.ndarray:
        n = int(self.lengths[rank])
        return np.append(np.arange(0, n, self.batch_size, dtype=np.int64), n)

    def origin(self, ranks: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ranks, positions


class TailLayout(Layout):
    """What is left of ``parent`` after ``consumed`` batches, dealt to ``world_size`` ranks in batches of at
    most ``batch_size``, the same number per rank (see the module doc).

    Args:
        parent (Layout): the layout the epoch was stopped in.
        consumed (int): batches every rank of ``parent`` had consumed.
        world_size (int): ranks that finish the epoch.
        batch_size (int): their batch size.
        keep_batches (bool): no batch takes samples of two of ``parent``'s batches.
    """

    def __init__(self, parent: Layout, consumed: int, world_size: int, batch_size: int, keep_batches: bool) -> None:
        if world_size < 1 or batch_size < 1:
            raise ConfigError(f"world_size={world_size} and batch_size={batch_size} must be at least 1")
        self.parent = parent
        most = max((parent.batches(p) for p in range(parent.world_size)), default=0)
        if not 0 <= consumed <= most:  # a garbled state, or one of another epoch's plan
            raise ConfigError(
                f"batches={consumed} is outside the epoch it was saved in: its {parent.world_size} ranks read at "
                f"most {most} batches each"
            )
        starts, cuts = [], []  # per parent rank: first unconsumed position; where its rest must be cut
        for p in range(parent.world_size):
            bounds = parent.bounds(p)
            done = int(bounds[min(consumed, len(bounds) - 1)])
            starts.append(done)
            cuts.append(bounds[bounds >= done] - done)
        self._starts = np.asarray(starts, dtype=np.int64)
        rest = parent.lengths - self._starts
        self._offsets = np.concatenate([[0], np.cumsum(rest)]).astype(np.int64)  # where each part starts in R
        total = int(self._offsets[-1])
        if keep_batches:  # cut at every batch of the parent, and every batch_size inside one
            edges = np.unique(np.concatenate([c + o for c, o in zip(cuts, self._offsets[:-1].tolist())] + [[0]]))
        else:
            edges = np.array([0], dtype=np.int64)
        edges = np.unique(np.concatenate([edges, [total]])).astype(np.int64)
        sizes: list[int] = []
        for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist()):
            whole, rest = divmod(hi - lo, batch_size)
            sizes += [batch_size] * whole + ([rest] if rest else [])
        per = -(-len(sizes) // world_size)
        sizes = _split_to(sizes, world_size * per)
        pads = world_size * per - len(sizes)  # only when fewer samples are left than batches wanted
        chunk_sizes = np.asarray(sizes + [1] * pads, dtype=np.int64)
        self.pads = pads
        self._chunk_ends = np.cumsum(chunk_sizes)  # in R, pads counted after its end
        self._per = per
        self.total = total
        ends = np.concatenate([[0], self._chunk_ends])
        self._rank_starts = ends[np.arange(world_size) * per]
        self.lengths = ends[np.arange(1, world_size + 1) * per] - self._rank_starts
        self._ends = ends

    def bounds(self, rank: int) -> np.ndarray:
        lo = rank * self._per
        return self._ends[lo : lo + self._per + 1] - self._ends[lo]

    def origin(self, ranks: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = self._rank_starts[ranks] + positions  # in R; at or past its end: a pad
        past = at >= self.total
        if past.any():  # the pads read R's first samples again
            at = np.where(past, (at - self.total) % max(self.total, 1), at)
        parent = np.searchsorted(self._offsets, at, side="right") - 1
        return self.parent.origin(parent, self._starts[parent] + at - self._offsets[parent])


def _split_to(sizes: list[int], want: int) -> list[int]:
    """``sizes`` with its largest entries (the later one among equals) split in two until there are ``want``
    of them, or every entry is 1; the order kept, a split entry's halves in its place."""
    if len(sizes) >= want or not sizes:
        return sizes
    pieces = [1] * len(sizes)
    heap = [(-size, -i) for i, size in enumerate(sizes)]
    heapq.heapify(heap)
    count = len(sizes)
    while count < want and heap:
        _, neg = heapq.heappop(heap)
        i = -neg
        if pieces[i] >= sizes[i]:
            continue  # every piece of it is one sample: it cannot give more
        pieces[i] += 1
        count += 1
        heapq.heappush(heap, ((-sizes[i]) // pieces[i], neg))  # minus its largest piece
    out: list[int] = []
    for size, k in zip(sizes, pieces):
        base, extra = divmod(size, k)
        out += [base + 1] * extra + [base] * (k - extra)
    return out


def layout(base: Base, stops: Sequence[Stop], world_size: int, batch_size: int) -> Layout:
    """The layout an epoch is read in after ``stops`` (oldest first; the first one in the epoch's own plan,
    :class:`Base`), on ``world_size`` ranks with batches of ``batch_size``.

    Raises:
        ConfigError: when the first stop does not describe ``base`` (another world size or batch size).
    """
    if not stops:
        return BaseLayout(base)
    first = stops[0]
    if (first.world_size, first.batch_size) != (len(base.lengths), base.batch_size):
        raise ConfigError(
            f"the first stop ({first.world_size} ranks, batches of {first.batch_size}) is not the epoch's plan "
            f"({len(base.lengths)} ranks, batches of {base.batch_size})"
        )
    current: Layout = BaseLayout(base)
    for i, stop in enumerate(stops):
        nxt = (stops[i + 1].world_size, stops[i + 1].batch_size) if i + 1 < len(stops) else (world_size, batch_size)
        current = TailLayout(current, stop.position, nxt[0], nxt[1], base.keep_batches)
    return current


def rank_plan(lay: Layout, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank ``rank``'s part of ``lay``: ``(base ranks, base positions, bounds)``: where each of its samples lies
    in the epoch's own plan, in order, and where its batches start and end."""
    n = int(lay.lengths[rank])
    ranks, positions = lay.origin(np.full(n, rank, dtype=np.int64), np.arange(n, dtype=np.int64))
    return ranks, positions, lay.bounds(rank)


__all__ = ["Base", "BaseLayout", "Layout", "TailLayout", "layout", "rank_plan"]
