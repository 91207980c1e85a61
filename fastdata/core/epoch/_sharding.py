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
from typing import Literal, get_args

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


REMAINDERS: tuple[Remainder, ...] = get_args(Remainder)
"""The policies in a fixed order: a resume state's plan saves one as its index here."""


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


EXACT_ORDER_MAX = 1 << 24
"""Epochs of up to this many samples (16.8M) are shuffled by a numpy permutation of the whole sequence
(``n`` int64s, built when an epoch starts). Larger ones by :func:`keyed_permutation`, computed position by
position, so that a sampler over 2^31 rows does not build a 16 GiB order up front."""


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch sequence of ``n`` items: ``arange(n)``, or a permutation seeded by (seed, epoch)."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    if n > EXACT_ORDER_MAX:
        return keyed_permutation(np.arange(n, dtype=np.int64), n, order_keys(seed, epoch))
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
    positions = (start + np.arange(length, dtype=np.int64)) % n
    if n > EXACT_ORDER_MAX:
        return _order_at(positions, n, shuffle=shuffle, seed=seed, epoch=epoch)
    order = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    return order[positions]


def rank_index_blocks(
    n: int,
    *,
    rank: int,
    world_size: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    remainder: Remainder = "drop",
    start: int = 0,
    block: int = 1 << 16,
) -> Iterator[np.ndarray]:
    """``rank_indices(...)[start:]`` in consecutive blocks; above :data:`EXACT_ORDER_MAX` samples each
    block is computed when it is asked for, in memory proportional to ``block``, not to ``n``."""
    span_start, length = rank_span(n, rank, world_size, remainder)
    if n <= EXACT_ORDER_MAX:
        yield rank_indices(
            n, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed, epoch=epoch, remainder=remainder
        )[start:]
        return
    for lo in range(start, length, block):
        positions = (span_start + np.arange(lo, min(lo + block, length), dtype=np.int64)) % n
        yield _order_at(positions, n, shuffle=shuffle, seed=seed, epoch=epoch)


def _order_at(positions: np.ndarray, n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The items of the epoch sequence of ``n`` (> :data:`EXACT_ORDER_MAX`) at ``positions``."""
    return keyed_permutation(positions, n, order_keys(seed, epoch)) if shuffle else positions


def order_at(positions: np.ndarray, n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The items of :func:`epoch_order` ``(n, ...)`` at ``positions`` (values in ``0 .. n-1``), for any ``n``."""
    positions = np.asarray(positions, dtype=np.int64)
    if n > EXACT_ORDER_MAX or not shuffle:
        return _order_at(positions, n, shuffle=shuffle, seed=seed, epoch=epoch)
    return epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch)[positions]


def order_keys(seed: int, epoch: int) -> np.ndarray:
    """The four Feistel keys of :func:`keyed_permutation` for (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 0x5EED, 0xFE15]).integers(0, 1 << 64, size=4, dtype=np.uint64)


def keyed_permutation(x: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """A permutation of ``0 .. n-1`` chosen by ``keys``, evaluated at ``x`` (values in ``0 .. n-1``):
    ``len(keys)`` Feistel rounds (four make a pseudo-random permutation) over the smallest even number of
    bits that covers ``n``, with cycle walking for values that land at or past ``n`` (a bijection of the
    bigger domain restricted this way stays a bijection of ``0 .. n-1``). Any position costs the same,
    so a worker or a resumed run computes only the part it reads."""
    bits = max(2, -(-max(1, int(n - 1).bit_length()) // 2) * 2)
    half = bits // 2
    out = _feistel(x.astype(np.uint64), half, keys)
    todo = np.flatnonzero(out >= n)
    while len(todo):  # ends: x's cycle under the bijection leads back to x < n; about 1-3 rounds
        out[todo] = _feistel(out[todo], half, keys)
        todo = todo[out[todo] >= n]
    return out.astype(np.int64)


def _feistel(x: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    mask = np.uint64((1 << half) - 1)
    left, right = x >> np.uint64(half), x & mask
    for key in keys:
        z = right ^ key  # splitmix64's finaliser as the round function
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        left, right = right, left ^ ((z ^ (z >> np.uint64(31))) & mask)
    return (left << np.uint64(half)) | right


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

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Source positions for any span ``positions`` (not only a range)."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.window <= 1:
            return positions
        out = np.empty_like(positions)
        windows = positions // self.window
        by = np.argsort(windows, kind="stable")
        cuts = np.flatnonzero(np.diff(windows[by])) + 1
        for group in np.split(by, cuts):
            if len(group):
                w = int(windows[group[0]])
                out[group] = self._perm(w)[positions[group] - w * self.window]
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
