"""A :class:`fastdata.Mix` worker's next mixed batch, read together with the one it was asked for.

A mixed batch of ``B`` samples holds about ``w_s * B`` of each source, so each source is read ``w_s * B`` at a
time: its fixed cost per read (opening a run, a call per field, the pipeline's set-up) weighs ``1 / w_s``
times as much as when it is read alone in batches of ``B`` (measured by ``benchmarks/bench_mix.py``: a mix
of two sources at 0 workers read at 0.8-0.9 of the slower source, about the rate of both read in batches
of ``B / 2``). A DataLoader worker is dealt every ``num_workers``-th batch of the rank's contiguous run of
mix positions, so its next batch is the same run of positions a fixed stride further on: this reads both
in one go per source and holds the second until it is asked for.

The stride is learnt, not assumed: from two consecutive requests of the same length (positions in one
contiguous run each); a held batch that is not asked for next is dropped, and after two such misses in an
epoch nothing more is held in it (an epoch resumed on another number of ranks deals batches unevenly).
What a position reads does not depend on when it is read, so the batches are the same either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MISSES = 2  # held batches not asked for, in one epoch, before holding stops for the epoch


class ReadAhead:
    """The batch a worker will be asked for next (see the module doc); one per dataset copy (per worker,
    per loader thread)."""

    def __init__(self) -> None:
        self._last: tuple[int, int, int] | None = None  # (epoch, first position, length) of the last request
        self._held: tuple[int, int, int, list[Any]] | None = None  # (epoch, first, length, samples)
        self._misses: tuple[int, int] = (-1, 0)  # (epoch, held batches dropped in it)

    def take(self, epoch: int, positions: np.ndarray) -> list[Any] | None:
        """The held samples of ``positions``, or None (a held batch of other positions is dropped)."""
        run = _run(positions)
        held, self._held = self._held, None
        if held is not None:
            if run is not None and held[:3] == (epoch, *run):
                self._last = (epoch, *run)
                return held[3]
            self._miss(held[0])
        return None

    def plan(self, epoch: int, positions: np.ndarray, size: int) -> np.ndarray | None:
        """The positions to read along with ``positions`` (this worker's next batch, as learnt), or None."""
        run = _run(positions)
        last, self._last = self._last, (epoch, *run) if run is not None else None
        if run is None or last is None or last[0] != epoch or last[2] != run[1]:
            return None
        if self._misses[0] == epoch and self._misses[1] >= MISSES:
            return None
        first, n = run
        nxt = first + (first - last[1])
        if first - last[1] < n or nxt + n > size:
            return None
        return np.arange(nxt, nxt + n, dtype=np.int64)

    def hold(self, epoch: int, positions: np.ndarray, samples: list[Any]) -> None:
        self._held = (epoch, int(positions[0]), len(positions), samples)

    def _miss(self, epoch: int) -> None:
        was, count = self._misses
        self._misses = (epoch, count + 1 if was == epoch else 1)


def _run(positions: np.ndarray) -> tuple[int, int] | None:
    """``(first, length)`` when ``positions`` are one increasing run of consecutive positions, else None."""
    n = len(positions)
    if not n or int(positions[-1]) - int(positions[0]) != n - 1 or (n > 1 and (np.diff(positions) != 1).any()):
        return None
    return int(positions[0]), n


__all__ = ["MISSES", "ReadAhead"]
