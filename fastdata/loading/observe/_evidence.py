"""The evidence the label rules read (:class:`Evidence`), built from one window by one function
(:func:`evidence`), for a sweep's point and a monitor's window alike.

A :class:`~._window.Window` holds what was counted; :class:`Context` what the window cannot know (the
usable cores and memory, the start method, how an epoch's first wait split, whether the kernel's delay
accounting is on). The figures are the window's own properties, so the same window gives the same evidence
wherever it was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from fastdata.loading.observe._stage_table import StartSplit
from fastdata.loading.observe._window import Window


@dataclass(frozen=True)
class Context:
    """What the rules need beside a window.

    Attributes:
        cores (int): usable cores.
        threads (int): loader threads of the main process that make the batches (thread mode); 0 otherwise.
        memory (float | None): bytes the loader may use (None: unknown).
        start (StartSplit | None): how an epoch's first-batch wait split (median over those seen).
        start_method (str): fork, spawn or forkserver.
        parent_rss (float): the main process's resident memory when the workers started, bytes.
        blkio_known (bool): the kernel's delay accounting is on (else block-I/O delay reads 0 regardless).
        epoch_start (float | None): share of the time spent waiting for epochs' first batches, where the
            caller knows better than the window (a sweep that saw no epoch end predicts it). Defaults to
            None: the window's own.
        stage_totals (Mapping | None): per stage (seconds, items) over a longer run, for the time per sample
            of datasets that do a stage's work outside every window. Defaults to None.
        where ("bench" | "training"): who reads the verdict: ``fastdata bench`` (its advice may name its own
            options, ``--step-ms``, ``--profile``), or the monitor inside training (it may not). Defaults to
            "bench".
        auto (bool): ``num_workers="auto"`` moves the worker count (the advice then leaves it to it).
            Defaults to False.
    """

    cores: int
    threads: int = 0
    memory: float | None = None
    start: StartSplit | None = None
    start_method: str = "fork"
    parent_rss: float = 0.0
    blkio_known: bool = False
    epoch_start: float | None = None
    stage_totals: Mapping[str, tuple[float, float]] | None = None
    where: Literal["bench", "training"] = "bench"
    auto: bool = False


@dataclass
class Evidence:
    """What one loader configuration did over a window. Fractions are of wall time; "cores" are
    CPU-seconds per second.

    Attributes:
        workers (int): worker processes (0: the main process makes the batches).
        threads (int): loader threads of the main process that make the batches (thread mode,
            ``fd.Loader(..., workers="threads")``); 0 otherwise. Their CPU is read per thread from
            ``/proc/self/task`` and counted in the main process's figures (``main_process_busy``,
            ``main_cores``, ``main_threads``); there is no worker-process evidence for them.
        cores (int): usable cores.
        step (bool): a training step ran between batches.
        stall (float | None): with a step, the share of the loop's time spent waiting for data.
        main_busy (float): the main thread running or runnable for the loader (inside ``next()``), as a share of
            the loop's time (the step is not the loader's).
        main_process_busy (float): every thread of the main process running or runnable for the loader, in
            cores (a decoder's helper thread counts here), never more than the usable cores.
        main_producing (float): without workers, the main process's threads running or runnable as a share of
            the time the step left to make batches in (past 1 with helper threads).
        data_wait (float): share of the loop's time inside ``next()`` not computing: waiting for producers.
        main_threads (dict[str, float]): cores used by the main process's threads other than the main
            one, by name (``fastdata-decode``, ``pin_memory`` ...).
        main_cores (float): cores the main process's threads used (CPU only, no run-queue wait), step left out.
        recv, recv_cpu, pin (float): the main process rebuilding received batches (wall, CPU), pinning.
        worker_busy (list[float]): per worker, its threads running or runnable, summed.
        worker_cores (list[float]): per worker, cores used by all its threads.
        worker_threads (dict[str, float]): cores used by the workers' threads, by name, summed over workers.
        stage_busy (dict[str, float | None]): share of the producers' time in each stage.
        stage_ms (dict[str, float | None]): milliseconds per sample in each stage.
        blkio (float): block-I/O delay of all the loader's threads, per producer, as a share of time.
        blkio_known (bool): the kernel's delay accounting is on (else ``blkio`` is 0 regardless).
        dstate (float): share of looks that found one of the loader's threads in D state.
        device_mb_s, read_mb_s (float): MB/s read from the storage device, and read through any call.
        epoch_start (float): share of the time spent waiting for epochs' first batches.
        start (StartSplit | None): how one such wait split (median over the epochs seen).
        pss (float): PSS of the loader's processes, bytes. memory (float | None): bytes they may use.
        parent_rss (float): the main process's resident memory, bytes (what fork copies page tables of).
        start_method (str): fork, spawn or forkserver.
        others (float): cores used by other programs meanwhile.
        waits (dict[str, float]): what the producers did, shares of their time (:attr:`Window.waits`:
            computing, runq, network, disk, lock, sleep, idle, other); empty when nobody looked.
        wait_calls (dict[str, list[str]]): per kind of wait, the system calls seen, most seen first.
        looked (int): looks at the producers behind ``waits``.
        where, auto: as in :class:`Context`.
    """

    workers: int
    cores: int
    threads: int = 0
    step: bool = False
    stall: float | None = None
    main_busy: float = 0.0
    main_process_busy: float = 0.0
    main_threads: dict[str, float] = field(default_factory=dict)
    main_cores: float = 0.0
    recv: float = 0.0
    recv_cpu: float = 0.0
    pin: float = 0.0
    worker_busy: list[float] = field(default_factory=list)
    worker_cores: list[float] = field(default_factory=list)
    worker_threads: dict[str, float] = field(default_factory=dict)
    stage_busy: dict[str, float | None] = field(default_factory=dict)
    stage_ms: dict[str, float | None] = field(default_factory=dict)
    blkio: float = 0.0
    blkio_known: bool = False
    dstate: float = 0.0
    device_mb_s: float = 0.0
    read_mb_s: float = 0.0
    epoch_start: float = 0.0
    start: StartSplit | None = None
    pss: float = 0.0
    memory: float | None = None
    parent_rss: float = 0.0
    start_method: str = "fork"
    others: float = 0.0
    main_producing: float = 0.0
    data_wait: float = 0.0
    waits: dict[str, float] = field(default_factory=dict)
    wait_calls: dict[str, list[str]] = field(default_factory=dict)
    looked: int = 0
    where: Literal["bench", "training"] = "bench"
    auto: bool = False

    @property
    def per_worker_busy(self) -> float:
        return sum(self.worker_busy) / len(self.worker_busy) if self.worker_busy else 0.0

    @property
    def producer_busy(self) -> float:
        """How much of the time a producing process computes (runs or waits for a core)."""
        if self.workers:
            return self.per_worker_busy
        if self.threads:
            return min(1.0, self.main_process_busy / self.threads)
        return min(1.0, self.main_producing)

    @property
    def producer_cpu(self) -> float:
        """Cores one producer used (CPU only: a run-queue wait is not work done): a worker process, one
        loader thread (the main process's CPU shared among them), or the main process."""
        if self.workers:
            return sum(self.worker_cores) / len(self.worker_cores) if self.worker_cores else 0.0
        return self.main_cores / self.threads if self.threads else self.main_cores

    @property
    def demand(self) -> float:
        """Cores the loader would keep busy if it had them: each worker's threads running or runnable, and the
        main thread's share. In thread mode the cores the main process keeps busy (never more than the machine
        has: threads that wait for a core, or for the GIL, want no more cores than there are)."""
        if self.threads:
            return min(self.main_process_busy, float(self.cores))
        return sum(self.worker_busy) + self.main_busy


def evidence(w: Window, ctx: Context) -> Evidence:
    """The figures the label rules read, from window ``w`` (see the module doc)."""
    recv, recv_cpu = w.receiving
    producers = ctx.threads or len(w.workers) or 1
    waits = w.waits
    return Evidence(
        workers=len(w.workers),
        cores=ctx.cores,
        threads=ctx.threads,
        step=w.step,
        stall=w.stall if w.step else None,
        main_busy=w.main_busy,
        main_process_busy=min(w.main_process_busy, float(ctx.cores)),
        main_threads=w.main_threads,
        main_cores=w.main_cores,
        recv=recv,
        recv_cpu=recv_cpu,
        pin=w.pinning,
        worker_busy=w.worker_busy,
        worker_cores=w.worker_cores,
        worker_threads=w.worker_threads,
        stage_busy=w.stage_busy(producers),
        stage_ms=w.stage_ms(ctx.stage_totals),
        blkio=w.blkio(producers),
        blkio_known=ctx.blkio_known,
        dstate=w.dstate,
        device_mb_s=w.device_mb_s,
        read_mb_s=w.read_mb_s,
        epoch_start=w.first_wait if ctx.epoch_start is None else ctx.epoch_start,
        start=ctx.start,
        pss=w.pss,
        memory=ctx.memory,
        parent_rss=ctx.parent_rss,
        start_method=ctx.start_method,
        others=w.others_cores,
        main_producing=w.main_producing,
        data_wait=w.data_wait,
        waits=waits,
        wait_calls={k: w.wait_calls(k) for k, v in waits.items() if v},
        looked=sum(w.producer_looks.values()),
        where=ctx.where,
        auto=ctx.auto,
    )


__all__ = ["Context", "Evidence", "evidence"]
