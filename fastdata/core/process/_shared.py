"""State that every worker of one dataset shares with the main process: the epoch, counters, and the
epoch's order of indices.

A persistent DataLoader worker keeps the copy of the dataset it was started with, so an epoch set later
in the main process (``set_epoch``) must reach it through memory both can see; so must the counts of
skipped samples and retries coming back from the workers, and the order a sampler hands out (which a
worker reading ahead wants to know).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastdata.core.epoch._world import acting_worker


@dataclass(frozen=True)
class PassStart:
    """What :meth:`SharedState.begin_pass` found out about a pass (one iteration over a dataset).

    Attributes:
        epoch_set (bool): the epoch was set (``set_epoch``) since the previous pass began, or before the
            first: the pass is meant to be epoch ``epoch``'s, and reproducible from (seed, epoch).
        repeated (bool): an earlier pass read this epoch and the epoch was not set again since.
        new (bool): this call recorded the pass; False when another process of the same pass (another
            DataLoader worker) did already.
    """

    epoch_set: bool
    repeated: bool
    new: bool


# The pass logs and one-time flags of a SharedState, by use.
DATASET_LOG, SAMPLER_LOG = 0, 1
REPEAT_FLAG, SAMPLER_REPEAT_FLAG, EGRESS_FLAG, WINDOW_FLAG, SUBSTITUTE_FLAG = 0, 1, 2, 3, 4

# Passes are logged in one int64 each, so that a record is written and read in one store and one load
# (atomic for an aligned 8-byte word): the workers of one pass, starting at once, never see half of it.
# [token: 40 bits | epoch assignments, modulo 2**20 | epoch_set | repeated]
_TOKEN_BITS, _SETS_BITS = 40, 20
_SETS_MASK = (1 << _SETS_BITS) - 1


def _pack(token: int, sets: int, epoch_set: bool, repeated: bool) -> int:
    return (token << (_SETS_BITS + 2)) | ((sets & _SETS_MASK) << 2) | (int(epoch_set) << 1) | int(repeated)


def _unpack(record: int) -> tuple[int, int, bool, bool]:
    return record >> (_SETS_BITS + 2), (record >> 2) & _SETS_MASK, bool(record & 2), bool(record & 1)


class SharedState:
    """Small state that every worker of one dataset shares with the main process, in shared memory.

    It carries the epoch from ``set_epoch`` in the main process to persistent workers (which keep the
    dataset copy they were started with), and per-process counters (skipped samples, retries) back to
    the main process. Each process writes only its own slot, so no lock is needed.

    It also keeps a log of passes (iterations over the dataset), so that a process starting one can
    tell whether the epoch was set for it (:meth:`begin_pass`), and one-time flags (:meth:`once`).

    Pickled by the DataLoader into ``spawn`` workers, the tensor travels as shared memory; pickled any
    other way, it is copied by value.
    """

    SLOTS = 1025  # the main process, then up to 1024 workers (more wrap around)
    # [epoch, epoch assignments, pass logs ..., one-time flags ..., "reads" when the epoch was set]; the
    # counters follow
    LOGS = 4
    FLAGS = 8
    _HEAD = 2 + LOGS + FLAGS + 1

    def __init__(self, counters: tuple[str, ...] = ("skipped",)) -> None:
        self.counters = counters
        self._tensor = torch.zeros(self._HEAD + self.SLOTS * len(counters), dtype=torch.int64).share_memory_()
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
        a = self._array
        a[0] = value
        a[1] += 1  # every assignment counts, the same value again too: the user set the epoch
        if "reads" in self.counters:
            a[self._HEAD - 1] = self.total("reads")

    def reads_this_epoch(self) -> int:
        """The ``"reads"`` counter (samples read, summed over every process) since the epoch was last set."""
        return self.total("reads") - int(self._array[self._HEAD - 1])

    def begin_pass(self, log: int, token: int) -> PassStart:
        """Record that a pass identified by ``token`` starts, in pass log ``log``; say whether the epoch
        was set for it and whether it repeats an epoch already read.

        Every process of one pass (each DataLoader worker) calls this with the same token; the first
        records the pass, the others get the same answer. The epoch counts as set when ``set_epoch`` was
        called since the previous pass of this log began (or, for the first pass, ever).

        Args:
            log (int): which log, ``0 .. LOGS-1`` (a dataset and its sampler keep separate ones).
            token (int): the pass's identity, the same in every process of the pass, different from the
                previous pass's (:func:`fastdata.core.epoch.pass_token`).
        """
        a = self._array
        slot = 2 + log
        record = int(a[slot])  # one load
        sets = int(a[1]) & _SETS_MASK
        token = (token & ((1 << _TOKEN_BITS) - 1)) or 1  # 0 means "no pass yet"
        held, held_sets, held_set, held_repeated = _unpack(record)
        if held == token:
            return PassStart(held_set, held_repeated, False)
        epoch_set = sets != held_sets
        repeated = record != 0 and not epoch_set
        a[slot] = _pack(token, sets, epoch_set, repeated)  # one store
        return PassStart(epoch_set, repeated, True)

    def once(self, flag: int) -> bool:
        """True the first time flag ``flag`` (``0 .. FLAGS-1``) is asked for, in any process (two processes
        asking at the very same instant may both get True: for warnings, not for correctness)."""
        a = self._array
        slot = 2 + self.LOGS + flag
        if a[slot]:
            return False
        a[slot] = 1
        return True

    def _slot(self, counter: str, slot: int) -> int:
        return self._HEAD + self.counters.index(counter) * self.SLOTS + slot

    def own_slot(self) -> int:
        """The slot the calling process (or loader thread) counts into: 0 in the main process, 1 + the
        worker's id in a DataLoader worker (or for the worker a loader thread stands for)."""
        acting = acting_worker()
        if acting is not None:
            return 1 + acting[0] % (self.SLOTS - 1)
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        return 0 if info is None else 1 + info.id % (self.SLOTS - 1)

    def add(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to this process's slot of ``counter`` (a loader thread's own slot, in thread mode: each
        slot has one writer, so no lock is needed)."""
        self._array[self._slot(counter, self.own_slot())] += n

    def slot_value(self, counter: str, slot: int) -> int:
        """Slot ``slot``'s count of ``counter``."""
        return int(self._array[self._slot(counter, slot)])

    def take_back(self, counter: str, slot: int, n: int) -> None:
        """Take ``n`` off slot ``slot`` of ``counter``: what its worker counted for samples it read ahead and
        never handed out, before the workers restart and count them again (only while no process writes it)."""
        i = self._slot(counter, slot)
        self._array[i] = max(0, int(self._array[i]) - n)

    def count_skip(self) -> None:
        self.add("skipped")

    def total(self, counter: str) -> int:
        """The sum of ``counter`` over the main process and every worker."""
        first = self._slot(counter, 0)
        return int(self._array[first : first + self.SLOTS].sum())

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


__all__ = [
    "DATASET_LOG",
    "EGRESS_FLAG",
    "REPEAT_FLAG",
    "SAMPLER_LOG",
    "SAMPLER_REPEAT_FLAG",
    "SUBSTITUTE_FLAG",
    "WINDOW_FLAG",
    "PassStart",
    "SharedEpoch",
    "SharedPlan",
    "SharedState",
]
