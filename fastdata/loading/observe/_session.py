"""The monitor and ``num_workers="auto"`` inside a training loop: the hook around a loader's batches.

A :class:`Session` belongs to one loader (an ``fd.Loader``, or a plain DataLoader wrapped by
:func:`fastdata.monitor`). It installs the probes in the workers (the ``worker_init_fn`` and ``collate_fn``
wrappers the DataLoader builder takes: :class:`~.measure.ProbeInit`, :class:`MonitoredCollate`) and
counts each batch as it is handed out (:class:`~.measure.BatchCounter`: two clock and two CPU-clock reads
a batch). Two separate parts read that count through the one probe (:class:`~.measure.Probe`): the
``Reporter`` makes the monitor's reports, the ``Tuning`` hands windows
to the autotuner.

A change the autotuner makes is applied at the next batch boundary: the DataLoader's iterator is shut down
and the loader's ``reopen(epoch, batches_done, setting)`` returns a new one with the new setting that
continues the epoch exactly where the training is (``fd.Loader`` resumes at any batch with any
``num_workers``: see :mod:`fastdata.core.epoch`), so no sample is lost or read twice, and the order is the
one a fixed setting gives.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from fastdata.core import stages
from fastdata.core.errors import ConfigError
from fastdata.core.process import SharedState
from fastdata.core.system import memory_available, rss, usable_cores, usable_memory
from fastdata.loading.observe.diagnose._evidence import Context
from fastdata.loading.observe.measure import _stage_table as stage_table
from fastdata.loading.observe.measure._counter import BatchCounter
from fastdata.loading.observe.measure._ledger import Ledger
from fastdata.loading.observe.measure._probe import Probe, batch_samples, worker_pids
from fastdata.loading.observe.measure._stage_table import ProbeInit, StartSplit, start_split
from fastdata.loading.observe.report._reporter import Monitor, Reporter, Since, as_monitor
from fastdata.loading.observe.report._stats import Stats
from fastdata.loading.observe.tune._decide import Tuner
from fastdata.loading.observe.tune._options import AutoTune, Change, Requested, Setting
from fastdata.loading.observe.tune._tuning import Tuning

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
        monitor (Monitor | None): how often to report and where; None: no periodic reports (``stats()``
            still works).
        tuner (Tuner | None): the autotuner; None: the setting stays.
        setting (Setting): the setting the loader starts with.
        rows (int): 1 + the most workers the loader may run.
        start_method (str): fork, spawn or forkserver (for the diagnosis of start-ups).
        persistent (bool): the workers persist between passes.
        threads (int): loader threads of this process that make the batches (``workers="threads"``): the
            probes count this process as the producer (``setting`` has no workers). Defaults to 0.
        counters (SharedState | None): the dataset's shared counters: with a tuner, its ``skipped`` count is
            kept right across restarts (``Ledger``). Defaults to None.
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
        counters: SharedState | None = None,
    ) -> None:
        self.setting, self.threads = setting, threads
        has_skips = counters is not None and "skipped" in counters.counters
        self.ledger = Ledger(counters) if tuner is not None and counters is not None and has_skips else None
        self.start_method, self.persistent = start_method, persistent
        self.parent_rss = 0.0  # the main process's resident bytes when the workers last started
        self.counter = BatchCounter(step_threads=threads == 0)
        self.probe = Probe(rows, self.counter, loader_threads=threads > 0)
        stall_target = tuner.options.stall_target if tuner is not None else 0.05
        self.reporter = Reporter(monitor, lambda: self.probe.read(memory=True), stall_target)
        self.tuning = Tuning(tuner, lambda memory: self.probe.read(memory=memory)) if tuner is not None else None
        self.position = (0, 0)
        self._split: StartSplit | None = None
        self._changes: list[Change] = []  # made since the last report
        self._asked = self.counter.clocks()
        self._fresh = True  # the next first batch comes from workers started for it
        self._started = False
        self._measure_at: int | None = None  # the batch count from which the tuner measures the setting

    @property
    def tuner(self) -> Tuner | None:
        return self.tuning.tuner if self.tuning is not None else None

    @tuner.setter
    def tuner(self, tuner: Tuner) -> None:
        """Another tuner for the same loader (the tests script one)."""
        assert self.tuning is not None, "a session without num_workers='auto' has no tuner to replace"
        self.tuning.tuner = tuner

    @property
    def observations(self) -> list[Any]:
        """The autotuner's observations, latest last (empty without ``num_workers="auto"``)."""
        return self.tuning.observations if self.tuning is not None else []

    @property
    def changes(self) -> list[Change]:
        """Every change of setting so far (empty without ``num_workers="auto"``)."""
        return list(self.tuner.changes) if self.tuner is not None else []

    def hooks(self) -> dict[str, Any]:
        """What the DataLoader builder wraps: the workers' ``worker_init_fn`` and the ``collate_fn`` (loader
        threads run no ``worker_init_fn``)."""
        if self.threads:
            return {"wrap_collate": MonitoredCollate}
        noter = self.ledger.noter() if self.ledger is not None else None
        return {
            "wrap_collate": MonitoredCollate,
            "wrap_worker_init": functools.partial(ProbeInit, self.probe.table, ledger=noter),
        }

    def kwargs_for(self, base: dict[str, Any], setting: Setting) -> dict[str, Any]:
        """The DataLoader options of ``setting``: the user's (``base``), the probes' hooks, the prefetch."""
        kw = {**base, **self.hooks()}
        if setting.workers:
            if setting.prefetch is not None:
                kw["prefetch_factor"] = setting.prefetch
        elif self.tuning is not None:
            for name in ("prefetch_factor", "persistent_workers"):  # torch refuses them without workers
                kw.pop(name, None)
        return kw

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """Around ``iter(dataloader)``: with more workers than cores, chosen by ``num_workers="auto"`` for workers
        that wait, torch's warning that the count passes the cores is expected, and silenced."""
        if self.tuning is None or self.setting.workers <= self.probe.cores:
            yield
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
            yield

    def context(self) -> Context:
        """What the diagnosis needs beside a window."""
        return Context(
            cores=self.probe.cores,
            threads=self.threads,
            memory=self.probe.memory,
            start=self._split,
            start_method=self.start_method,
            parent_rss=self.parent_rss,
            where="training",
            auto=self.tuning is not None,
            persistent=self.persistent,
        )

    # -- the pass ------------------------------------------------------------------------------------

    def pass_starts(self, epoch: int = 0) -> Change | None:
        """Called just before ``iter(dataloader)`` for a pass over ``epoch``: returns the change waiting for
        this pass, if any."""
        change = None
        if self.tuning is not None:
            # a restart still waiting (the pass ended first, or the loader cannot restart mid-pass: a plain
            # IterableDataset) is made here, before the workers start, rather than just after
            change = self.tuning.take("next pass") or self.tuning.take("restart")
        if change is not None:
            self.setting = change.after
            self._fresh = True
        if not self._started:
            self._started = True
            self.probe.start()
        self.probe.table.new_epoch()  # each producer marks its next batch as this pass's first
        if self.setting.workers:
            self.parent_rss = rss()  # what fork copies the page tables of (the fork verdict names it)
            self.probe.detach_main()
        else:
            self.probe.attach_main()  # the main process makes the batches: it writes into row 0
        reading = self.probe.read()
        self.reporter.begin(reading)  # the first report counts from the first pass's start
        self.reporter.epoch_began(epoch, reading)
        self._asked = self.counter.clocks()
        self._fresh = self._fresh or not self.persistent
        return change

    def run(
        self, batches: Iterator[Any], epoch: int, start: int, length: int | None, reopen: Reopen | None
    ) -> Iterator[Any]:
        """Hand out the pass's batches, counting them, and restart the workers where the tuner says."""
        it = batches
        self._began(it)
        counter, probe, tuning, reporter = self.counter, self.probe, self.tuning, self.reporter
        ledger = self.ledger if reopen is not None else None
        done = start
        self.position = (epoch, done)
        asked, first, restarted = self._asked, True, False  # a pass's first wait starts at iter()
        due = self._due()
        try:
            while True:
                if not first:
                    asked = counter.clocks()
                change = tuning.take("restart") if tuning is not None and reopen is not None else None
                if change is not None and reopen is not None:
                    _shutdown(it)
                    if ledger is not None:
                        ledger.restarted(probe.table)  # what the old workers read ahead is read again
                    self.setting, self._fresh = change.after, True
                    asked = self._asked = counter.clocks()
                    with self.opening():
                        it = reopen(epoch, done, change.after)
                    self._began(it)
                    first = restarted = True
                if ledger is not None:
                    ledger.asking(it)
                counter.inside = True
                try:
                    batch = next(it)
                except StopIteration:
                    counter.ended(asked, counter.clocks())  # the pass's end: workers that do not persist stop here
                    return
                finally:
                    counter.inside = False
                if ledger is not None:
                    ledger.handed()
                got = counter.clocks()
                counter.handed(asked, got, batch_samples(batch), first=first)
                done += 1
                self.position = (epoch, done)
                if first:
                    first = False
                    self._first(got[0], restarted)
                if self._measure_at is not None:
                    self._measure_from_here()
                    due = self._due()
                if got[0] - probe.t0 >= due or reporter.due(got[0] - probe.t0, counter.batches):
                    self._tick(got[0] - probe.t0, length, done)
                    due = self._due()
                    counter.exclude(got, counter.clocks())  # the probe's reading is not the training step
                yield batch
        finally:
            counter.pass_ended()

    def _due(self) -> float:
        """The probe time of the tuner's next look (the reporter keeps its own)."""
        return self.tuning.due_at() if self.tuning is not None else float("inf")

    def _tick(self, t: float, length: int | None, done: int) -> None:
        left = None if length is None else length - done
        if self.tuning is not None:
            change = self.tuning.tick(t, self.counter.batches, self.context(), self.setting, self.position, left)
            if change is not None:
                self._changes.append(change)
        if self.reporter.due(t, self.counter.batches):
            self.reporter.report(self.context(), position=self.position, setting=self._setting())
            self._changes = []

    def _began(self, iterator: Any) -> None:
        pids = worker_pids(iterator) if self.setting.workers else []
        self.probe.watch(pids)
        if self.ledger is not None:
            self.ledger.began(pids)

    def _first(self, arrived: float, restarted: bool) -> None:
        """The first batch of a pass, or after a restart: its wait was a start-up."""
        asked = self._asked[0]
        if restarted and self.tuning is not None:
            self.tuning.restart_s = arrived - asked
        slot = 1 if self.setting.workers else 0
        self._split = start_split(self.probe.table, slot, asked, asked, arrived, self._fresh)
        self._fresh = False
        # measure the setting once every worker has handed its first batch (the DataLoader takes them in
        # turn): a worker's slow start (its first connection, a 1-s SYN retry against a full listen backlog)
        # is a start-up, paid once, not the setting's speed (16 HTTP workers measured 0.11x of 8 that way)
        self._measure_at = self.counter.batches + max(0, self.setting.workers - 1)

    def _measure_from_here(self) -> None:
        if self.tuning is not None and self._measure_at is not None and self.counter.batches >= self._measure_at:
            self._measure_at = None
            self.tuning.started(self.probe.read())

    def _setting(self) -> dict[str, object]:
        return {
            "workers": self.setting.workers,
            "prefetch_factor": self.setting.prefetch,
            "auto": self.tuning is not None,
            "loader_threads": self.threads,
            "changes": [c.to_dict() for c in self._changes],
        }

    def stats(self, since: Since = "report") -> Stats | None:
        """A report made now over what was seen since the last periodic report (``since="report"``), the
        current epoch's start (``"epoch"``) or the loader's (``"start"``); None before the first batch."""
        return self.reporter.stats(self.context(), position=self.position, setting=self._setting(), since=since)

    def close(self) -> None:
        """Stop the D-state looks and close the report files (idempotent)."""
        self.probe.close()
        self.reporter.close()


