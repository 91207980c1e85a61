"""Which samples each (rank, worker) reads: pure functions, no I/O, no communication.

Every dataset lays its samples out in one *epoch sequence* (shards in a seeded order, samples in
shard order), identical on every rank because it depends only on (seed, epoch). Each rank takes one
contiguous span of it, of equal length on every rank (``remainder="drop"`` or ``"pad"``) so no rank
runs out of batches before the others and hangs the job at the next collective. Inside a rank, samples
are shuffled within windows of the span, and the span is dealt to workers:

* in *units* of ``batch_size`` positions, unit ``j`` to worker ``j % num_workers``. The DataLoader
  returns worker outputs round-robin, so the rank sees the same batches in the same order whatever
  ``num_workers`` is, and a run resumed at batch ``k`` continues exactly where it stopped;
* or, without a batch size, as one contiguous range per worker (best locality, order depends on
  ``num_workers``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np

from fastdata.core.errors import PlanError, check_choice

Remainder = Literal["drop", "pad", "uneven"]
"""What to do when the epoch does not split evenly over ranks.

* ``"drop"``: every rank reads ``n // world_size`` samples; the last few of the epoch's order are left
  out (different ones each epoch when shuffling). Default.
* ``"pad"``: every rank reads ``ceil(n / world_size)``; the first few samples of the order are read a
  second time to fill the last rank.
* ``"uneven"``: ranks differ by at most one sample; nothing is dropped or repeated, but ranks may see
  a different number of batches, so training must use a join context (``torch.distributed.algorithms.Join``).
"""


def rank_span(n: int, rank: int, world_size: int, remainder: Remainder = "drop") -> tuple[int, int]:
    """``(start, length)`` of this rank's part of an epoch sequence of ``n`` samples.

    Positions at or past ``n`` (only with ``"pad"``) wrap around to the start of the sequence.

    Raises:
        PlanError: when a rank would get no sample at all.
    """
    check_choice("remainder", remainder, Remainder)
    if remainder == "drop":
        per = n // world_size
        start, length = rank * per, per
    elif remainder == "pad":
        per = -(-n // world_size)
        start, length = rank * per, per
    else:
        base, extra = divmod(n, world_size)
        start, length = rank * base + min(rank, extra), base + (rank < extra)
    # judged on the whole plan, not this rank's part, so that every rank refuses it alike
    if n == 0 or (remainder != "pad" and n < world_size):
        raise PlanError(
            f"{n} samples cannot be split over {world_size} ranks (with remainder={remainder!r} some rank "
            "would read nothing); use fewer ranks, more data, or remainder='pad'"
        )
    return start, length


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch sequence of ``n`` items: ``arange(n)``, or a permutation seeded by (seed, epoch)."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


def rank_indices(
    n: int,
    *,
    rank: int,
    world_size: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    remainder: Remainder = "drop",
) -> np.ndarray:
    """The indices one rank reads in one epoch, in order (for map-style datasets)."""
    start, length = rank_span(n, rank, world_size, remainder)
    order = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    return order[(start + np.arange(length)) % n]


class WindowShuffle:
    """Maps a position in a rank's span to the position it reads, shuffled within windows.

    The span is cut into windows of ``window`` positions; each window is permuted by a generator seeded
    from (seed, epoch, rank, window number), so any worker can compute any position on its own.

    Args:
        length (int): positions in the span.
        window (int): window size; 0 or 1 leaves the order unchanged.
        seed, epoch, rank (int): what the permutation depends on.
    """

    def __init__(self, length: int, window: int, *, seed: int, epoch: int, rank: int) -> None:
        self.length, self.window = length, window
        self._key = (seed, epoch, rank)
        self._cached: tuple[int, np.ndarray] | None = None

    def _perm(self, w: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != w:
            size = min(self.window, self.length - w * self.window)
            perm = np.random.default_rng([*self._key, w, 0x3A1D]).permutation(size)
            self._cached = (w, perm + w * self.window)
        return self._cached[1]

    def positions(self, lo: int, hi: int) -> np.ndarray:
        """Source positions for span positions ``lo .. hi-1``."""
        if self.window <= 1:
            return np.arange(lo, hi, dtype=np.int64)
        out = np.empty(hi - lo, dtype=np.int64)
        q = lo
        while q < hi:
            w = q // self.window
            end = min(hi, (w + 1) * self.window)
            out[q - lo : end - lo] = self._perm(w)[q - w * self.window : end - w * self.window]
            q = end
        return out


def worker_ranges(
    length: int, *, worker: int, num_workers: int, unit: int | None, start: int = 0
) -> Iterator[tuple[int, int]]:
    """The half-open ranges of span positions one worker yields, in order.

    Args:
        length (int): positions in the rank's span.
        worker, num_workers (int): this worker among the rank's DataLoader workers.
        unit (int | None): deal the span in units of this many positions (the batch size), unit ``j``
            to worker ``j % num_workers``; ``None`` gives each worker one contiguous range.
        start (int): first position to read (a resumed run); with ``unit`` it must be a multiple.
    """
    if unit is None:
        rest = length - start
        base, extra = divmod(rest, num_workers)
        lo = start + worker * base + min(worker, extra)
        hi = lo + base + (worker < extra)
        if hi > lo:
            yield lo, hi
        return
    if start % unit:
        raise PlanError(f"resume position {start} is not a multiple of the batch size {unit}")
    for lo in range(start + worker * unit, length, num_workers * unit):
        yield lo, min(lo + unit, length)


def split_counts(counts: list[int] | np.ndarray, order: np.ndarray) -> np.ndarray:
    """Cumulative sample offsets of shards taken in ``order``: ``offsets[i]`` is where shard
    ``order[i]`` starts in the epoch sequence; the last entry is the total."""
    ordered = np.asarray(counts, dtype=np.int64)[order]
    return np.concatenate([[0], np.cumsum(ordered)])


def locate(offsets: np.ndarray, order: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, index_in_shard)`` for epoch-sequence ``positions`` (see :func:`split_counts`)."""
    slot = np.searchsorted(offsets, positions, side="right") - 1
    return order[slot], positions - offsets[slot]
