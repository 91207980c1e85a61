"""Measuring one DataLoader configuration: start-up, warm-up, then windows until the figure settles.

The loop is a training loop without a model: ``next(loader)``, then the step (a sleep of ``step``
seconds, or the user's function), and bookkeeping. It counts each batch as the monitor does (the
library's :class:`~fastdata.loading.observe.measure.BatchCounter`, plus what the sweep's envelope times:
rebuilding and pinning each batch), and reads the library's probe
(:class:`~fastdata.loading.observe.measure.Probe`) at each window's two ends: each window is the one
measurement record, :class:`~fastdata.loading.observe.measure.Window`.

An epoch that runs out closes the current window, and the next window starts right there, so it holds
the restart (new workers unless they persist, and whatever the dataset does before its first sample):
training pays for it at every epoch, and a dataset that does its work at the start of an epoch would
otherwise look free. Each restart is also timed on its own (``restart_s``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from torch.utils.data import DataLoader

from fastdata.bench._probes import ProbedCollate
from fastdata.bench._result import Config, Point
from fastdata.core.errors import ConfigError, check_positive
from fastdata.core.system import delay_accounting, rss
from fastdata.loading import Dataset as FastdataDataset
from fastdata.loading import FastDataLoader, ReadPlan, build_dataloader
from fastdata.loading.observe.measure import (
    BatchCounter,
    Probe,
    ProbeInit,
    StageTable,
    StartSplit,
    Window,
    batch_samples,
    start_split,
)
from fastdata.loading.threads import ThreadLoader, thread_loader_for

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
    (:func:`~fastdata.loading.build_dataloader`, or in thread mode
    :func:`~fastdata.loading.threads.thread_loader_for`), and probed when ``table`` is given: the
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
        transport=kwargs.pop("transport", config.transport),  # in the pasteable keywords when not stock
        # a configuration recommended as a plain DataLoader(...) line is measured as one
        dataloader_class=FastDataLoader if config.uses_loader() else DataLoader,
        **hooks,
        **kwargs,
    )


class _Feed:
    """Batches from a DataLoader, epoch after epoch; timing each restart and, with a stage table,
    splitting each epoch's first-batch wait (:func:`fastdata.loading.observe.measure.start_split`).

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