def loader_session(
    requested: Requested,
    monitor: Any,
    autotune: AutoTune | None,
    kwargs: dict[str, Any],
    threads: bool = False,
    counters: SharedState | None = None,
) -> tuple[Session | None, dict[str, Any]]:
    """``fd.Loader``'s monitor and autotuner from its arguments (``num_workers`` and ``prefetch_factor``
    checked, as ``requested``): (the session, or None without either; the user's DataLoader options,
    ``prefetch_factor="auto"`` taken out). With ``threads``: the monitor only, of this process. ``counters``:
    the dataset's shared counters (its ``skipped`` count is kept right across auto's restarts). Raises
    ConfigError for an ``autotune=`` with nothing to tune."""
    base = dict(kwargs)
    if requested.auto_prefetch:
        base.pop("prefetch_factor")
    if autotune is not None and not requested.tuned:
        raise ConfigError("autotune= sets how num_workers='auto' or prefetch_factor='auto' move: pass one of them")
    spec = as_monitor(monitor)
    if spec is None and not requested.tuned:
        return None, base
    fixed, prefetch = requested.workers, requested.prefetch
    if threads:
        return Session(spec, None, Setting(0), 1, persistent=True, threads=fixed or 0), base
    persistent = bool(base.get("persistent_workers"))
    ctx = base.get("multiprocessing_context")
    method = ctx if isinstance(ctx, str) else getattr(ctx, "get_start_method", lambda: None)()
    method = method or multiprocessing.get_start_method(allow_none=True) or "fork"
    tuner = None
    if requested.tuned:
        tuner = Tuner(
            autotune or AutoTune(),
            usable_cores(),
            workers=fixed,
            prefetch=None if requested.auto_prefetch else (prefetch if prefetch is not None else 2),
            persistent=persistent,
        )
        setting = tuner.initial(float(memory_available()), float(usable_memory()))
        rows = 1 + (tuner.most_workers if fixed is None else fixed)
    else:
        setting = Setting(fixed or 0, prefetch if fixed else None)
        rows = 1 + (fixed or 0)
    session = Session(spec, tuner, setting, rows, start_method=str(method), persistent=persistent, counters=counters)
    return session, base


__all__ = ["MonitoredCollate", "Reopen", "Session", "loader_session"]
