"""Which source each position of a mixed epoch draws from: pure functions, exact integer arithmetic, no I/O.

A mix epoch of ``E`` positions draws ``c_s`` samples from source ``s`` (:func:`apportion`: the counts sum to
``E``, each within one of ``w_s * E``). The sequence interleaves them as evenly as integers allow: draw ``k`` of
source ``s`` is due at time ``(k + 1/2) / c_s``, and positions take the draws in the order they are due (ties
to the lower source). This is Webster's (Sainte-Laguë's) sequential apportionment, so

* every source gets exactly ``c_s`` positions per epoch;
* the first ``h`` positions hold the Webster apportionment of ``h`` to the sources (house-monotone: a longer
  prefix never holds fewer of any source): each source within about one sample of ``h * c_s / E`` for a
  few sources; any window of positions (a batch) likewise;
* a source's draws come in order (draw ``k`` before draw ``k + 1``), so a rank, which reads a contiguous
  span of positions, reads a contiguous run of each source's draws.

The sequence is the same every epoch (the counts are); it is computed block by block (:data:`BLOCK`
positions), each from the exact counts before it (:func:`prefix`), so any worker finds the source of any
position in time proportional to the block, never to the epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

BLOCK = 4096
"""Positions computed together: a worker looking up a batch's positions merges one or two blocks."""


def apportion(total: int, weights: Sequence[float]) -> np.ndarray:
    """``total`` split into integers proportional to ``weights`` (largest remainders; ties to the lower index):
    they sum to ``total``, each within one of ``total * w / sum(weights)``."""
    w = np.asarray(weights, dtype=np.float64)
    quota = total * w / w.sum()
    out = np.floor(quota).astype(np.int64)
    short = total - int(out.sum())
    if short > 0:
        order = np.lexsort((np.arange(len(w)), -(quota - out)))
        out[order[:short]] += 1
    return out


def prefix(counts: Sequence[int] | np.ndarray, h: int) -> np.ndarray:
    """How many of the first ``h`` positions of the sequence of ``counts`` each source holds (exact)."""
    c = [int(x) for x in counts]
    total = sum(c)
    if h <= 0:
        return np.zeros(len(c), dtype=np.int64)
    if h >= total:
        return np.asarray(c, dtype=np.int64)
    margin = len(c) + 3  # the h-th draw lies within this many draws of h * c / total for every source
    lows = [max(0, (h * cs) // total - margin) if cs else 0 for cs in c]
    highs = [min(cs, -(-(h * cs) // total) + margin) for cs in c]
    candidates = sorted((Fraction(2 * k + 1, 2 * cs), s) for s, cs in enumerate(c) for k in range(lows[s], highs[s]))
    need = h - sum(lows)
    assert 0 <= need <= len(candidates), "prefix: the window of candidates is too narrow"
    out = np.asarray(lows, dtype=np.int64)
    for _, s in candidates[:need]:
        out[s] += 1
    return out


class MixSequence:
    """The sources and draw numbers at positions of the mix sequence of ``counts`` (see the module doc).

    Args:
        counts (Sequence[int]): positions per epoch of each source.
        block (int): positions computed together. Defaults to :data:`BLOCK`.
    """

    def __init__(self, counts: Sequence[int] | np.ndarray, block: int = BLOCK) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.total = int(self.counts.sum())
        self.block = block
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, object]:
        return {"counts": self.counts, "total": self.total, "block": self.block}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._cache = {}

    def _block(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """``(sources, draws)`` of block ``j``'s positions."""
        got = self._cache.get(j)
        if got is not None:
            return got
        lo, hi = j * self.block, min(self.total, (j + 1) * self.block)
        before, after = prefix(self.counts, lo), prefix(self.counts, hi)
        sources = np.repeat(np.arange(len(self.counts), dtype=np.int64), after - before)
        draws = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(before, after)])
        due = (2 * draws + 1) / (2.0 * self.counts[sources])  # exact sets per block; float order within one
        order = np.lexsort((sources, due))
        got = (sources[order], draws[order])
        if len(self._cache) >= 4:
            self._cache.pop(next(iter(self._cache)))
        self._cache[j] = got
        return got

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, draw number in this epoch)`` of each of ``positions`` (``0 .. total-1``)."""
        positions = np.asarray(positions, dtype=np.int64)
        sources = np.empty(len(positions), dtype=np.int64)
        draws = np.empty(len(positions), dtype=np.int64)
        blocks = positions // self.block
        for j in np.unique(blocks).tolist():
            mine = blocks == j
            s, d = self._block(j)
            offset = positions[mine] - j * self.block
            sources[mine], draws[mine] = s[offset], d[offset]
        return sources, draws


__all__ = ["BLOCK", "MixSequence", "apportion", "prefix"]