class _Run:
    """The measurement of one configuration (see :func:`measure`), through the library's probe."""

    def __init__(
        self, ds: Any, config: Config, timing: Timing, step: float | StepFn, probes: bool, loader_args: dict[str, Any]
    ) -> None:
        self.config, self.timing, self.probes = config, timing, probes
        self.step_fn = step if callable(step) else None
        self.step_s = 0.0 if callable(step) else float(step)
        self.probe = Probe(config.num_workers + 1, loader_threads=config.mode == "threads")
        self.counter = self.probe.counter
        table = self.probe.table if probes else None
        self.loader = make_loader(ds, config, table=table, **loader_args)
        self.windows: list[Window] = []
        self.measured = 0.0
        self.feed: _Feed | None = None
        self._start: Window | None = None  # the reading the current window began at
        self.parent_rss = 0.0

    def start(self) -> float:
        """Start the workers; seconds until the first batch."""
        if self.probes and self.config.in_main_process:
            self.probe.attach_main()  # the main process produces the batches itself (or its loader threads do)
        if self.probes:
            self.probe.start()
        self.parent_rss = rss()
        begin = perf_counter()
        self.feed = _Feed(self.loader, self.probe.table if self.probes else None, self.config)
        self.feed.next()
        took = perf_counter() - begin
        self.probe.watch(self.feed.worker_pids())
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

    def _read(self, memory: bool = False) -> Window:
        return self.probe.read(memory=memory) if self.probes else _bare(self.counter, self.probe.t0)

    def _close(self) -> Window:
        """Close the current window here; the next begins where it ended. Each reading holds the processes'
        memory (PSS, USS, descriptors: ~1 ms a process), so the point holds the most its processes held at a
        window's end, whenever its workers came and went."""
        assert self._start is not None
        reading = self._read(memory=True)
        window = reading.since(self._start)
        if window.batches:
            self.windows.append(window)
            self.measured += window.seconds
        self._start = reading
        return window

    def measure(self, span: float) -> None:
        """Windows of ``span`` seconds until they agree, ``seconds`` are measured, or time runs out."""
        feed, timing, counter = self.feed, self.timing, self.counter
        assert feed is not None
        limit = perf_counter() + 2 * timing.seconds + timing.warmup  # a very slow loader: bound the time
        # an epoch that runs out closes the window there; the next one starts there and holds the restart
        feed.on_epoch_end = lambda at: self._close()
        self._start = self._read()
        asked = counter.clocks()
        counter.resume(asked)
        while True:
            counter.inside = True
            try:
                item = feed.next()
            finally:
                counter.inside = False
            got = counter.clocks()
            if feed.restarted:
                asked = (self._start.seconds + self.probe.t0, *asked[1:])  # the wait began as the epoch ran out
                if self.config.processes and not self.config.persistent_workers:
                    self.probe.watch(feed.worker_pids())
            if self.probes:
                batch = item.batch
                counter.handed(asked, got, item.n, first=feed.restarted)
                counter.received(item.unpickle_s, item.unpickle_cpu, item.pin_s, item.nbytes)
            else:
                batch = item
                counter.handed(asked, got, batch_samples(batch), first=feed.restarted)
            if self.step_fn is not None:
                self.step_fn(batch)
            elif self.step_s > 0:
                time.sleep(self.step_s)
            now = counter.clocks()
            t = now[0] - self.probe.t0
            done = self.measured + (t - self._start.seconds) >= timing.seconds or now[0] >= limit
            if done or t - self._start.seconds >= span:
                counter.stepped(now)  # this window holds its last batch's step
                self._close()
                if done or _settled(self.windows, timing, span):
                    return
                asked = counter.clocks()
                counter.exclude(now, asked)  # reading the probe is the measurement's time, not the loop's
            else:
                asked = now

    def finish(self, startup: float, cores: int) -> Point:
        """The point of this configuration."""
        assert self.feed is not None
        splits = self.feed.splits
        point = Point(
            self.config,
            windows=self.windows,
            startup_s=startup,
            restarts=list(self.feed.restarts),
            step=self.step_fn is not None or self.step_s > 0,
            stage_totals=self.probe.table.totals() if self.probes else {},
            start_split=_split_dict(splits[:1]) if splits else {},
            restart_split=_split_dict(splits[1:]) if len(splits) > 1 else {},
            parent_rss=self.parent_rss,
            blkio_known=delay_accounting(),
            usable_cores=cores,
        )
        if not self.windows:
            point.error = "no complete measurement window (the dataset may be too small or too slow)"
        return point

    def close(self) -> None:
        if self.feed is not None:
            self.feed.shutdown()
        self.probe.close()
        self.feed = None


def _bare(counter: BatchCounter, t0: float) -> Window:
    """A reading of the loop alone (``probes=False``: measuring the probes' own cost)."""
    return Window(
        seconds=perf_counter() - t0,
        loop_s=counter.loop_s,
        batches=counter.batches,
        samples=counter.samples,
        wait_s=counter.wait_s,
        step_s=counter.step_s,
    )


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
        return Point(config, usable_cores=cores, error=one_line(e), traceback=traceback.format_exc())
    finally:
        if run is not None:
            run.close()
        del run
        gc.collect()


ONE_LINE = 240  # characters of an error the report prints; the JSON's traceback holds the rest


def one_line(e: BaseException) -> str:
    """An error in one line: ``Type: message``. A DataLoader worker's error (torch re-raises it in the main
    process with the worker's whole traceback in its message) is the worker's own exception line, and where
    it happened."""
    text = str(e)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    place = ""
    if "Original Traceback" in text and lines:
        where = lines[0].rstrip(".").replace("Caught ", "").split(" in ", 1)
        place = f" (in {where[1]})" if len(where) == 2 else ""
        kind, _, message = lines[-1].partition(": ")
        out = f"{kind.rsplit('.', 1)[-1]}: {message}".rstrip(": ")  # the worker's line, its type unqualified
    else:
        out = f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    room = ONE_LINE - len(place)  # a long message is cut, where it happened is kept
    return (out if len(out) <= room else out[: room - 3] + "...") + place


def _split_dict(splits: list[StartSplit]) -> dict[str, float]:
    """The median of each part of several splits."""
    names = [f.name for f in dataclasses.fields(StartSplit)]
    return {n: float(statistics.median(getattr(s, n) for s in splits)) for n in names}


def _settled(windows: list[Window], timing: Timing, span: float) -> bool:
    full = [w for w in windows if w.seconds >= 0.5 * span]
    if len(full) < timing.min_windows:
        return False
    rates = [w.samples_per_s for w in full[-timing.min_windows :]]
    mid = statistics.median(rates)
    return mid > 0 and (max(rates) - min(rates)) / mid <= timing.max_spread


__all__ = ["Timing", "make_loader", "measure", "one_line"]
