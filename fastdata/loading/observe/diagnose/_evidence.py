"""What the label rules read: a view of one window in its context (:class:`Evidence`), for a sweep's point
and a monitor's window alike.

A :class:`~fastdata.loading.observe.Window` holds what was counted, and every figure is its property, read
there under its one name (``ev.w.stall``, ``ev.w.receiving``); :class:`Context` holds what the
window cannot know (the usable cores and memory, the start method, how an epoch's first wait split, whether
the kernel's delay accounting is on). The evidence adds only the figures that need both, so the same window
gives the same evidence wherever it was measured, and a figure added to the window needs no copy here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fastdata.loading.observe.measure._stage_table import StartSplit
from fastdata.loading.observe.measure._window import Window


@dataclass(frozen=True)
class Context:
    """What the rules need beside a window.

    Attributes:
        cores (int): usable cores.
        threads (int): loader threads of the main process that make the batches (``workers="threads"``: their
            CPU is counted in the main process's figures); 0 otherwise.
        memory (float | None): bytes the loader may use (None: unknown).
        start (StartSplit | None): how an epoch's first-batch wait split (median over those seen).
        start_method (str): fork, spawn or forkserver.
        parent_rss (float): the main process's resident memory when the workers started, bytes (what fork
            copies page tables of).
        blkio_known (bool): the kernel's delay accounting is on (else block-I/O delay reads 0 regardless).
        first_wait (float | None): share of the time spent waiting for epochs' first batches, where the
            caller knows better than the window (a sweep that saw no epoch end). Defaults to None: the window's.
        stage_totals (Mapping | None): per stage (seconds, items) over a longer run, for the time per sample
            of datasets that do a stage's work outside every window. Defaults to None.
        where ("bench" | "training"): who reads the verdict: ``fastdata bench`` (its advice may name its own
            options, ``--step-ms``, ``--profile``), or the monitor inside training (it may not). Defaults to
            "bench".
        auto (bool): ``num_workers="auto"`` moves the worker count (the advice then leaves it to it).
            Defaults to False.
        persistent (bool): the worker processes persist between passes (``persistent_workers=True``): no
            launch or set-up to save. Defaults to False.
    """

    cores: int
    threads: int = 0
    memory: float | None = None
    start: StartSplit | None = None
    start_method: str = "fork"
    parent_rss: float = 0.0
    blkio_known: bool = False
    first_wait: float | None = None
    stage_totals: Mapping[str, tuple[float, float]] | None = None
    where: Literal["bench", "training"] = "bench"
    auto: bool = False
    persistent: bool = False


@dataclass(frozen=True)
class Evidence:
    """One window of a loader configuration (``w``) in its context (``ctx``; see the module doc), and the
    figures that need both. Fractions are of wall time; "cores" are CPU-seconds per second."""

    w: Window
    ctx: Context

    @property
    def workers(self) -> int:  # worker processes (0: the main process, or its loader threads, make the batches)
        return len(self.w.workers)

    @property
    def producers(self) -> int:  # the processes, or loader threads, that make the batches
        return self.ctx.threads or self.workers or 1

    @property
    def stage_busy(self) -> dict[str, float | None]:
        """Share of the producers' time in each stage."""
        return self.w.stage_busy(self.producers)

    @property
    def stage_ms(self) -> dict[str, float | None]:
        """Milliseconds per sample in each stage (over the context's longer run where it has one)."""
        return self.w.stage_ms(self.ctx.stage_totals)

    @property
    def blkio(self) -> float:
        """Block-I/O delay of all the loader's threads, per producer, as a share of time."""
        return self.w.blkio(self.producers)

    @property
    def main_process_busy(self) -> float:  # the window's, never more than the usable cores
        return min(self.w.main_process_busy, float(self.ctx.cores))

    @property
    def first_wait(self) -> float:
        """Share of the time spent waiting for epochs' first batches (the context's, where it knows better)."""
        known = self.ctx.first_wait
        return self.w.first_wait if known is None else known

    @property
    def looked(self) -> int:  # looks at the producers behind the window's waits
        return sum(self.w.producer_looks.values())

    @property
    def producer_busy(self) -> float:
        """How much of the time a producing process computes (runs or waits for a core)."""
        if self.workers:
            return self.w.per_worker_busy
        if self.ctx.threads:
            return min(1.0, self.main_process_busy / self.ctx.threads)
        return min(1.0, self.w.main_producing)

    @property
    def producer_cpu(self) -> float:
        """Cores one producer used (CPU only: a run-queue wait is not work done): a worker process, one
        loader thread (the main process's CPU shared among them), or the main process."""
        w, threads = self.w, self.ctx.threads
        if self.workers:
            return sum(w.worker_cores) / self.workers
        return w.main_cores / threads if threads else w.main_cores

    @property
    def used(self) -> float:
        """Cores the loader used: CPU-seconds per second of every thread of its processes (the workers whole;
        of the main process, the loop thread inside ``next()`` and its other threads, a dataset's own decode
        threads among them), never more than the machine has. What it would use with more cores is
        :attr:`demand`."""
        cpu = sum(self.w.worker_cores) + self.w.main_cores
        return min(cpu, float(self.ctx.cores))

    @property
    def wanted(self) -> float:
        """Cores the loader's threads asked for, as reported beside :attr:`used`: every thread of the workers
        and of the main process's loader work (the loop thread inside ``next()``, its other threads: a
        dataset's own decode threads with no workers) running or waiting for a core, per second. At least
        :attr:`used` (never below it: a thread that ran wanted its core); may pass the machine's cores."""
        w = self.w
        return max(self.used, sum(w.worker_busy) + w.main_process_busy)

    @property
    def demand(self) -> float:
        """Cores the loader would keep busy if it had them: each worker's threads running or runnable, and the
        main thread's share. In thread mode the cores the main process keeps busy (never more than the machine
        has: threads that wait for a core, or for the GIL, want no more cores than there are)."""
        if self.ctx.threads:
            return self.main_process_busy
        return sum(self.w.worker_busy) + self.w.main_busy


def evidence(w: Window, ctx: Context) -> Evidence:
    """The figures the label rules read, from window ``w`` in ``ctx`` (see the module doc)."""
    return Evidence(w, ctx)


__all__ = ["Context", "Evidence", "evidence"]
