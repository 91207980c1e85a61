"""The one probe of a loader: cumulative readings (:class:`Window`) whose differences are windows.

``fastdata bench`` measures each configuration through a :class:`Probe`, and so does the monitor and
``num_workers="auto"`` inside training, so both read the same figures the same way:

* **the training loop**, from the :class:`BatchCounter` its iteration feeds (batches, samples,
  the wait in ``next()`` and the loop thread's CPU there, the step, first waits);
* **the producers' stages and own counters**, from the shared-memory stage table
  (:class:`StageTable`) each worker (or the main process, without workers) writes into;
* **every thread of every process**, from ``/proc`` (:mod:`fastdata.core.system`): CPU, run-queue wait,
  context switches, block-I/O delay, bytes read, by thread name. A worker of a short pass exits between
  two readings: what it wrote into its row of the stage table still counts (the larger of the two is
  taken), and the workers of a new pass take over the rows (slots) of the last one's, so totals only grow;
* **the machine**, from ``/proc/stat`` over the CPUs we may use;
* **what the producers wait on**, from a background thread that looks at the loader's threads a few dozen
  times a second (:class:`fastdata.core.system.ThreadSampler`): each worker's (or loader thread's) state and
  system call, counted per kind of wait (computing, network, disk, lock, sleep, idle, other), and the looks
  that found a thread in D state.

A reading costs about a millisecond for a few processes (one small file per thread and a few per
process); with ``memory=True`` it also reads each process's PSS and USS (``smaps_rollup``, ~1 ms a
process) and its open descriptors. Call :meth:`Probe.read` from the thread that iterates the loader: the
loop thread's own CPU is read through ``RUSAGE_THREAD``.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import Any

import numpy as np
import torch

from fastdata.core.system import (
    ProcessCounters,
    ProcessProbe,
    machine_busy,
    memory_of,
    open_fds,
    procs_blocked,
    python_thread_names,
    thread_runq,
    usable_cores,
    usable_cpus,
    usable_memory,
)
from fastdata.core.system import ThreadSampler as Sampler
from fastdata.loading.observe.measure import _stage_table as stage_table
from fastdata.loading.observe.measure._counter import BatchCounter
from fastdata.loading.observe.measure._stage_table import StageTable
from fastdata.loading.observe.measure._window import Process, Window
from fastdata.loading.transport._layout import Stack

LOOK_EVERY = 0.04  # seconds between two looks at what the loader's threads are doing
LOADER_THREAD = "fastdata-loader"  # the name of thread mode's threads (fastdata.loading.threads._gang.ThreadGang)


class Probe:
    """The probes of one loader: the main process and up to ``rows - 1`` worker slots.

    Args:
        rows (int): rows of the stage table: 1 + the most workers the loader will run.
        counter (BatchCounter | None): the loop's counter. Defaults to a new one (:attr:`counter`).
        look_every (float): seconds between two looks at the loader's threads. Defaults to 0.04.
        loader_threads (bool): the batches are made by loader threads of this process (thread mode): those
            are the producers looked at. Defaults to False.

    Attributes:
        table (StageTable): where the producers write their stage totals and own counters.
        counter (BatchCounter): what the loop feeds, batch by batch.
        cores (int), memory (float): usable cores and bytes (affinity and cgroup limits respected).
        t0 (float): ``perf_counter()`` when the probe was made: readings' ``seconds`` count from it.
    """

    def __init__(
        self,
        rows: int,
        counter: BatchCounter | None = None,
        look_every: float = LOOK_EVERY,
        loader_threads: bool = False,
    ) -> None:
        self.table = StageTable(rows)
        self.counter = counter if counter is not None else BatchCounter(step_threads=not loader_threads)
        self.rows = rows
        self.cpus = usable_cpus()
        self.cores = usable_cores()
        self.memory = float(usable_memory())
        self.pid = os.getpid()
        self._sampler = Sampler(look_every)
        self.loader_threads = loader_threads
        self._main = ProcessProbe(self.pid, names=python_thread_names)
        self._slots: list[list[tuple[ProcessProbe, ProcessCounters]]] = []
        self.worker_pids: list[int] = []
        self.main_attached = False
        self.t0 = perf_counter()
        self._loop_tid = 0

    # -- what is watched ------------------------------------------------------------------------------

    def start(self) -> Probe:
        """Start the looks at the loader's threads (at the first pass, from the thread that iterates: a loader
        built and never iterated starts nothing)."""
        counter = self.counter
        self._sampler.watch_main(
            self.pid,
            threading.get_native_id(),
            lambda: counter.inside,
            _loader_threads if self.loader_threads else None,
            _queued,
        )
        self._sampler.start()
        return self

    def watch(self, pids: Sequence[int]) -> None:
        """The worker processes now running (a new pass's, when they do not persist): worker ``k`` takes
        slot ``k``, where its predecessors' counts stay."""
        pids = list(pids)[: self.rows - 1]
        if pids == self.worker_pids:
            return
        self.worker_pids = pids
        for k, pid in enumerate(pids):
            if k == len(self._slots):
                self._slots.append([])
            if not self._slots[k] or self._slots[k][-1][0].pid != pid:
                self._slots[k].append((ProcessProbe(pid), ProcessCounters()))
        self._sampler.watch(pids)

    def attach_main(self) -> None:
        """The main process makes the batches itself (no workers, or loader threads): it writes into row 0."""
        if not self.main_attached:
            self.table.attach(0)
            self.main_attached = True

    def detach_main(self) -> None:
        if self.main_attached:
            stage_table.detach()
            self.main_attached = False

    # -- readings -------------------------------------------------------------------------------------

    def read(self, *, memory: bool = False) -> Window:
        """Everything counted since the probe was made (a cumulative :class:`Window`); ``b.since(a)`` of
        two readings is the window between them. ``memory`` adds PSS, USS and open descriptors."""
        now = perf_counter()
        c = self.counter
        me = resource.getrusage(resource.RUSAGE_SELF)
        loop = resource.getrusage(resource.RUSAGE_THREAD)
        sampler = self._sampler
        self._main.skip = {sampler.native_id} if sampler.native_id else set()
        main = _process(self._main.read(), self.pid)
        main.looks = sampler.looked(self.pid)
        # getrusage counts exited threads too; the /proc sum only the living (and those it saw before)
        main.cpu_s = max(main.cpu_s, me.ru_utime + me.ru_stime - sampler.cpu)
        main.voluntary = max(main.voluntary, me.ru_nvcsw)
        main.involuntary = max(main.involuntary, me.ru_nivcsw)
        workers = self._workers()
        if memory:
            for p in [main, *workers]:
                if p.pid:
                    p.pss, p.uss = memory_of(p.pid)
                    p.fds = open_fds(p.pid)
                    if not p.pss:
                        p.pid = 0  # it exited while being read (a worker of a pass that ran out)
        busy, iowait = machine_busy(self.cpus)
        looks, blocked = sampler.counts()
        return Window(
            seconds=now - self.t0,
            loop_s=c.loop_s,
            batches=c.batches,
            samples=c.samples,
            nbytes=c.nbytes,
            wait_s=c.wait_s,
            wait_cpu_s=c.wait_cpu_s,
            step_s=c.step_s,
            step_cpu_s=c.step_cpu_s,
            step_others_s=c.step_others_s,
            first_wait_s=c.first_wait_s,
            starts=c.starts,
            end_wait_s=c.end_wait_s,
            ends=c.ends,
            recv_s=c.recv_s,
            recv_cpu_s=c.recv_cpu_s,
            pin_s=c.pin_s,
            loop_cpu_s=loop.ru_utime + loop.ru_stime,
            loop_runq_s=thread_runq(),
            probe_cpu_s=sampler.cpu,
            main=main,
            workers=workers,
            stages=self.table.totals(),
            machine_cpu_s=busy,
            machine_iowait_s=iowait,
            looks=looks,
            blocked_looks=blocked,
            procs_blocked=procs_blocked(),
        )

    def _workers(self) -> list[Process]:
        """Each slot's counts: its processes' /proc readings summed (an exited one keeps its last), or what
        they wrote into their row of the stage table, whichever is larger."""
        out = []
        current = set(self.worker_pids)
        for k, slot in enumerate(self._slots):
            total = Process()
            for i, (probe, last) in enumerate(slot):
                if probe.alive and probe.pid in current:
                    last = probe.read()
                    slot[i] = (probe, last)
                p = _process(last, probe.pid)
                p.looks = self._sampler.looked(probe.pid)
                _add(total, p)
            live = slot[-1][0]
            total.pid = live.pid if live.pid in current else 0
            own = self.table.counters(1 + k)
            total.cpu_s = max(total.cpu_s, own["cpu"])
            total.runq_s = max(total.runq_s, own["runq"])
            total.voluntary = max(total.voluntary, int(own["voluntary"]))
            total.involuntary = max(total.involuntary, int(own["involuntary"]))
            out.append(total)
        return out

    def close(self) -> None:
        """Stop the looks and stop probing the main process (idempotent)."""
        self._sampler.stop()
        self.detach_main()


def _process(c: ProcessCounters, pid: int) -> Process:
    return Process(
        cpu_s=c.cpu,
        runq_s=c.runq,
        voluntary=c.voluntary,
        involuntary=c.involuntary,
        blkio_s=c.blkio,
        read_bytes=c.read_bytes,
        rchar=c.rchar,
        by_thread=dict(c.by_thread),
        pid=pid,
        threads=c.threads,
        dstate=c.dstate,
    )


def _add(total: Process, p: Process) -> None:
    """Add ``p``'s amounts into ``total`` (one slot's processes one after the other); states are ``p``'s."""
    total.cpu_s += p.cpu_s
    total.runq_s += p.runq_s
    total.voluntary += p.voluntary
    total.involuntary += p.involuntary
    total.blkio_s += p.blkio_s
    total.read_bytes += p.read_bytes
    total.rchar += p.rchar
    for name, cpu in p.by_thread.items():
        total.by_thread[name] = total.by_thread.get(name, 0.0) + cpu
    for counted, n in p.looks.items():
        total.looks[counted] = total.looks.get(counted, 0) + n
    total.threads, total.dstate = p.threads, p.dstate


def _loader_threads() -> list[int]:
    """Native ids of this process's loader threads (thread mode's producers)."""
    return [t.native_id for t in threading.enumerate() if t.name.startswith(LOADER_THREAD) and t.native_id]


def _queued(tid: int) -> bool:
    """Thread ``tid`` of this process, blocked on a futex, waits on a queue (for work, or for room for what it
    made: fastdata's loader threads, whose modules carry the marker ``WAITS_ON_QUEUES``, or ``queue.Queue``), not
    on a lock: its innermost Python frames show it."""
    ident = next((t.ident for t in threading.enumerate() if t.native_id == tid), None)
    frame = sys._current_frames().get(ident) if ident is not None else None
    for _ in range(2):
        if frame is None:
            return False
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith("/queue.py") or frame.f_globals.get("WAITS_ON_QUEUES") is True:  # fastdata.loading.threads
            return True
        if not name.endswith("/threading.py"):
            return False
        frame = frame.f_back
    return False


def batch_samples(batch: Any) -> int:
    """Samples in a batch: the first tensor's length, or the list's (a collated ``(inputs, targets)`` pair
    counts its tensors' length)."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, Stack):  # sample tensors to be stacked into a slot (a dataset's batch in a worker)
        return len(batch.tensors)
    if isinstance(batch, Mapping):
        for value in batch.values():
            return batch_samples(value)
        return 1
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, Stack):
            return len(first.tensors)
        if isinstance(first, (torch.Tensor, np.ndarray)) and all(
            isinstance(x, type(first)) and x.ndim and x.shape[0] == first.shape[0] for x in batch
        ):
            return int(first.shape[0])
        return len(batch)
    return 1


def worker_pids(iterator: Any) -> list[int]:
    """The pids of a DataLoader iterator's worker processes (none for one without workers)."""
    # private, but stable since torch 1.0; without it no worker's /proc files are read
    workers = getattr(iterator, "_workers", None) or []
    return [p.pid for p in workers if getattr(p, "pid", None) is not None]


__all__ = ["LOADER_THREAD", "LOOK_EVERY", "Probe", "batch_samples", "worker_pids"]
