"""Probes: where the time goes inside the workers, in the main process, and on the machine.

Three sources, each read cheaply:

* **Stages in the producing processes** (fetch, decode, transform, collate): datasets time themselves
  with :mod:`fastdata.core.stages`; :class:`ProbeInit` (the workers' ``worker_init_fn``) points each
  worker at its own row of a shared-memory :class:`StageTable`, and :class:`ProbedCollate` times the
  ``collate_fn`` and copies the worker's totals to its row once per batch.
* **The main process, per batch**: :class:`ProbedCollate` wraps each batch in a :class:`Probed`
  envelope carrying its sample count and size. The envelope times its own unpickling (its first
  pickled field is a call to ``perf_counter``, so the clock starts as the batch starts arriving) and
  its pinning (the DataLoader's pin-memory thread calls its ``pin_memory``), so we know exactly how
  long the main process spends receiving and pinning each batch, with no patching of torch.
* **Processes and the machine, per window** (:class:`SystemProbe`): CPU per process from psutil, the
  main thread's run-queue wait from ``/proc/thread-self/schedstat``, the machine's CPU and iowait,
  processes in uninterruptible sleep; once per point, PSS (from ``smaps_rollup``), open descriptors
  and context switches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import Any

import numpy as np
import psutil
import torch

from fastdata.core import stages
from fastdata.core.stages import STAGES


class StageTable:
    """A shared-memory table of stage totals: one row per process (0: main, 1 + k: worker k).

    Pickled into ``spawn`` workers by the DataLoader, the tensor travels as shared memory.

    Args:
        slots (int): rows; the main process and each worker need one.
    """

    def __init__(self, slots: int) -> None:
        self.tensor = torch.zeros((slots, 2 * len(STAGES)), dtype=torch.float64).share_memory_()

    def attach(self, slot: int) -> None:
        """Probe the calling process, flushing into row ``slot`` (counting on from what it holds: the
        workers of a new epoch take over the rows of the last epoch's)."""
        row = self.tensor.numpy()[slot]
        stages.enable(row, start=row.tolist())

    def totals(self) -> dict[str, tuple[float, float]]:
        """``{stage: (seconds, items)}`` summed over every process."""
        sums = self.tensor.numpy().sum(axis=0)
        return {name: (float(sums[2 * i]), float(sums[2 * i + 1])) for i, name in enumerate(STAGES)}


class ProbeInit:
    """``worker_init_fn`` that turns the stage probe on in each worker, then runs the user's own.

    Args:
        table (StageTable): where the workers' totals go.
        then (Callable[[int], object] | None): the user's ``worker_init_fn``.
    """

    def __init__(self, table: StageTable, then: Callable[[int], object] | None = None) -> None:
        self.table, self.then = table, then

    def __call__(self, worker_id: int) -> None:
        self.table.attach(1 + worker_id)
        if self.then is not None:
            self.then(worker_id)


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


def leading_dim(batch: Any) -> int:
    """Samples in a batch the dataset built itself: the first tensor's length, or the list's."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            return leading_dim(value)
        return 1
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (torch.Tensor, np.ndarray)) and all(
            isinstance(x, type(first)) and x.ndim and x.shape[0] == first.shape[0] for x in batch
        ):
            return int(first.shape[0])  # a collated (inputs, targets) pair
        return len(batch)
    return 1


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
        start = stages.clock()
        out = self.collate_fn(data)
        n = len(data) if self.batched else leading_dim(out)
        if not self.measure:
            return Probed(n, 0, out)
        stages.lap("collate", start, n)
        stages.flush()
        return Probed(n, payload_bytes(out), out)


def _schedstat(path: str) -> tuple[float, float]:
    """(seconds on CPU, seconds runnable but waiting for a CPU) of one thread, or zeros."""
    try:
        with open(path) as f:
            on, wait, _ = f.read().split()
        return int(on) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def _tasks_busy(pid: int, seen: dict[int, float]) -> float:
    """Seconds every thread of process ``pid`` has been running or runnable, since each started.

    ``/proc/PID/schedstat`` counts the process's main thread only, and a worker may compute in other
    threads (a watchdog's decode thread, a pool of fetch threads) while its main thread waits on them.
    ``seen`` (per process, kept by the caller) remembers each thread's last reading, so that a thread that
    has exited still counts and the total never goes down.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []  # it exited: keep its last readings
    for tid in tids:
        on, runq = _schedstat(f"/proc/{pid}/task/{tid}/schedstat")
        if on:
            seen[int(tid)] = on + runq
    return sum(seen.values())


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


class SystemProbe:
    """Reads the counters of the main process, its workers and the machine (the CPUs we may use).

    Args:
        workers (Sequence[int]): the worker processes' pids.
    """

    def __init__(self, workers: Sequence[int] = ()) -> None:
        self.main = psutil.Process()
        self.workers: list[psutil.Process] = []
        for pid in workers:
            try:
                self.workers.append(psutil.Process(pid))
            except psutil.Error:
                continue
        self._workers_cpu = [0.0] * len(self.workers)
        self._workers_busy = [0.0] * len(self.workers)
        self._worker_threads: list[dict[int, float]] = [{} for _ in self.workers]
        self._thread = f"/proc/{os.getpid()}/task/{threading_native_id()}/schedstat"
        self._main_tid = threading_native_id()
        # the machine's CPUs that we may run on: other CPUs' load is not ours to share
        try:
            self.cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpus = list(range(psutil.cpu_count() or 1))

    def read(self) -> dict[str, Any]:
        """A snapshot of cumulative counters (differences of two snapshots give a window)."""
        on, runq = _schedstat(self._thread)
        threads_cpu = 0.0
        try:
            for t in self.main.threads():
                if t.id != self._main_tid:
                    threads_cpu += t.user_time + t.system_time
        except psutil.Error:
            pass
        dstate = 0
        for i, proc in enumerate(self.workers):
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    self._workers_cpu[i] = times.user + times.system
                    dstate += proc.status() == psutil.STATUS_DISK_SLEEP
            except psutil.Error:
                continue  # it exited (end of an epoch): keep its last readings
            busy = _tasks_busy(proc.pid, self._worker_threads[i])
            if busy:
                self._workers_busy[i] = busy
        busy = iowait = 0.0
        per_cpu = psutil.cpu_times(percpu=True)
        for cpu in self.cpus:
            if cpu < len(per_cpu):
                t = per_cpu[cpu]
                # guest time is already counted in user time
                busy += (
                    sum(t)
                    - t.idle
                    - getattr(t, "iowait", 0.0)
                    - getattr(t, "guest", 0.0)
                    - getattr(t, "guest_nice", 0.0)
                )
                iowait += getattr(t, "iowait", 0.0)
        return {
            "main_cpu": time.thread_time(),
            "main_runq": runq if on else 0.0,
            "threads_cpu": threads_cpu,
            "workers_cpu": list(self._workers_cpu),
            "workers_busy": list(self._workers_busy),
            "machine_busy": busy,
            "machine_iowait": iowait,
            "procs_blocked": procs_blocked(),
            "dstate": dstate,
        }

    def memory(self) -> tuple[float, list[float]]:
        """PSS of the main process and of each worker, in bytes (0 where it cannot be read)."""

        def pss(proc: psutil.Process) -> float:
            try:
                return float(getattr(proc.memory_full_info(), "pss", 0.0))
            except psutil.Error:
                return 0.0

        return pss(self.main), [pss(w) for w in self.workers]

    def descriptors_and_switches(self) -> tuple[int, int]:
        """Open descriptors and context switches so far, summed over the main process and workers."""
        fds = switches = 0
        for proc in [self.main, *self.workers]:
            try:
                with proc.oneshot():
                    fds += proc.num_fds()
                    ctx = proc.num_ctx_switches()
                    switches += ctx.voluntary + ctx.involuntary
            except psutil.Error:
                continue
        return fds, switches


def threading_native_id() -> int:
    import threading

    return threading.get_native_id()


__all__ = [
    "ProbeInit",
    "Probed",
    "ProbedCollate",
    "StageTable",
    "SystemProbe",
    "leading_dim",
    "payload_bytes",
    "procs_blocked",
]
