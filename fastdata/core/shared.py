"""State that every worker of one dataset shares with the main process: the epoch, counters, and the
epoch's order of indices.

A persistent DataLoader worker keeps the copy of the dataset it was started with, so an epoch set later
in the main process (``set_epoch``) must reach it through memory both can see; so must the counts of
skipped samples and retries coming back from the workers, and the order a sampler hands out (which a
worker reading ahead wants to know).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fastdata.core.world import acting_worker


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
        """Add ``n`` to this process's slot of ``counter`` (a loader thread's own slot, in thread mode: each
        slot has one writer, so no lock is needed)."""
        acting = acting_worker()
        if acting is not None:
            slot = 1 + acting[0] % (self.SLOTS - 1)
        else:
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


class SharedPlan:
    """One epoch's order of a map-style dataset's indices for one rank, in shared memory: written by the
    main process (its sampler, at the start of each epoch's iteration: ``EpochSampler(publish=plan.publish)``)
    and read by every worker, so that a worker learns what comes after the batch it was given without
    building the order itself (an array as long as the dataset, per worker).

    It holds the order, each index's position in it (-1: not in the order), and a stamp: the epoch they
    are for and a publication count. A reader checks the stamp before and after it reads, so a plan being
    rewritten, or one of another epoch, is never used; and it checks that the batch it was given is a run
    of the order, so a loader using another order is never guessed for.

    One tensor (one shared-memory file), of ``int32`` when the dataset allows (fewer than 2**31 samples),
    else ``int64``. Pickled by the DataLoader into ``spawn`` workers it travels as shared memory; forked
    workers share it as it is.

    Args:
        n (int): samples in the dataset; an order holds at most ``n`` indices, each in ``0 .. n-1``.
    """

    _HEAD = 3  # [epoch held (-1: none, or being written), publications, indices in the order]

    def __init__(self, n: int) -> None:
        dtype = torch.int32 if n < 2**31 - 1 else torch.int64
        self.n = n
        self._tensor = torch.full((self._HEAD + 2 * n,), -1, dtype=dtype).share_memory_()
        self._tensor[1:3] = 0
        self._views: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"n": self.n, "_tensor": self._tensor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.n, self._tensor = state["n"], state["_tensor"]
        self._views = None

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(stamp, order, position): views of the one shared tensor."""
        if self._views is None:
            flat = self._tensor.numpy()
            head, n = self._HEAD, self.n
            self._views = (flat[:head], flat[head : head + n], flat[head + n :])
        return self._views

    @property
    def epoch(self) -> int:
        """The epoch whose order the plan holds; -1 when none (or while one is being written)."""
        return int(self._arrays()[0][0])

    def publish(self, epoch: int, order: Any) -> None:
        """Hold ``order`` (at most :attr:`n` indices, each in ``0 .. n-1``) as epoch ``epoch``'s order."""
        stamp, held, position = self._arrays()
        order = np.asarray(order)
        if len(order) > self.n:
            raise ValueError(f"an order of {len(order)} indices does not fit a plan of {self.n}")
        stamp[0] = -1  # readers ignore the plan while it is rewritten
        held[: len(order)] = order
        position.fill(-1)
        position[order] = np.arange(len(order), dtype=position.dtype)
        stamp[2] = len(order)
        stamp[1] += 1
        stamp[0] = epoch

    def following(self, epoch: int, batch: Sequence[int], stride: int, count: int) -> list[int]:
        """The indices of the ``count`` runs as long as ``batch`` that start ``stride``, ``2 * stride``
        ... positions after it in epoch ``epoch``'s order (cut short at the order's end); ``[]`` when the
        plan holds another epoch or ``batch`` is not a run of the order.

        Args:
            epoch (int): the epoch the caller is reading.
            batch (Sequence[int]): the indices the caller was just asked for.
            stride (int): positions from one of the caller's runs to its next (a worker of a DataLoader
                with ``w`` workers and batches of ``b`` is dealt every ``w``-th batch: ``w * b``).
            count (int): runs wanted.
        """
        stamp, held, position = self._arrays()
        seen = (int(stamp[0]), int(stamp[1]))
        if seen[0] != epoch or seen[0] < 0 or not len(batch) or count < 1:
            return []
        first, size, end = int(batch[0]), len(batch), int(stamp[2])
        p = int(position[first]) if 0 <= first < self.n else -1
        if p < 0 or p + size > end or not np.array_equal(held[p : p + size], np.asarray(batch)):
            return []  # not the order of this plan: do not guess
        out: list[int] = []
        for k in range(1, count + 1):
            out += held[min(end, p + k * stride) : min(end, p + k * stride + size)].tolist()
        if (int(stamp[0]), int(stamp[1])) != seen:
            return []  # rewritten while it was read
        return out


__all__ = ["SharedEpoch", "SharedPlan", "SharedState"]
