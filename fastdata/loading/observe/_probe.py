"""Probes of a loader while a model trains: cumulative snapshots, and the figures of the window between two.

The monitor (``_monitor``) and the autotuner (``_autotune``) read a loader through :class:`LiveProbe`,
built on the same probes as ``fastdata bench``:

* **the training loop**, counted by the hook around the batch iteration (:class:`LoopCounters`): batches
  and samples handed out, the time spent waiting in ``next()`` and the main thread's CPU in it (rebuilding
  and unpickling batches), the time between batches (the step), the waits for each pass's first batch;
* **the workers**, from the shared-memory stage table each of them writes into
  (:class:`~fastdata.loading.observe._stage_table.StageTable`, attached by its ``worker_init_fn``): stage totals
  (fetch, decode, transform, collate) and the process's own CPU, run-queue wait and context switches;
* **the main process**, from ``getrusage`` (every thread, exited ones too) and ``/proc/self/task``;
* **the machine**, from ``/proc/stat`` over the CPUs we may use: cores busy, so cores used by others;
* **D state**, from a background thread that looks at the loader's threads five times a second.

A snapshot is cheap (shared memory, ``getrusage``, one small file per main-process thread and
``/proc/stat``: about 0.2 ms here), so the autotuner takes one a second. :meth:`LiveProbe.details` reads
what costs more (every thread's ``/proc`` files, PSS from ``smaps_rollup``, open descriptors: a few ms),
for the monitor's reports.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np
import torch

from fastdata.core._machine import usable_cores, usable_memory
from fastdata.core._proc import (
    DStateSampler,
    ProcessCounters,
    ProcessProbe,
    _read,
    machine_busy,
    open_fds,
    python_thread_names,
    usable_cpus,
)
from fastdata.core.stages import STAGES
from fastdata.loading.observe._diagnosis import Evidence
from fastdata.loading.observe._stage_table import StageTable, StartSplit
from fastdata.loading.transport._layout import Stack

STEP_SHARE = 0.1  # the loop spends this share of its time outside next(): it runs a training step
LOOK_EVERY = 0.2  # seconds between two looks for threads in D state


@dataclass
class LoopCounters:
    """What the hook around the batch iteration counts, cumulative. Times in seconds.

    Attributes:
        batches, samples (int): handed out to the training loop.
        wait (float): spent in ``next()``, waiting for the next batch (and rebuilding it).
        wait_cpu (float): CPU of the main thread inside ``next()``.
        loop (float): from the start of each pass to its last batch: waits and steps (the time between
            passes, validation or checkpoints, is not the loader's).
        first_wait (float): waiting for each pass's first batch and after each restart (start-ups).
        starts (int): pass starts and restarts.
    """

    batches: int = 0
    samples: int = 0
    wait: float = 0.0
    wait_cpu: float = 0.0
    loop: float = 0.0
    first_wait: float = 0.0
    starts: int = 0

    def copy(self) -> LoopCounters:
        return dataclasses.replace(self)


@dataclass
class Snapshot:
    """Cumulative counters at one moment (see :class:`LiveProbe`). Times are seconds of CPU or wall."""

    t: float
    loop: LoopCounters
    stages: dict[str, tuple[float, float]]
    workers: list[dict[str, float]]  # per active worker: cpu, runq, voluntary, involuntary (its own writes)
    main_cpu: float  # every thread of the main process
    loop_cpu: float  # the training loop's thread
    probe_cpu: float  # the monitor's own D-state thread
    loop_runq: float  # the training loop's thread, waiting for a core
    voluntary: int
    involuntary: int
    machine: float  # CPU-seconds busy on the usable CPUs
    looks: int
    blocked: int


@dataclass
class ProcessDetail:
    """One process of the loader, read at a report: every thread of it.

    Attributes:
        role (str): "main" or "worker K" (K: its index, its row ``1 + K`` in the stage table).
        pid (int): its id.
        threads (int): threads alive. dstate (int): threads in D state at the reading.
        pss (float): proportional set size, bytes (shared pages divided among the processes sharing them).
        uss (float): unique set size, bytes: the pages no other process shares, what the process adds.
        fds (int): open file descriptors.
        counters (ProcessCounters): cumulative CPU, run-queue wait, switches, I/O, by thread name.
    """

    role: str
    pid: int
    threads: int
    dstate: int
    pss: float
    uss: float
    fds: int
    counters: ProcessCounters


@dataclass
class Figures:
    """What a loader did over a window between two snapshots. Shares are of the window's time; cores are
    CPU-seconds per second.

    Attributes:
        seconds (float): the window's length. loop (float): of it, inside passes.
        batches, samples (int): handed out. rate (float): samples per second of the loop.
        stall (float): share of the loop's time waiting in ``next()``. step (bool): the loop runs a step.
        wait_ms, step_ms (float): per batch, waiting for it and between it and the next request.
        main_loader (float): the main thread's CPU inside ``next()``, and its wait for a core there (its
            run-queue wait, shared out by the time in ``next()``), as a share of the loop.
        main_helpers (float): cores used by the main process's other threads (pin memory, decoders),
            the monitor's own left out. main_cores (float): cores used by every thread of the main process.
        worker_cores, worker_busy (list[float]): per active worker: cores used, and running or waiting
            for a core. voluntary, involuntary (int): context switches of the main process and workers.
        stage_ms (dict[str, float | None]): ms per sample in each stage, None where nothing was timed.
        stage_busy (dict[str, float | None]): share of the producers' time in each stage.
        machine (float): cores busy on the usable CPUs. others (float): of them, not ours.
        dstate (float): share of looks that found a loader thread in D state.
        first_wait (float): share of the loop spent waiting for first batches (start-ups).
    """

    seconds: float
    loop: float
    batches: int
    samples: int
    rate: float
    stall: float
    step: bool
    wait_ms: float
    step_ms: float
    main_loader: float
    main_helpers: float
    main_cores: float
    worker_cores: list[float] = field(default_factory=list)
    worker_busy: list[float] = field(default_factory=list)
    voluntary: int = 0
    involuntary: int = 0
    stage_ms: dict[str, float | None] = field(default_factory=dict)
    stage_busy: dict[str, float | None] = field(default_factory=dict)
    machine: float = 0.0
    others: float = 0.0
    dstate: float = 0.0
    first_wait: float = 0.0

    @property
    def per_worker_busy(self) -> float:
        return sum(self.worker_busy) / len(self.worker_busy) if self.worker_busy else 0.0

    def data_ms(self, batch: float) -> float | None:
        """ms of producer time one batch of ``batch`` samples needs, from the stage times (None: unknown)."""
        known = [v for s, v in self.stage_ms.items() if v is not None and s != "collate"]
        if not known:
            return None
        return (sum(known) + (self.stage_ms.get("collate") or 0.0)) * batch


class _Sampler(DStateSampler):
    """The D-state looks, counting the CPU the looking thread itself uses (the monitor's own cost, which is
    not the loader's)."""

    def __init__(self, interval: float) -> None:
        super().__init__((), interval)
        self.cpu = 0.0
        self.native_id: int | None = None

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        start = time.thread_time()
        while not self._stop.wait(self.interval):
            blocked = self._look()
            self.looks += 1
            self.blocked += blocked
            self.cpu = time.thread_time() - start


class LiveProbe:
    """The probes of one loader (main process and up to ``rows - 1`` workers).

    Args:
        rows (int): rows of the stage table: 1 + the most workers the loader will run.
    """

    def __init__(self, rows: int) -> None:
        self.table = StageTable(rows)
        self.rows = rows
        self.cpus = usable_cpus()
        self.cores = usable_cores()
        self.memory = float(usable_memory())
        self.pid = os.getpid()
        self._sampler = _Sampler(LOOK_EVERY)
        self._main = ProcessProbe(self.pid, names=python_thread_names)
        self._workers: dict[int, ProcessProbe] = {}
        self.main_attached = False

    def start(self) -> None:
        """Start the D-state looks (on the first batch: a loader built and never iterated starts nothing)."""
        self._sampler.start()

    def watch(self, pids: list[int]) -> None:
        """The worker processes now running."""
        self._sampler.watch([self.pid, *pids])

    def attach_main(self) -> None:
        """The main process makes the batches itself (no workers): it writes into row 0."""
        self.table.attach(0)
        self.main_attached = True

    def detach_main(self) -> None:
        if self.main_attached:
            from fastdata.loading.observe import _stage_table as stage_table

            stage_table.detach()
            self.main_attached = False

    def snapshot(self, loop: LoopCounters, workers: int) -> Snapshot:
        """Cumulative counters now, with ``workers`` workers running (rows 1 .. workers)."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        thread = resource.getrusage(resource.RUSAGE_THREAD)
        looks, blocked = self._sampler.counts()
        return Snapshot(
            t=perf_counter(),
            loop=loop.copy(),
            stages=self.table.totals(),
            workers=[self.table.counters(1 + k) for k in range(min(workers, self.rows - 1))],
            main_cpu=me.ru_utime + me.ru_stime,
            loop_cpu=thread.ru_utime + thread.ru_stime,
            probe_cpu=self._sampler.cpu,
            loop_runq=_thread_runq(),
            voluntary=me.ru_nvcsw,
            involuntary=me.ru_nivcsw,
            machine=machine_busy(self.cpus)[0],
            looks=looks,
            blocked=blocked,
        )

    def details(self, pids: list[int]) -> list[ProcessDetail]:
        """Every thread of the main process and of the workers ``pids`` still running (a worker of a pass
        that ran out may have exited), with PSS and descriptors."""
        out = []
        self._main.skip = {self._sampler.native_id} if self._sampler.native_id else set()
        for k, pid in [(-1, self.pid), *enumerate(pids)]:
            probe = self._main if k < 0 else self._worker_probe(pid)
            c = probe.read()
            fds = open_fds(pid)
            p, u = memory_of(pid)
            if not (c.threads and p):
                continue  # it exited while being read
            out.append(ProcessDetail("main" if k < 0 else f"worker {k}", pid, c.threads, c.dstate, p, u, fds, c))
        live = set(pids)
        self._workers = {p: w for p, w in self._workers.items() if p in live}
        return out

    def _worker_probe(self, pid: int) -> ProcessProbe:
        if pid not in self._workers:
            self._workers[pid] = ProcessProbe(pid)
        return self._workers[pid]

    def close(self) -> None:
        self._sampler.stop()
        self.detach_main()


def memory_of(pid: int) -> tuple[float, float]:
    """(PSS, USS) of process ``pid`` in bytes, from one read of ``/proc/PID/smaps_rollup`` (zeros where it
    cannot be read)."""
    text = _read(f"/proc/{pid}/smaps_rollup") or ""
    pss_kb = uss_kb = 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            pss_kb = int(line.split()[1])
        elif line.startswith(("Private_Clean:", "Private_Dirty:")):
            uss_kb += int(line.split()[1])
    return pss_kb * 1024.0, uss_kb * 1024.0


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


def _thread_runq() -> float:
    """Seconds the calling thread waited for a core (``/proc/thread-self/schedstat``)."""
    parts = (_read("/proc/thread-self/schedstat") or "").split()
    return int(parts[1]) / 1e9 if len(parts) > 1 else 0.0


def figures(a: Snapshot, b: Snapshot) -> Figures:
    """The window from snapshot ``a`` to ``b`` (workers: those of ``b``; a worker new since ``a`` counts from
    what its row held, which its predecessor wrote)."""
    seconds = max(1e-9, b.t - a.t)
    la, lb = a.loop, b.loop
    batches, samples = lb.batches - la.batches, lb.samples - la.samples
    loop = max(1e-9, lb.loop - la.loop)
    wait = lb.wait - la.wait
    step_time = max(0.0, loop - wait)
    workers = len(b.workers)
    worker_cores, worker_busy = [], []
    vol = b.voluntary - a.voluntary
    invol = b.involuntary - a.involuntary
    for k, w in enumerate(b.workers):
        before = a.workers[k] if k < len(a.workers) else {"cpu": 0.0, "runq": 0.0, "voluntary": 0, "involuntary": 0}
        cpu = max(0.0, w["cpu"] - before["cpu"])
        worker_cores.append(cpu / seconds)
        worker_busy.append((cpu + max(0.0, w["runq"] - before["runq"])) / seconds)
        vol += int(max(0.0, w["voluntary"] - before["voluntary"]))
        invol += int(max(0.0, w["involuntary"] - before["involuntary"]))
    producers = max(1, workers)
    stage_ms: dict[str, float | None] = {}
    stage_busy: dict[str, float | None] = {}
    for s in STAGES:
        secs = b.stages[s][0] - a.stages[s][0]
        items = b.stages[s][1] - a.stages[s][1]
        stage_ms[s] = 1000 * secs / items if items > 0 else None
        stage_busy[s] = secs / (seconds * producers) if items > 0 else None
    main_cpu = max(0.0, b.main_cpu - a.main_cpu)
    helpers = max(0.0, main_cpu - (b.loop_cpu - a.loop_cpu) - (b.probe_cpu - a.probe_cpu))
    ours = main_cpu + sum(worker_cores) * seconds
    machine = max(0.0, b.machine - a.machine) / seconds
    looks = b.looks - a.looks
    return Figures(
        seconds=seconds,
        loop=loop,
        batches=batches,
        samples=samples,
        rate=samples / loop if batches else 0.0,
        stall=wait / loop if batches else 0.0,
        step=step_time >= STEP_SHARE * loop,
        wait_ms=1000 * wait / batches if batches else 0.0,
        # the time after a batch until the next is asked for: a pass's first batch has none before it
        step_ms=1000 * step_time / max(1, batches - (lb.starts - la.starts)) if batches else 0.0,
        main_loader=(lb.wait_cpu - la.wait_cpu + max(0.0, b.loop_runq - a.loop_runq) * wait / loop) / loop,
        main_helpers=helpers / seconds,
        main_cores=main_cpu / seconds,
        worker_cores=worker_cores,
        worker_busy=worker_busy,
        voluntary=vol,
        involuntary=invol,
        stage_ms=stage_ms,
        stage_busy=stage_busy,
        machine=machine,
        others=max(0.0, machine - ours / seconds),
        dstate=(b.blocked - a.blocked) / looks if looks > 0 else 0.0,
        first_wait=(lb.first_wait - la.first_wait) / loop,
    )


def evidence(
    fig: Figures,
    *,
    workers: int,
    cores: int,
    memory: float | None = None,
    pss: float = 0.0,
    start: StartSplit | None = None,
    start_method: str = "fork",
    details: list[ProcessDetail] | None = None,
    before: dict[int, ProcessCounters] | None = None,
) -> Evidence:
    """The figures the label rules (:func:`fastdata.loading.observe._diagnosis.classify`) read, from a live window.

    Without ``details`` (and the counters of the same processes at the window's start, ``before``), what only
    the per-thread ``/proc`` files tell (thread names, block-I/O delay, bytes read) is left out.
    """
    ev = Evidence(
        workers=workers,
        cores=cores,
        step=fig.step,
        stall=fig.stall if fig.step else None,
        main_busy=min(1.0, fig.main_loader),
        main_process_busy=min(1.0, fig.main_loader) + fig.main_helpers,
        main_cores=fig.main_loader + fig.main_helpers,
        recv=fig.main_loader if workers else 0.0,
        recv_cpu=fig.main_loader if workers else 0.0,
        worker_busy=list(fig.worker_busy),
        worker_cores=list(fig.worker_cores),
        stage_busy=dict(fig.stage_busy),
        stage_ms=dict(fig.stage_ms),
        dstate=fig.dstate,
        epoch_start=fig.first_wait,
        start=start,
        pss=pss,
        memory=memory,
        start_method=start_method,
        others=fig.others,
    )
    if details and before is not None:
        blkio = read_bytes = rchar = 0.0
        for d in details:
            was = before.get(d.pid)
            if was is None:
                continue
            win = d.counters.minus(was)
            blkio += win.blkio
            read_bytes += win.read_bytes
            rchar += win.rchar
            names = win.by_thread if d.role != "main" else {}
            for name, cpu in names.items():
                ev.worker_threads[name] = ev.worker_threads.get(name, 0.0) + cpu / fig.seconds
        main = details[0]
        if main.pid in before:
            for name, cpu in main.counters.minus(before[main.pid]).by_thread.items():
                if name != "MainThread":
                    ev.main_threads[name] = cpu / fig.seconds
        ev.blkio = blkio / (fig.seconds * max(1, workers))
        ev.device_mb_s = read_bytes / fig.seconds / 1e6
        ev.read_mb_s = rchar / fig.seconds / 1e6
        ev.parent_rss = 0.0
    return ev


def delay_accounting() -> bool:
    """Whether the kernel's per-task delay accounting (block-I/O delay) is on."""
    return (_read("/proc/sys/kernel/task_delayacct") or "").strip() == "1"


def worker_pids(iterator: Any) -> list[int]:
    """The pids of a DataLoader iterator's worker processes (none for one without workers)."""
    # private, but stable since torch 1.0 (the harness reads it too); without it no worker PSS is reported
    workers = getattr(iterator, "_workers", None) or []
    return [p.pid for p in workers if getattr(p, "pid", None) is not None]


__all__ = [
    "Figures",
    "LiveProbe",
    "LoopCounters",
    "ProcessDetail",
    "Snapshot",
    "batch_samples",
    "delay_accounting",
    "evidence",
    "figures",
    "memory_of",
    "worker_pids",
]
