"""The monitor and ``num_workers="auto"`` inside a training loop: the hook around a loader's batches.

A :class:`Session` belongs to one loader (an ``fd.Loader``, or a plain DataLoader wrapped by
:func:`fastdata.monitor`). It installs the probes in the workers (the ``worker_init_fn`` and ``collate_fn``
wrappers the DataLoader builder takes: :class:`~fastdata.loading.observe._stage_table.ProbeInit`,
:class:`MonitoredCollate`), counts each batch as it is handed out (two clock reads and two CPU-clock reads
a batch), and every window of about a second (``AutoTune.window``) gives the autotuner an
:class:`~fastdata.loading.observe._autotune.Observation`; every ``Monitor.seconds`` it makes a report
(:class:`~fastdata.loading.observe._report.Stats`).

A change the autotuner makes is applied at the next batch boundary: the DataLoader's iterator is shut down
and the loader's ``reopen(epoch, batches_done, setting)`` returns a new one with the new setting that
continues the epoch exactly where the training is (``fd.Loader`` resumes at any batch with any
``num_workers``: see :mod:`fastdata.core._sharding`), so no sample is lost or read twice, and the order is the
one a fixed setting gives.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

from fastdata.core import stages
from fastdata.core._machine import memory_available
from fastdata.core._proc import ProcessCounters
from fastdata.core.errors import ConfigError, check_positive
from fastdata.loading.observe import _stage_table as stage_table
from fastdata.loading.observe._autotune import EARLY, AutoTune, Change, Observation, Setting, Tuner
from fastdata.loading.observe._diagnosis import classify
from fastdata.loading.observe._probe import (
    LiveProbe,
    LoopCounters,
    ProcessDetail,
    Snapshot,
    batch_samples,
    evidence,
    figures,
    memory_of,
    worker_pids,
)
from fastdata.loading.observe._report import Monitor, ProcessStats, Sinks, Stats, as_monitor, now
from fastdata.loading.observe._stage_table import ProbeInit, StartSplit, start_split

CHANGES = "fastdata.autotune"  # the logger every change of setting goes to, at INFO
USS_EVERY = 5  # windows between two reads of the workers' memory (smaps_rollup costs ~1 ms a process)
Reopen = Callable[[int, int, Setting], Iterator[Any]]


class MonitoredCollate:
    """The ``collate_fn`` under the monitor: marks each batch in the stage table (so the worker's stage
    totals and own counters reach shared memory) and times the collate function (under the slots transport,
    packing into the slot included). Returns the batch as is; counts samples from its input.

    Args:
        collate_fn (Callable): the collate function the DataLoader would run.
        batched (bool): the DataLoader batches (True), or the dataset yields whole batches.
    """

    # it reads only its input and the time: under the slots transport it wraps the slots' collate function,
    # which stacks the batch straight into the slot (see fastdata.loading._builder.slot_collate)
    outside_slots = True

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self.collate_fn, self.batched = collate_fn, batched

    def __call__(self, data: Any) -> Any:
        stage_table.batch_begin()
        start = stages.clock()
        out = self.collate_fn(data)
        n = len(data) if self.batched else batch_samples(data)
        stages.lap("collate", start, n)
        stage_table.batch_end(n)
        return out


def _shutdown(iterator: Any) -> None:
    stop = getattr(iterator, "_shutdown_workers", None)  # private, stable since torch 1.0; else GC stops them
    if callable(stop):
        stop()


class Session:
    """The monitor and autotuner of one loader (see the module docstring).

    Args:
        monitor (Monitor | None): how often to report and where; None: no reports (``stats()`` still works).
        tuner (Tuner | None): the autotuner; None: the setting stays.
        setting (Setting): the setting the loader starts with.
        rows (int): 1 + the most workers the loader may run.
        start_method (str): fork, spawn or forkserver (for the diagnosis of start-ups).
        persistent (bool): the workers persist between passes.
        threads (int): loader threads of this process that make the batches (``workers="threads"``): the
            probes count this process as the producer (``setting`` has no workers). Defaults to 0.
    """

    def __init__(
        self,
        monitor: Monitor | None,
        tuner: Tuner | None,
        setting: Setting,
        rows: int,
        start_method: str = "fork",
        persistent: bool = False,
        threads: int = 0,
    ) -> None:
        self.monitor, self.tuner, self.setting, self.threads = monitor, tuner, setting, threads
        self.sinks = Sinks(monitor.to) if monitor is not None else None
        self.probe = LiveProbe(rows)
        self.loop = LoopCounters()
        self.start_method, self.persistent = start_method, persistent
        self.latest: Stats | None = None
        self.observations: list[Observation] = []  # the autotuner's, latest last (bounded)
        self.position = (0, 0)
        self._restart: Change | None = None
        self._pending: Change | None = None
        self._window: Snapshot | None = None
        self._report: Snapshot | None = None
        self._before: dict[int, ProcessCounters] = {}
        self._changes: list[Change] = []
        self._split: StartSplit | None = None
        self._asked = perf_counter()
        self._pids: list[int] = []
        self._restart_s = 0.0
        self._uss = 0.0
        self._pss = 0.0
        self._windows = 0
        self._fresh = True  # the next first batch comes from workers started for it
        self._early_done = False  # the current window's first quarter was observed
        self._due = 0.0
        self._due_batches = 0
        self._started = False

    @property
    def changes(self) -> list[Change]:
        """Every change of setting so far (empty without ``num_workers="auto"``)."""
        return list(self.tuner.changes) if self.tuner is not None else []

    def hooks(self) -> dict[str, Any]:
        """What the DataLoader builder wraps: the workers' ``worker_init_fn`` and the ``collate_fn`` (loader
        threads run no ``worker_init_fn``)."""
        if self.threads:
            return {"wrap_collate": MonitoredCollate}
        return {"wrap_collate": MonitoredCollate, "wrap_worker_init": functools.partial(ProbeInit, self.probe.table)}

    def kwargs_for(self, base: dict[str, Any], setting: Setting) -> dict[str, Any]:
        """The DataLoader options of ``setting``: the user's (``base``), the probes' hooks, the prefetch."""
        kw = {**base, **self.hooks()}
        if setting.workers:
            if setting.prefetch is not None:
                kw["prefetch_factor"] = setting.prefetch
        elif self.tuner is not None:
            for name in ("prefetch_factor", "persistent_workers"):  # torch refuses them without workers
                kw.pop(name, None)
        return kw

    # -- the pass ------------------------------------------------------------------------------------

    def pass_starts(self) -> Change | None:
        """Called just before ``iter(dataloader)``: returns the change waiting for this pass, if any."""
        change, self._pending = self._pending, None
        if change is not None:
            self.setting = change.after
            self._fresh = True
        if not self._started:
            self._started = True
            self.probe.start()
        self.probe.table.new_epoch()  # each producer marks its next batch as this pass's first
        if self.setting.workers:
            self.probe.detach_main()
        else:
            self.probe.attach_main()  # the main process makes the batches: it writes into row 0
        if self._report is None:
            self._report = self.probe.snapshot(self.loop, self.setting.workers)
            self._set_due()
        self._asked = perf_counter()
        self._fresh = self._fresh or not self.persistent
        return change

    def run(
        self, batches: Iterator[Any], epoch: int, start: int, length: int | None, reopen: Reopen | None
    ) -> Iterator[Any]:
        """Hand out the pass's batches, counting them, and restart the workers where the tuner says."""
        it = batches
        self._began(it)
        loop, done = self.loop, start
        self.position = (epoch, done)
        t_prev, first, restarted = self._asked, True, False
        while True:
            t0, c0 = perf_counter(), time.thread_time()
            change = self._restart
            if change is not None and reopen is not None:
                self._restart = None
                _shutdown(it)
                self.setting, self._fresh = change.after, True
                it = reopen(epoch, done, change.after)
                self._asked = t_prev = t0
                self._began(it)
                first = restarted = True
            try:
                batch = next(it)
            except StopIteration:
                return
            t1, c1 = perf_counter(), time.thread_time()
            loop.wait += t1 - t0
            loop.wait_cpu += c1 - c0
            loop.loop += t1 - t_prev
            t_prev = t1
            loop.batches += 1
            loop.samples += batch_samples(batch)
            done += 1
            self.position = (epoch, done)
            if first:
                first = False
                self._first(t1, restarted)
            if t1 >= self._due or loop.batches >= self._due_batches:
                self._tick(t1, done, length)
            yield batch

    def _began(self, iterator: Any) -> None:
        self._pids = worker_pids(iterator) if self.setting.workers else []
        self.probe.watch(self._pids)

    def _first(self, t1: float, restarted: bool) -> None:
        """The first batch of a pass, or after a restart: its wait was a start-up."""
        wait = t1 - self._asked
        self.loop.first_wait += wait
        self.loop.starts += 1
        if restarted:
            self._restart_s = wait
        slot = 1 if self.setting.workers else 0
        self._split = start_split(self.probe.table, slot, self._asked, self._asked, t1, self._fresh)
        self._fresh = False
        if self.tuner is not None and self._window is None and self._restart is None:
            self._window = self.probe.snapshot(self.loop, self.setting.workers)  # measure from here
            self._set_due()

    def _set_due(self) -> None:
        due, due_b = float("inf"), 1 << 62
        if self.tuner is not None and self._window is not None:
            early = self.tuner.wants_early() and not self._early_done
            due = self._window.t + self.tuner.options.window * (EARLY if early else 1.0)
        if self.monitor is not None and self._report is not None:
            if self.monitor.seconds is not None:
                due = min(due, self._report.t + self.monitor.seconds)
            if self.monitor.every is not None:
                due_b = self._report.loop.batches + self.monitor.every
        self._due, self._due_batches = due, due_b

    def _tick(self, t: float, done: int, length: int | None) -> None:
        snap: Snapshot | None = None
        w = self._window
        if self.tuner is not None and w is not None and self._pending is None and self._restart is None:
            opts = self.tuner.options
            enough = self.loop.batches - w.loop.batches >= opts.min_batches
            if enough and t - w.t >= opts.window:
                snap = self.probe.snapshot(self.loop, self.setting.workers)
                self._observe(w, snap, done, length)
            elif enough and not self._early_done and self.tuner.wants_early() and t - w.t >= EARLY * opts.window:
                self._early_done = True  # the window's first quarter, for a setting not measured yet
                snap = self.probe.snapshot(self.loop, self.setting.workers)
                self._observe(w, snap, done, length, early=True)
        m, r = self.monitor, self._report
        if m is not None and r is not None:
            late = m.seconds is not None and t - r.t >= m.seconds
            if late or (m.every is not None and self.loop.batches - r.loop.batches >= m.every):
                snap = snap or self.probe.snapshot(self.loop, self.setting.workers)
                stats = self._make_stats(r, snap)
                assert self.sinks is not None
                self.sinks.emit(stats)
        self._set_due()

    # -- the autotuner --------------------------------------------------------------------------------

    def _observe(self, a: Snapshot, b: Snapshot, done: int, length: int | None, early: bool = False) -> None:
        assert self.tuner is not None
        fig = figures(a, b)
        ev = evidence(
            fig,
            workers=self.setting.workers,
            cores=self.probe.cores,
            memory=self.probe.memory,
            pss=self._pss,
            start=self._split,
            start_method=self.start_method,
        )
        verdict = classify(ev, self.tuner.options.stall_target)
        self._windows += 1
        if self._pids and (self._windows % USS_EVERY == 1 or not self._uss):
            readings = [memory_of(p) for p in self._pids]
            self._uss = max(u for _, u in readings)
            self._pss = sum(p for p, _ in readings) + memory_of(self.probe.pid)[0]
        obs = Observation(
            t=b.t,
            setting=self.setting,
            rate=fig.rate,
            stall=fig.stall,
            step=fig.step,
            label=verdict.label,
            worker_busy=fig.per_worker_busy,
            others=fig.others,
            cores=self.probe.cores,
            memory_available=float(memory_available()),
            memory_total=self.probe.memory,
            worker_bytes=self._uss if self.setting.workers else 0.0,
            batches_left=length - done if length is not None else None,
            batch_s=fig.loop / fig.batches if fig.batches else 0.0,
            step_s=fig.step_ms / 1000,
            data_s=_data_s(fig),
            restart_s=self._restart_s,
            early=early,
        )
        self.observations = [*self.observations[-999:], obs]
        if not early:
            self._window, self._early_done = b, False
        change = self.tuner.observe(obs)
        if change is None:
            return
        logging.getLogger(CHANGES).info("%s -> %s (%s): %s", change.before, change.after, change.at, change.reason)
        self._changes.append(change)
        self._window, self._early_done = None, False  # measure the new setting from its first batch
        if change.at == "now":
            self._restart = change
        else:
            self._pending = change

    # -- the monitor ----------------------------------------------------------------------------------

    def _make_stats(self, a: Snapshot, b: Snapshot) -> Stats:
        fig = figures(a, b)
        details = self.probe.details(self._pids)
        ev = evidence(
            fig,
            workers=self.setting.workers,
            cores=self.probe.cores,
            memory=self.probe.memory,
            pss=sum(d.pss for d in details),
            start=self._split,
            start_method=self.start_method,
            details=details,
            before=self._before,
        )
        verdict = classify(ev, self.tuner.options.stall_target if self.tuner is not None else 0.05)
        processes = [self._process(d, fig) for d in details]
        stats = Stats(
            time=now(),
            seconds=fig.seconds,
            epoch=self.position[0],
            position=self.position[1],
            batches=fig.batches,
            samples=fig.samples,
            samples_per_s=fig.rate,
            stall=fig.stall,
            wait_ms=fig.wait_ms,
            step_ms=fig.step_ms,
            workers=self.setting.workers,
            prefetch_factor=self.setting.prefetch,
            auto=self.tuner is not None,
            loader_threads=self.threads,
            stages={s: {"ms_per_sample": fig.stage_ms[s], "share": fig.stage_busy[s]} for s in fig.stage_ms},
            processes=processes,
            usable_cores=self.probe.cores,
            machine_cores=fig.machine,
            others_cores=fig.others,
            pss=ev.pss,
            memory_available=float(memory_available()),
            label=verdict.label,
            evidence=verdict.evidence,
            advice=verdict.advice,
            changes=[c.to_dict() for c in self._changes],
        )
        self.latest = stats
        self._report, self._changes = b, []
        self._before = {d.pid: d.counters for d in details}
        return stats

    def _process(self, d: ProcessDetail, fig: Any) -> ProcessStats:
        was = self._before.get(d.pid)
        win = d.counters.minus(was) if was is not None else d.counters
        if d.role == "main":
            cores, busy = fig.main_cores, fig.main_cores + win.runq / fig.seconds
        else:
            k = int(d.role.split()[1])
            cores = fig.worker_cores[k] if k < len(fig.worker_cores) else win.cpu / fig.seconds
            busy = fig.worker_busy[k] if k < len(fig.worker_busy) else cores
        return ProcessStats(
            d.role, d.pid, cores, busy, win.voluntary, win.involuntary, d.threads, d.dstate, d.pss, d.uss, d.fds
        )

    def stats(self) -> Stats | None:
        """The latest report; before the first one is due, one made now over what was seen so far."""
        if self.latest is None and self._report is not None and self.loop.batches > self._report.loop.batches:
            return self._make_stats(self._report, self.probe.snapshot(self.loop, self.setting.workers))
        return self.latest

    def close(self) -> None:
        """Stop the D-state looks and close the report files (idempotent)."""
        self.probe.close()
        if self.sinks is not None:
            self.sinks.close()


