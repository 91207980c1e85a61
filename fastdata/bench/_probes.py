"""What only a sweep measures, beside the library's probe: the envelope around each batch.

Everything else (stages, every thread of every process, the machine, D state) the sweep reads through
the library's probe (:class:`fastdata.loading.observe.measure.Probe`), as the monitor does.
:class:`ProbedCollate` (the ``collate_fn`` under the sweep) times the collate function, marks each epoch's
first batch in the stage table, flushes the producer's stage totals to it, and wraps each batch in a
:class:`Probed` envelope carrying its sample count and size. The envelope times its own unpickling (its
first pickled field is a call to ``perf_counter``, so the clock starts as the batch starts arriving) and
its pinning (the DataLoader's pin-memory thread calls its ``pin_memory``): how long the main process spends
receiving and pinning each batch, with no patching of torch. A training loop cannot wrap its batches so, so
the monitor estimates receiving from the loop thread's CPU inside ``next()`` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any

import numpy as np
import torch

from fastdata.core import stages
from fastdata.loading.observe.measure import batch_begin, batch_end, batch_samples


def _rebuild(started: float, started_cpu: float, n: int, nbytes: int, batch: Any) -> Probed:
    # arguments are unpickled in order: the two clock readings come before the batch
    probed = Probed(n, nbytes, batch)
    probed.unpickle_s = perf_counter() - started
    probed.unpickle_cpu = time.thread_time() - started_cpu
    return probed


class _Clock:
    """Pickles as a call to ``perf_counter``: unpickling it reads the clock."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (perf_counter, ())


class _CPUClock:
    """Pickles as a call to ``time.thread_time``: unpickling it reads the thread's CPU clock."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (time.thread_time, ())


class Probed:
    """A batch with its sample count and size, timing its own unpickling and pinning.

    Attributes:
        n (int): samples in the batch.
        nbytes (int): payload bytes (tensors, arrays, bytes, strings), estimated for big object lists.
        batch: what the ``collate_fn`` returned.
        unpickle_s, pin_s (float): seconds the main process spent rebuilding and pinning it. Rebuilding
            includes waiting for the worker to hand over each tensor's shared memory.
        unpickle_cpu (float): CPU-seconds of the rebuilding (the waiting left out).
    """

    __slots__ = ("batch", "n", "nbytes", "pin_s", "unpickle_cpu", "unpickle_s")

    def __init__(self, n: int, nbytes: int, batch: Any) -> None:
        self.n, self.nbytes, self.batch = n, nbytes, batch
        self.unpickle_s = self.unpickle_cpu = self.pin_s = 0.0

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (_Clock(), _CPUClock(), self.n, self.nbytes, self.batch))

    def pin_memory(self, device: Any = None) -> Probed:
        """Called by the DataLoader's pin-memory thread: pin the batch, timing it."""
        from torch.utils.data._utils.pin_memory import pin_memory

        start = perf_counter()
        self.batch = pin_memory(self.batch, device)
        self.pin_s = perf_counter() - start
        return self


def payload_bytes(obj: Any, budget: int = 4096) -> int:
    """Bytes of data in a batch: tensors, arrays, bytes and strings, looked into through containers.

    Visits at most ``budget`` leaves; a longer container is estimated from the leaves it had room for,
    so a batch of a million small objects costs as little to measure as one of a thousand.
    """
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray, memoryview, str)):
        return len(obj)
    if isinstance(obj, (int, float, bool)) or obj is None:
        return 8
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        if not obj:
            return 0
        seen = min(len(obj), budget)
        head = obj[:seen]
        kind = type(head[0])
        if kind in (str, bytes) and all(type(x) is kind for x in head):
            total = sum(map(len, head))  # keys, urls, raw members: the common case, counted fast
        elif kind in (int, float) and all(type(x) is kind for x in head):
            total = 8 * seen
        else:
            per = max(1, budget // len(obj))
            total = sum(payload_bytes(x, per) for x in head)
        return total * len(obj) // seen
    return 0


class ProbedCollate:
    """The DataLoader's ``collate_fn`` under probing: times the user's collate, wraps the batch in
    :class:`Probed`, and copies this process's stage totals to shared memory.

    Args:
        collate_fn (Callable): the user's collate function (or ``default_collate``/``default_convert``).
        batched (bool): the DataLoader batches (True), or the dataset yields batches (False).
        measure (bool): time stages and flush them (False: only count, for overhead comparisons).
    """

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool, measure: bool = True) -> None:
        self.collate_fn, self.batched, self.measure = collate_fn, batched, measure

    def __call__(self, data: Any) -> Probed:
        batch_begin()  # an epoch's first batch marks when it began and what was read before it
        start = stages.clock()
        out = self.collate_fn(data)
        n = len(data) if self.batched else batch_samples(out)
        if not self.measure:
            return Probed(n, 0, out)
        stages.lap("collate", start, n)
        batch_end(n)  # flushes the stage totals to shared memory
        return Probed(n, payload_bytes(out), out)


__all__ = ["Probed", "ProbedCollate", "payload_bytes"]
