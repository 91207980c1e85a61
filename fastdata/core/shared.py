"""State that every worker of one dataset shares with the main process: the epoch, and counters.

A persistent DataLoader worker keeps the copy of the dataset it was started with, so an epoch set later
in the main process (``set_epoch``) must reach it through memory both can see; so must the counts of
skipped samples and retries coming back from the workers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class SharedState:
    """Small state that every worker of one dataset shares with the main process, in shared memory.

    It carries the epoch from ``set_epoch`` in the main process to persistent workers (which keep the
    dataset copy they were started with), and per-process counters (skipped samples, retries) back to
    the main process. Each process writes only its own slot, so no lock is needed.

    Pickled by the DataLoader into ``spawn`` workers, the tensor travels as shared memory; pickled any
    other way, it is copied by value.
    """

    SLOTS = 1025  # the main process, then up to 1024 workers (more wrap around)

    def __init__(self, counters: tuple[str, ...] = ("skipped",)) -> None:
        self.counters = counters
        self._tensor = torch.zeros(1 + self.SLOTS * len(counters), dtype=torch.int64).share_memory_()
        self._view: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"counters": self.counters, "_tensor": self._tensor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.counters = state["counters"]
        self._tensor = state["_tensor"]
        self._view = None

    @property
    def _array(self) -> np.ndarray:
        if self._view is None:
            self._view = self._tensor.numpy()
        return self._view

    @property
    def epoch(self) -> int:
        return int(self._array[0])

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._array[0] = value

    def add(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to this process's slot of ``counter``."""
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        slot = 0 if info is None else 1 + info.id % (self.SLOTS - 1)
        i = self.counters.index(counter)
        self._array[1 + i * self.SLOTS + slot] += n

    def count_skip(self) -> None:
        self.add("skipped")

    def total(self, counter: str) -> int:
        """The sum of ``counter`` over the main process and every worker."""
        i = self.counters.index(counter)
        return int(self._array[1 + i * self.SLOTS : 1 + (i + 1) * self.SLOTS].sum())

    def totals(self) -> dict[str, int]:
        return {name: self.total(name) for name in self.counters}


class SharedEpoch:
    """``epoch`` and ``set_epoch`` kept in a :class:`SharedState` (``self._shared``), so that workers,
    persistent ones too, follow the main process's ``set_epoch``. For datasets and samplers."""

    _shared: SharedState

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (shared with every worker, persistent ones too)."""
        return self._shared.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new shuffle order, and new random streams in the workers."""
        self._shared.epoch = epoch


__all__ = ["SharedEpoch", "SharedState"]
