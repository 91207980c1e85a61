"""Probes: where the time goes inside the workers, in the main process, and on the machine.

Three sources, each read cheaply:

* **Stages in the producing processes** (fetch, decode, transform, collate): datasets time themselves
  with :mod:`fastdata.core.stages`; :class:`~fastdata.loading.observe._stage_table.ProbeInit` (the workers'
  ``worker_init_fn``) points each worker at its own row of a shared-memory
  :class:`~fastdata.loading.observe._stage_table.StageTable`, and :class:`ProbedCollate` times the ``collate_fn``, marks
  each epoch's first batch and copies the worker's totals to its row once per batch.
* **The main process, per batch**: :class:`ProbedCollate` wraps each batch in a :class:`Probed`
  envelope carrying its sample count and size. The envelope times its own unpickling (its first
  pickled field is a call to ``perf_counter``, so the clock starts as the batch starts arriving) and
  its pinning (the DataLoader's pin-memory thread calls its ``pin_memory``), so we know exactly how
  long the main process spends receiving and pinning each batch, with no patching of torch.
* **Processes and the machine, per window** (:class:`SystemProbe`, over
  :mod:`fastdata.core._proc`): every thread of every process: CPU and run-queue wait, voluntary and
  involuntary context switches, block-I/O delay, D state (sampled), bytes read from the device and from
  anywhere; the machine's CPU on the CPUs we may use; once per point, PSS and open descriptors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import Any

import numpy as np
import torch

from fastdata.core import stages
from fastdata.core._proc import (
    DStateSampler,
    ProcessCounters,
    ProcessProbe,
    machine_busy,
    open_fds,
    pss,
    python_thread_names,
    usable_cpus,
)
from fastdata.loading.observe import _stage_table as library
from fastdata.loading.observe._probe import batch_samples as leading_dim  # samples in a batch the dataset built
from fastdata.loading.observe._stage_table import ProbeInit, StageTable


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
        library.batch_begin()  # an epoch's first batch marks when it began and what was read before it
        start = stages.clock()
        out = self.collate_fn(data)
        n = len(data) if self.batched else leading_dim(out)
        if not self.measure:
            return Probed(n, 0, out)
        stages.lap("collate", start, n)
        library.batch_end(n)  # flushes the stage totals to shared memory
        return Probed(n, payload_bytes(out), out)


class SystemProbe:
    """Reads the counters of the main process, its workers and the machine (the CPUs we may use), every
    thread of every process (see :mod:`fastdata.core._proc`).

    Workers replaced at an epoch's start (not persistent) are added with :meth:`set_workers`; the ones
    they replace keep their last readings, so every total only grows and a window that holds a restart
    counts both generations.

    Args:
        workers (Sequence[int]): the worker processes' pids.
        sampler (DStateSampler | None): the looks at our threads' states.
        table (StageTable | None): where the workers write their own CPU, run-queue wait and switches
            (row 1 + k for worker k): a worker of a short epoch exits between two readings of its /proc
            files, and what it wrote there still counts.
    """

    def __init__(
        self, workers: Sequence[int] = (), sampler: DStateSampler | None = None, table: StageTable | None = None
    ) -> None:
        self.table = table
        self.pid = os.getpid()
        self._main_tid = threading.get_native_id()
        self.main = ProcessProbe(self.pid, names=python_thread_names)
        self.sampler = sampler
        self.slots: list[list[tuple[ProcessProbe, ProcessCounters]]] = []
        self.worker_pids: list[int] = []
        self.cpus = usable_cpus()
        self.set_workers(workers)

    def set_workers(self, pids: Sequence[int]) -> None:
        """The workers now running (a new epoch's, when they do not persist)."""
        if list(pids) == self.worker_pids:
            return
        self.worker_pids = list(pids)
        for k, pid in enumerate(pids):
            if k == len(self.slots):
                self.slots.append([])
            self.slots[k].append((ProcessProbe(pid), ProcessCounters()))
        if self.sampler is not None:
            self.sampler.watch([self.pid, *self.worker_pids])

    @property
    def workers(self) -> list[int]:
        return self.worker_pids

    def _workers(self) -> list[list[ProcessCounters]]:
        out = []
        for slot in self.slots:
            readings = []
            for i, (probe, last) in enumerate(slot):
                if probe.alive:
                    last = probe.read()
                    slot[i] = (probe, last)
                readings.append(last)
            out.append(readings)
        return out

    def read(self) -> dict[str, Any]:
        """A snapshot of cumulative counters (differences of two snapshots give a window)."""
        main = self.main.read()
        me = self.main.thread(self._main_tid)
        slots = self._workers()
        every = [c for slot in slots for c in slot]
        current = [slot[-1] for slot in slots]
        machine, iowait = machine_busy(self.cpus)
        looks, blocked = self.sampler.counts() if self.sampler is not None else (0, 0)
        helpers = dict(main.by_thread)
        if me is not None:  # the main thread's name is the process's: take its own CPU out
            helpers[me.name] = helpers.get(me.name, 0.0) - me.cpu
        worker_threads: dict[str, float] = {}
        for c in every:
            for k, v in c.by_thread.items():
                worker_threads[k] = worker_threads.get(k, 0.0) + v
        cpu = [sum(c.cpu for c in slot) for slot in slots]
        busy = [sum(c.cpu + c.runq for c in slot) for slot in slots]
        vol = sum(c.voluntary for c in every)
        invol = sum(c.involuntary for c in every)
        if self.table is not None:  # what each worker wrote itself, where /proc saw less
            own = [self.table.counters(1 + k) for k in range(len(slots))]
            cpu = [max(a, o["cpu"]) for a, o in zip(cpu, own)]
            busy = [max(a, o["cpu"] + o["runq"]) for a, o in zip(busy, own)]
            vol = max(vol, int(sum(o["voluntary"] for o in own)))
            invol = max(invol, int(sum(o["involuntary"] for o in own)))
        return {
            "main_cpu": time.thread_time(),
            "main_runq": me.runq if me is not None else 0.0,
            "threads_cpu": main.cpu - (me.cpu if me is not None else 0.0),
            "threads_runq": main.runq - (me.runq if me is not None else 0.0),
            "main_threads": helpers,
            "workers_cpu": cpu,
            "workers_busy": busy,
            "worker_threads": worker_threads,
            "voluntary": main.voluntary + vol,
            "involuntary": main.involuntary + invol,
            "blkio": main.blkio + sum(c.blkio for c in every),
            "read_bytes": main.read_bytes + sum(c.read_bytes for c in every),
            "rchar": main.rchar + sum(c.rchar for c in every),
            "threads_main": main.threads,
            "threads_worker": max((c.threads for c in current), default=0),
            "machine_busy": machine,
            "machine_iowait": iowait,
            "procs_blocked": procs_blocked(),
            "dstate": main.dstate + sum(c.dstate for c in current),
            "dstate_looks": looks,
            "dstate_blocked": blocked,
        }

    def memory(self) -> tuple[float, list[float]]:
        """PSS of the main process and of each worker, in bytes (0 where it cannot be read)."""
        return pss(self.pid), [pss(pid) for pid in self.worker_pids]

    def descriptors(self) -> int:
        """Open descriptors, summed over the main process and workers."""
        return sum(open_fds(pid) for pid in [self.pid, *self.worker_pids])


def procs_blocked() -> int:
    """Processes of the machine in uninterruptible sleep now (``procs_blocked`` of ``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_blocked"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def delay_accounting() -> bool:
    """Whether the kernel's per-task delay accounting (block-I/O delay) is on."""
    try:
        with open("/proc/sys/kernel/task_delayacct") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


__all__ = [
    "DStateSampler",
    "ProbeInit",
    "Probed",
    "ProbedCollate",
    "StageTable",
    "SystemProbe",
    "delay_accounting",
    "leading_dim",
    "payload_bytes",
    "procs_blocked",
]
