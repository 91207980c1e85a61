"""``Mix(lanes=n, batch_size=b)``: each DataLoader worker's batches draw a remote tar source's samples from
blocks of its own, so that the source's stored bytes are fetched about once per epoch, not once per worker.

Why: a remote tar source without a cache is fetched a block at a time (the span its shuffle permutes, see
:mod:`fastdata.datasets.mix`), and the DataLoader deals batch ``i`` to worker ``i mod n``: every worker's
batches drew from every block, so each of ``n`` workers fetched about every block (2x the stored bytes with 2
workers). With lanes, batch ``i`` is in lane ``i mod lanes``, and:

* a source's draws of one epoch are numbered lane by lane (all of lane 0's draws, in position order, then lane
  1's ...) instead of in position order: a relabelling of the epoch's draws, so each draw still reads a
  sample of its pass once;
* the source's pass is cut into one segment per lane (in proportion to the lane's draws), and its shuffle's
  windows (and so the blocks fetched) are cut at the segments' edges: a lane's draws land in its own
  segment's blocks.

So with ``lanes`` equal to ``num_workers`` and ``batch_size`` the Loader's, each block is fetched by one worker.
The order depends on ``lanes`` and ``batch_size`` (part of the resume plan), never on the workers that read:
with other settings every sample is still read once per pass, only fetched more often. The shuffle of a source
spans at most its segment (a ``1 / lanes`` share of the pass): the price of one fetch per block.
"""

from __future__ import annotations

import numpy as np


def lane_draws(
    sources: np.ndarray, draws: np.ndarray, counts: np.ndarray, s: int, batch_size: int, lanes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(relabel, bounds)`` of source ``s``: ``relabel[k]``, the lane-major number of the epoch's draw ``k``,
    and ``bounds``, where each lane's numbers start (``lanes + 1`` values, from 0 to ``counts[s]``).

    Args:
        sources, draws: the source and draw of every position of the epoch (the mix's sequence).
        counts: draws of each source per epoch.
    """
    mine = np.flatnonzero(sources == s)  # positions of source s, in order
    position = np.empty(int(counts[s]), dtype=np.int64)
    position[draws[mine]] = mine
    lane = (position // batch_size) % lanes
    order = np.argsort(lane, kind="stable")  # lane-major, positions in order within each lane
    relabel = np.empty_like(order)
    relabel[order] = np.arange(len(order), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(lane, minlength=lanes))]).astype(np.int64)
    return relabel, bounds


class SegmentShuffle:
    """Positions ``0 .. n-1`` of a pass cut into segments at ``bounds``, each segment into blocks of ``block``
    positions (the last of a segment shorter), each block permuted (with ``shuffle``) by a generator seeded from
    (``seed``, ``epoch``, block number): :class:`fastdata.core.epoch.WindowShuffle` with windows that never
    straddle a segment's edge."""

    def __init__(self, n: int, bounds: np.ndarray, block: int, *, shuffle: bool, seed: int, epoch: int) -> None:
        block = max(1, block)
        starts = [p for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()) for p in range(a, b, block)]
        self.starts = np.asarray([*starts, n], dtype=np.int64)
        self.shuffle, self.seed, self.epoch = shuffle, seed, epoch
        self._perms: dict[int, np.ndarray] = {}

    def block_of(self, positions: np.ndarray) -> np.ndarray:
        """The block number of each of ``positions``."""
        return np.searchsorted(self.starts, positions, side="right") - 1  # type: ignore[no-any-return]

    def span(self, b: int) -> np.ndarray:
        """The positions of block ``b``."""
        return np.arange(self.starts[b], self.starts[b + 1], dtype=np.int64)

    def at(self, slots: np.ndarray) -> np.ndarray:
        """The position that each of ``slots`` (numbers within the pass) reads."""
        slots = np.asarray(slots, dtype=np.int64)
        if not self.shuffle:
            return slots.copy()
        out = np.empty_like(slots)
        blocks = self.block_of(slots)
        for b in np.unique(blocks).tolist():
            mine = blocks == b
            lo = int(self.starts[b])
            out[mine] = lo + self._perm(b)[slots[mine] - lo]
        return out

    def _perm(self, b: int) -> np.ndarray:
        got = self._perms.get(b)
        if got is None:
            size = int(self.starts[b + 1] - self.starts[b])
            got = np.random.default_rng([self.seed, self.epoch, b, 0x1A7E]).permutation(size)
            if len(self._perms) >= 8:
                self._perms.pop(next(iter(self._perms)))
            self._perms[b] = got
        return got


def pass_bounds(bounds: np.ndarray, n: int) -> np.ndarray:
    """The segments of a pass of ``n`` samples for lanes whose draws per epoch start at ``bounds`` (of ``c``
    draws): in proportion (the same edges when an epoch draws exactly a pass, ``c == n``)."""
    c = int(bounds[-1])
    return np.round(bounds.astype(np.float64) * n / max(1, c)).astype(np.int64)


__all__ = ["SegmentShuffle", "lane_draws", "pass_bounds"]