def _data_s(fig: Any) -> float | None:
    """Seconds one process needs to make one batch, from the window's stage times (None: the dataset times
    no stage but collate)."""
    if not fig.batches:
        return None
    per_batch = fig.samples / fig.batches
    ms = fig.data_ms(per_batch)
    return ms / 1000 if ms is not None else None


def loader_session(
    num_workers: Any, monitor: Any, autotune: AutoTune | None, kwargs: dict[str, Any], threads: bool = False
) -> tuple[Session | None, dict[str, Any]]:
    """``fd.Loader``'s monitor and autotuner from its arguments: (the session, or None without either; the
    user's DataLoader options, ``prefetch_factor="auto"`` taken out). The session's ``setting`` is the first.
    With ``threads`` (``workers="threads"``, "auto" refused before): the monitor only, of this process.

    Raises:
        ConfigError: for a ``num_workers``/``prefetch_factor`` that is neither a count nor "auto", or an
            ``autotune=`` with nothing to tune.
    """
    base = dict(kwargs)
    prefetch = base.get("prefetch_factor")
    auto_workers = num_workers == "auto"
    auto_prefetch = prefetch == "auto"
    if not auto_workers:
        if not isinstance(num_workers, int) or isinstance(num_workers, bool):
            raise ConfigError(f"num_workers={num_workers!r}: pass a count (0, 1, 2 ...) or 'auto'")
        check_positive("num_workers", num_workers, allow_zero=True)
    if auto_prefetch:
        base.pop("prefetch_factor")
        if not auto_workers and not num_workers:
            raise ConfigError("prefetch_factor='auto' needs workers: pass num_workers >= 1 or 'auto'")
    elif isinstance(prefetch, str):
        raise ConfigError(f"prefetch_factor={prefetch!r}: pass a count (1, 2 ...) or 'auto'")
    if autotune is not None and not (auto_workers or auto_prefetch):
        raise ConfigError("autotune= sets how num_workers='auto' or prefetch_factor='auto' move: pass one of them")
    spec = as_monitor(monitor)
    if spec is None and not (auto_workers or auto_prefetch):
        return None, base
    if threads:
        return Session(spec, None, Setting(0), 1, persistent=True, threads=int(num_workers)), base
    persistent = bool(base.get("persistent_workers"))
    ctx = base.get("multiprocessing_context")
    method = ctx if isinstance(ctx, str) else getattr(ctx, "get_start_method", lambda: None)()
    method = method or multiprocessing.get_start_method(allow_none=True) or "fork"
    tuner = None
    if auto_workers or auto_prefetch:
        from fastdata.core._machine import usable_cores, usable_memory

        tuner = Tuner(
            autotune or AutoTune(),
            usable_cores(),
            workers=None if auto_workers else int(num_workers),
            prefetch=None if auto_prefetch else (prefetch if prefetch is not None else 2),
            persistent=persistent,
        )
        setting = tuner.initial(float(memory_available()), float(usable_memory()))
        rows = 1 + (tuner.max_workers if auto_workers else int(num_workers))
    else:
        setting = Setting(int(num_workers), prefetch if num_workers else None)
        rows = 1 + int(num_workers)
    return Session(spec, tuner, setting, rows, start_method=str(method), persistent=persistent), base


__all__ = ["CHANGES", "MonitoredCollate", "Reopen", "Session", "loader_session"]
