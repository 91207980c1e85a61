"""Measuring one DataLoader configuration: start-up, warm-up, then windows until the figure settles.

The loop is a training loop without a model: ``next(loader)``, then the step (a sleep of ``step``
seconds, or the user's function), and bookkeeping. Each window records what the main loop saw (batches,
samples, bytes, time blocked in ``next``, time rebuilding and pinning batches) and, at its two ends,
the probes' counters (:class:`~fastdata.bench._probes.SystemProbe`, the shared stage table).

An epoch that runs out closes the current window, and the next window starts right there, so it holds
the restart (new workers unless they persist, and whatever the dataset does before its first sample):
training pays for it at every epoch, and a dataset that does its work at the start of an epoch would
otherwise look free. Each restart is also timed on its own (``restart_s``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from torch.utils.data import DataLoader

from fastdata.bench._probes import (
    DStateSampler,
    ProbedCollate,
    ProbeInit,
    StageTable,
    SystemProbe,
    delay_accounting,
    leading_dim,
)
from fastdata.bench._result import Config, Point, Window
from fastdata.core.errors import ConfigError, check_positive
from fastdata.loading._builder import build_dataloader
from fastdata.loading._plan import ReadPlan
from fastdata.loading._protocol import Dataset as FastdataDataset
from fastdata.loading.observe import _stage_table as library
from fastdata.loading.observe._stage_table import StartSplit, start_split
from fastdata.loading.threads._loader import ThreadLoader, thread_loader_for

StepFn = Callable[[Any], object]


@dataclass
class Timing:
    """How long to measure each point.

    Attributes:
        seconds (float): most seconds of steady state measured per point. Defaults to 6.
        window (float): seconds per measurement window (longer when the loader delivers in bursts).
            Defaults to 1.
        warmup (float): seconds discarded after the first batch. Defaults to 1.
        min_windows (int): windows that must agree before stopping early. Defaults to 3.
        max_spread (float): (max - min) / median of those windows that counts as agreeing. Defaults to 0.1.
    """

    seconds: float = 6.0
    window: float = 1.0
    warmup: float = 1.0
    min_windows: int = 3
    max_spread: float = 0.1

    def __post_init__(self) -> None:
        for name in ("seconds", "window"):
            check_positive(name, getattr(self, name))
        check_positive("warmup", self.warmup, allow_zero=True)
        check_positive("min_windows", self.min_windows)


def make_loader(
    ds: Any,
    config: Config,
    *,
    shuffle: bool = True,
    collate_fn: Callable[[Any], Any] | None = None,
    worker_init_fn: Callable[[int], object] | None = None,
    multiprocessing_context: Any = None,
    table: StageTable | None = None,
) -> DataLoader[Any] | ThreadLoader:
    """The loader of one configuration, built as :class:`fastdata.Loader` builds it
    (:func:`~fastdata.loading._builder.build_dataloader`, or in thread mode
    :func:`~fastdata.loading.threads._loader.thread_loader_for`), and probed when ``table`` is given: the
    probes wrap the collate function and ``worker_init_fn`` the builder chooses (loader threads have no
    ``worker_init_fn``: the main process's row of the table counts for all of them)."""
    hooks: dict[str, Any] = {}
    if table is not None:
        hooks["wrap_collate"] = ProbedCollate  # ProbedCollate(collate, batched)
        if config.processes:
            hooks["wrap_worker_init"] = functools.partial(ProbeInit, table)  # attach first, then fastdata's
    kwargs = config.loader_kwargs()
    plan = ReadPlan(kwargs.pop("batch_size"), shuffle=shuffle, collate_fn=collate_fn)
    if config.mode == "threads":
        kwargs.pop("workers")
        return thread_loader_for(
            ds,
            kwargs.pop("num_workers"),
            plan,
            worker_init_fn=worker_init_fn,  # refused (a point with an error) when given: threads have none
            **hooks,
            **kwargs,
        )
    return build_dataloader(
        ds,
        plan,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=multiprocessing_context,
        transport=config.transport,
        **hooks,
        **kwargs,
    )


class _Feed:
    """Batches from a DataLoader, epoch after epoch; timing each restart and, with a stage table,
    splitting each epoch's first-batch wait (:func:`fastdata.loading.observe._stage_table.start_split`).

    ``on_epoch_end(t)`` is called when an epoch runs out, before the next starts (``t``: when its last
    batch was asked for), so that the caller can close its window there.
    """

    def __init__(self, loader: DataLoader[Any] | ThreadLoader, table: StageTable | None, config: Config) -> None:
        self.loader, self.table, self.config = loader, table, config
        self.restarts: list[float] = []
        self.splits: list[StartSplit] = []
        self.restarted = False
        self.on_epoch_end: Callable[[float], object] | None = None
        self.it: Iterator[Any] = self._start(first=True)

    def _start(self, first: bool) -> Iterator[Any]:
        if self.table is not None:
            self.table.new_epoch()  # each producer marks its next batch as this epoch's first
        self._asked = perf_counter()
        self._fresh = first or not self.config.persistent_workers
        self._split_due = True
        it = iter(self.loader)
        self._started = perf_counter()
        return it

    def _split(self) -> None:
        if self.table is None or not self._split_due:
            return
        self._split_due = False
        # the first batch of an epoch is worker 0's; loader threads all count in the main process's row
        slot = 0 if self.config.in_main_process else 1
        split = start_split(self.table, slot, self._asked, self._started, perf_counter(), self._fresh)
        if self.config.mode == "threads":
            # no process is launched: iter() copies the dataset for each thread and starts them, which is
            # set-up (a "fork" verdict from it would claim worker-process evidence threads do not have)
            split.init, split.launch = split.init + split.launch, 0.0
        self.splits.append(split)

    def next(self) -> Any:
        self.restarted = False
        asked = perf_counter()
        try:
            item = next(self.it)
            self._split()
            return item
        except StopIteration:
            if self.on_epoch_end is not None:
                self.on_epoch_end(asked)
            start = perf_counter()
            self._next_epoch()
            self.it = self._start(first=False)
            try:
                item = next(self.it)
            except StopIteration:
                raise ConfigError("the dataset yielded nothing in a whole epoch") from None
            self.restarts.append(perf_counter() - start)
            self._split()
            self.restarted = True
            return item

    def _next_epoch(self) -> None:
        """Move a fastdata dataset (and its sampler, which follows it) to the next epoch, as a training
        loop does: a new order each pass, and no warning about a repeated epoch."""
        dataset = self.loader.dataset
        if isinstance(dataset, FastdataDataset):
            dataset.set_epoch(dataset.epoch + 1)

    def worker_pids(self) -> list[int]:
        # private, but stable since torch 1.0; without it, worker CPU and PSS are not reported
        workers = getattr(self.it, "_workers", None) or []
        return [p.pid for p in workers if p.pid is not None]

    def shutdown(self) -> None:
        stop = getattr(self.it, "_shutdown_workers", None)
        if callable(stop):
            stop()
        if isinstance(self.loader, ThreadLoader):
            self.loader.close()  # the threads, and each one's dataset copy, closed in its thread


_ZERO_SYS: dict[str, Any] = {
    "main_cpu": 0.0,
    "main_runq": 0.0,
    "threads_cpu": 0.0,
    "threads_runq": 0.0,
    "main_threads": {},
    "workers_cpu": [],
    "workers_busy": [],
    "worker_threads": {},
    "voluntary": 0,
    "involuntary": 0,
    "blkio": 0.0,
    "read_bytes": 0,
    "rchar": 0,
    "threads_main": 0,
    "threads_worker": 0,
    "machine_busy": 0.0,
    "machine_iowait": 0.0,
    "procs_blocked": 0,
    "dstate": 0,
    "dstate_looks": 0,
    "dstate_blocked": 0,
}
_LAST = ("procs_blocked", "dstate", "threads_main", "threads_worker")  # as of the window's end, not differences


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, end in b.items():
        start = a.get(key, _ZERO_SYS[key])
        if key in _LAST:
            out[key] = end
        elif isinstance(end, list):  # per worker slot; a slot added since ``a`` counts from zero
            out[key] = [y - (start[i] if i < len(start) else 0.0) for i, y in enumerate(end)]
        elif isinstance(end, dict):
            out[key] = {k: v - start.get(k, 0.0) for k, v in end.items() if v - start.get(k, 0.0) > 0}
        else:
            out[key] = max(type(end)(0), end - start) if key not in ("main_cpu", "main_runq") else end - start
    return out


class _Meter:
    """Counts the batches of one window and reads the probes at its two ends."""

    def __init__(self, probe: SystemProbe | None, table: StageTable | None, start: float | None = None) -> None:
        self.probe, self.table = probe, table
        self.start = perf_counter() if start is None else start
        self.sys = probe.read() if probe else _ZERO_SYS
        self.stages = table.totals() if table else {}
        self.samples = self.batches = self.nbytes = 0
        self.wait = self.unpickle = self.unpickle_cpu = self.pin = self.step = self.step_cpu = 0.0
        self.restart_wait = 0.0

    def close(self, end: float) -> Window:
        sys = _diff(self.sys, self.probe.read()) if self.probe else _ZERO_SYS
        st: dict[str, tuple[float, float]] = {}
        if self.table is not None:
            now = self.table.totals()
            st = {k: (now[k][0] - self.stages[k][0], now[k][1] - self.stages[k][1]) for k in now}
        return Window(
            wall=end - self.start,
            samples=self.samples,
            batches=self.batches,
            nbytes=self.nbytes,
            wait=self.wait,
            unpickle=self.unpickle,
            unpickle_cpu=self.unpickle_cpu,
            pin=self.pin,
            step=self.step,
            step_cpu=self.step_cpu,
            stages=st,
            restart_wait=self.restart_wait,
            **sys,
        )


class _Run:
    """The measurement of one configuration (see :func:`measure`)."""

    def __init__(
        self, ds: Any, config: Config, timing: Timing, step: float | StepFn, probes: bool, loader_args: dict[str, Any]
    ) -> None:
        self.config, self.timing, self.probes = config, timing, probes
        self.step_fn = step if callable(step) else None
        self.step_s = 0.0 if callable(step) else float(step)
        self.table = StageTable(config.num_workers + 1) if probes else None
        self.loader = make_loader(ds, config, table=self.table, **loader_args)
        self.windows: list[Window] = []
        self.measured = 0.0
        self.feed: _Feed | None = None
        self.probe: SystemProbe | None = None
        self.meter: _Meter | None = None
        self.sampler = DStateSampler().start() if probes else None
        self.parent_rss = 0.0

    def start(self) -> float:
        """Start the workers; seconds until the first batch."""
        if self.table is not None and self.config.in_main_process:
            self.table.attach(0)  # the main process produces the batches itself (or its loader threads do)
        self.parent_rss = _rss()
        begin = perf_counter()
        self.feed = _Feed(self.loader, self.table, self.config)
        self.feed.next()
        took = perf_counter() - begin
        self.probe = SystemProbe(self.feed.worker_pids(), self.sampler, self.table) if self.probes else None
        return took

    def warm_up(self) -> float:
        """Discard batches for ``warmup`` seconds (and what start-up prefetched); the longest gap seen."""
        assert self.feed is not None
        least = (self.config.prefetch_factor or 1) * self.config.num_workers + 2
        end = perf_counter() + self.timing.warmup
        n, gap, last = 0, 0.0, perf_counter()
        while perf_counter() < end or n < least:
            self.feed.next()
            now = perf_counter()
            gap, last, n = max(gap, now - last), now, n + 1
        return gap

    def _close(self, at: float) -> None:
        if self.meter is not None and self.meter.batches:
            self.windows.append(self.meter.close(at))
            self.measured += self.windows[-1].wall

    def _epoch_end(self, at: float) -> None:
        # close the window where the epoch ran out; the next one starts there and holds the restart
        self._close(at)
        self.meter = _Meter(self.probe, self.table, start=at)

    def measure(self, span: float) -> None:
        """Windows of ``span`` seconds until they agree, ``seconds`` are measured, or time runs out."""
        feed, timing = self.feed, self.timing
        assert feed is not None
        limit = perf_counter() + 2 * timing.seconds + timing.warmup  # a very slow loader: bound the time
        feed.on_epoch_end = self._epoch_end
        self.meter = _Meter(self.probe, self.table)
        while True:
            t0 = perf_counter()
            item = feed.next()
            t1 = perf_counter()
            meter = self.meter
            assert meter is not None
            if feed.restarted:
                t0 = meter.start  # the wait for this batch began when the epoch ran out
                meter.restart_wait += t1 - t0
                if self.probe is not None and self.config.processes and not self.config.persistent_workers:
                    self.probe.set_workers(feed.worker_pids())
            if self.probes:
                n, nbytes, batch = item.n, item.nbytes, item.batch
                meter.unpickle += item.unpickle_s
                meter.unpickle_cpu += item.unpickle_cpu
                meter.pin += item.pin_s
            else:
                batch = item
                n, nbytes = leading_dim(batch), 0
            if self.step_fn is not None:
                c0 = time.thread_time()
                self.step_fn(batch)
                meter.step_cpu += time.thread_time() - c0
            elif self.step_s > 0:
                time.sleep(self.step_s)
            t2 = perf_counter()
            meter.wait += t1 - t0
            meter.step += t2 - t1
            meter.samples += n
            meter.nbytes += nbytes
            meter.batches += 1
            if t2 - meter.start >= span:
                self._close(t2)
                self.meter = _Meter(self.probe, self.table)
                if _settled(self.windows, timing, span):
                    return
            if self.measured + (t2 - self.meter.start) >= timing.seconds or t2 >= limit:
                self._close(t2)
                return

    def finish(self, startup: float, cores: int) -> Point:
        """The point, with memory, descriptors and context switches read before the workers stop."""
        assert self.feed is not None
        point = Point.from_windows(
            self.config,
            self.windows,
            startup_s=startup,
            restart_s=self.feed.restarts,
            step_time=self.step_fn is not None or self.step_s > 0,
            usable_cores=cores,
            stage_totals=self.table.totals() if self.table is not None else None,
        )
        if self.probe is not None:
            point.pss_main, point.pss_workers = self.probe.memory()
            point.fds = self.probe.descriptors()
        point.parent_rss = self.parent_rss
        point.blkio_known = delay_accounting()
        splits = self.feed.splits
        if splits:
            point.start_split = _split_dict([splits[0]])
            if len(splits) > 1:
                point.restart_split = _split_dict(splits[1:])
        return point

    def close(self) -> None:
        if self.feed is not None:
            self.feed.shutdown()
        if self.sampler is not None:
            self.sampler.stop()
        if self.table is not None and self.config.in_main_process:
            library.detach()
        self.feed = None


def measure(
    ds: Any,
    config: Config,
    *,
    timing: Timing | None = None,
    step: float | StepFn = 0.0,
    shuffle: bool = True,
    collate_fn: Callable[[Any], Any] | None = None,
    worker_init_fn: Callable[[int], object] | None = None,
    multiprocessing_context: Any = None,
    probes: bool = True,
    cores: int = 1,
) -> Point:
    """Measure one configuration on dataset ``ds`` (see :func:`fastdata.bench.sweep` for the arguments).

    A configuration that fails (a worker killed by the OOM killer, an exception in the dataset) gives a
    point with ``error`` set, so that one bad configuration does not end a sweep.
    """
    timing = timing or Timing()
    run: _Run | None = None
    try:
        with warnings.catch_warnings():
            # measuring more workers than cores is the point of a sweep; pinning without CUDA is a no-op
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            warnings.filterwarnings("ignore", message=".*pin_memory.*", category=UserWarning)
            run = _Run(
                ds,
                config,
                timing,
                step,
                probes,
                {
                    "shuffle": shuffle,
                    "collate_fn": collate_fn,
                    "worker_init_fn": worker_init_fn,
                    "multiprocessing_context": multiprocessing_context,
                },
            )
            startup = run.start()
            gap = run.warm_up()
            # a loader that delivers in bursts (a dataset that reads and decodes many samples at once)
            # needs windows that span several bursts, or each window sees only a burst or only a gap
            span = min(max(timing.window, 2 * gap), max(timing.window, timing.seconds / 2))
            run.measure(span)
            return run.finish(startup, cores)
    except Exception as e:  # noqa: BLE001 - one failing configuration (OOM, crash) must not end the sweep
        return Point(config, usable_cores=cores, error=f"{type(e).__name__}: {e}")
    finally:
        if run is not None:
            run.close()
        del run
        gc.collect()


def _rss() -> float:
    try:
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0.0


def _split_dict(splits: list[StartSplit]) -> dict[str, float]:
    """The median of each part of several splits."""
    names = [f.name for f in dataclasses.fields(StartSplit)]
    return {n: float(statistics.median(getattr(s, n) for s in splits)) for n in names}


def _settled(windows: list[Window], timing: Timing, span: float) -> bool:
    full = [w for w in windows if w.wall >= 0.5 * span]
    if len(full) < timing.min_windows:
        return False
    rates = [w.rate for w in full[-timing.min_windows :]]
    mid = statistics.median(rates)
    return mid > 0 and (max(rates) - min(rates)) / mid <= timing.max_spread


__all__ = ["Timing", "make_loader", "measure"]
