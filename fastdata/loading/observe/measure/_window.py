"""The one measurement record: what a loader did over a window, offline (``fastdata bench``) and live.

A :class:`Window` holds raw counters only (seconds, CPU-seconds, counts, bytes), each under one name and
in one unit; every figure a report prints or a rule reads (samples per second, the stall, each worker's
demand for a core ...) is a property computed from them, so a sweep's point and a monitor's report over
the same loader and the same window carry the same figures. The probe (:mod:`fastdata.loading.observe.measure`) reads a
cumulative window (everything since it started); the difference of two readings, :meth:`Window.since`,
is the window between them, and windows add up (:meth:`Window.pooled`): a sweep's point pools its
windows, a report covers the time since the previous one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fastdata.core.stages import STAGES
from fastdata.core.system import KINDS, split

# fields read as of the window's end (a state, not an amount): never subtracted or summed
LAST = {"last": True}


@dataclass
class Process:
    """One process of the loader over a window (the main process, or a worker's slot: the workers that held
    it one after the other, when they do not persist). Times in seconds.

    Attributes:
        cpu_s (float): CPU-seconds, every thread (exited ones too).
        runq_s (float): seconds its threads were runnable but waited for a core (another program held it).
        voluntary, involuntary (int): context switches: a thread gave up its core to wait (I/O, a lock, a
            queue), or was pushed off it (more runnable threads than cores).
        blkio_s (float): seconds its threads waited for block I/O (0 unless the kernel's delay accounting is on).
        read_bytes (int): bytes read from the storage device (what the page cache did not hold).
        rchar (int): bytes read through any read call (files, sockets, pipes, the page cache).
        by_thread (dict[str, float]): CPU-seconds per thread name (threads of one name summed).
        looks (dict[str, int]): looks at what it was doing, by ``"kind/call"`` (``"network/recvfrom"``,
            ``"computing/"``: :mod:`fastdata.core.system`): a worker as one producer; in the main process its
            loader threads each (thread mode), else its loop thread while inside ``next()``.
        pid (int), threads (int), dstate (int): at the window's end: its id, threads alive, of them in D state.
        pss, uss (float): at the end, bytes (0: not read): its proportional and unique set sizes.
        fds (int): at the end, open file descriptors (0: not read).
    """

    cpu_s: float = 0.0
    runq_s: float = 0.0
    voluntary: int = 0
    involuntary: int = 0
    blkio_s: float = 0.0
    read_bytes: int = 0
    rchar: int = 0
    by_thread: dict[str, float] = field(default_factory=dict)
    looks: dict[str, int] = field(default_factory=dict)
    pid: int = field(default=0, metadata=LAST)
    threads: int = field(default=0, metadata=LAST)
    dstate: int = field(default=0, metadata=LAST)
    pss: float = field(default=0.0, metadata=LAST)
    uss: float = field(default=0.0, metadata=LAST)
    fds: int = field(default=0, metadata=LAST)

    def since(self, before: Process) -> Process:
        return _since(self, before)


@dataclass
class Window:
    """What a loader did over a window of time (see the module doc). Times in seconds, CPU in CPU-seconds.

    Attributes:
        seconds (float): the window's length.
        loop_s (float): of it, inside passes over the data (the time between passes, validation or a
            checkpoint, is not the loader's).
        batches, samples (int): handed to the training loop.
        nbytes (int): payload bytes of those batches (0: not measured).
        wait_s (float): the loop waiting in ``next()`` for batches (rebuilding them included).
        wait_cpu_s (float): the loop thread's CPU inside ``next()``.
        step_s (float): the loop's time outside ``next()`` inside passes: the training step.
        step_cpu_s (float): the loop thread's CPU outside ``next()`` (0 for a step that sleeps or waits on
            the GPU; the model's own CPU for a step that computes on the CPU).
        step_others_s (float): the main process's other threads' CPU during the steps (a CPU model's intra-op
            threads): the step's, not the loader's (0 in thread mode, where the loader threads run then).
        first_wait_s (float): waiting for a pass's first batch (starting the workers, refilling buffers),
            and after each restart; starts (int): those passes and restarts.
        end_wait_s (float): the ``next()`` that found a pass over (shutting down workers that do not persist);
            ends (int): those passes.
        recv_s, recv_cpu_s, pin_s (float | None): the main process rebuilding received batches (wall, CPU;
            tensor hand-over waits included in the wall) and pinning them, timed batch by batch by the
            sweep's envelope (None where not measured: the monitor estimates receiving from ``wait_cpu_s``).
        loop_cpu_s, loop_runq_s (float): the loop thread's own CPU and run-queue wait.
        probe_cpu_s (float): the probe's own sampling thread (left out of ``main``).
        main (Process): every thread of the main process, the probe's own left out.
        workers (list[Process]): each worker slot (1 + k of the stage table: worker k).
        stages (dict[str, tuple[float, float]]): per stage (fetch, decode, transform, collate), (seconds,
            items) summed over the processes that produce batches.
        machine_cpu_s, machine_iowait_s (float): every program's CPU, and idle time waiting for I/O, on the
            CPUs this process may use.
        looks, blocked_looks (int): looks at the loader's threads' states (a few a second), and those that
            found one in uninterruptible sleep (D: a disk, an NFS/FUSE server).
        procs_blocked (int): at the end, processes of the machine in D state.
    """

    seconds: float = 0.0
    loop_s: float = 0.0
    batches: int = 0
    samples: int = 0
    nbytes: int = 0
    wait_s: float = 0.0
    wait_cpu_s: float = 0.0
    step_s: float = 0.0
    step_cpu_s: float = 0.0
    step_others_s: float = 0.0
    first_wait_s: float = 0.0
    starts: int = 0
    end_wait_s: float = 0.0
    ends: int = 0
    recv_s: float | None = None
    recv_cpu_s: float | None = None
    pin_s: float | None = None
    loop_cpu_s: float = 0.0
    loop_runq_s: float = 0.0
    probe_cpu_s: float = 0.0
    main: Process = field(default_factory=Process)
    workers: list[Process] = field(default_factory=list)
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    machine_cpu_s: float = 0.0
    machine_iowait_s: float = 0.0
    looks: int = 0
    blocked_looks: int = 0
    procs_blocked: int = field(default=0, metadata=LAST)

    # -- arithmetic ----------------------------------------------------------------------------------

    def since(self, before: Window) -> Window:
        """The window from reading ``before`` to this one (both cumulative readings of one probe). A worker
        slot new since ``before`` counts from zero; states (threads, PSS ...) are this reading's."""
        return _since(self, before)

    @classmethod
    def pooled(cls, windows: Iterable[Window]) -> Window:
        """One window holding the amounts of ``windows`` (states: the largest seen)."""
        out = cls()
        for w in windows:
            out = _plus(out, w)
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Window:
        raw = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        raw = {k: v for k, v in raw.items() if k in known}
        raw["main"] = _process(raw.get("main") or {})
        raw["workers"] = [_process(w) for w in raw.get("workers") or []]
        raw["stages"] = {k: (float(v[0]), float(v[1])) for k, v in (raw.get("stages") or {}).items()}
        return cls(**raw)

    # -- figures: shares are of the window's time (or, where said, of the loop's); cores are CPU-s per s --

    @property
    def samples_per_s(self) -> float:
        """Samples handed out per second of the loop."""
        return self.samples / self.loop_s if self.loop_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.loop_s / 1e6 if self.loop_s > 0 else 0.0

    @property
    def batch_s(self) -> float:
        """Seconds of the loop per batch."""
        return self.loop_s / self.batches if self.batches else 0.0

    @property
    def batch_step_s(self) -> float:
        """Seconds of the step (outside ``next()``) per batch: a pass's first batch comes without one."""
        return self.step_s / max(1, self.batches - self.starts) if self.batches else 0.0

    @property
    def stall(self) -> float:
        """Share of the loop's time spent waiting for data."""
        return self.wait_s / self.loop_s if self.loop_s > 0 else 0.0

    @property
    def step(self) -> bool:
        """A training step ran between batches: a tenth of the loop's time or more was spent outside ``next()``."""
        return self.loop_s > 0 and self.step_s >= STEP_SHARE * self.loop_s

    @property
    def producers(self) -> int:
        """The processes that made the batches: the workers, or the main process."""
        return max(1, len(self.workers))

    @property
    def main_busy(self) -> float:
        """The loop thread running or runnable for the loader (inside ``next()``: receiving batches, or making
        them without workers), as a share of the loop's time; the step is not the loader's, so a loop that
        mostly runs its step shows a small share however busy ``next()`` itself is."""
        return min(1.0, (self.wait_cpu_s + self._wait_runq_s) / self.loop_s) if self.loop_s > 0 else 0.0

    @property
    def main_producing(self) -> float:
        """Without workers: the main process's threads running or runnable, summed, as a share of the time the
        loop was not running its step (the time it had to make batches in). May pass 1 with helper threads."""
        free = self.loop_s - self.step_s if self.step else self.loop_s
        busy = self.wait_cpu_s + self._wait_runq_s + self.helper_cpu_s + self.helper_runq_s
        return busy / free if free > 0 else 0.0

    @property
    def data_wait(self) -> float:
        """Share of the loop's time inside ``next()`` not computing: waiting for the producers."""
        if self.loop_s <= 0:
            return 0.0
        return max(0.0, self.wait_s - self.wait_cpu_s - self._wait_runq_s) / self.loop_s

    @property
    def _wait_runq_s(self) -> float:
        # the loop thread waits for a core only while it is runnable: while it computes, in next() or in the step
        if self.loop_cpu_s <= 0:
            return 0.0
        return self.loop_runq_s * min(1.0, self.wait_cpu_s / self.loop_cpu_s)

    @property
    def helper_cpu_s(self) -> float:
        """CPU of the main process's threads other than the loop's (pin memory, decoders, loader threads); a CPU
        step's own threads left out."""
        return max(0.0, self.main.cpu_s - self.loop_cpu_s - self.step_others_s)

    @property
    def helper_runq_s(self) -> float:
        return max(0.0, self.main.runq_s - self.loop_runq_s)

    @property
    def main_process_busy(self) -> float:
        """Every thread of the main process running or runnable for the loader, in cores: the loop thread's
        share (:attr:`main_busy`) and its other threads' CPU and run-queue wait per second."""
        others = (self.helper_cpu_s + self.helper_runq_s) / self.seconds if self.seconds > 0 else 0.0
        return self.main_busy + others

    @property
    def main_cores(self) -> float:
        """Cores the main process used for the loader: the loop thread's CPU inside ``next()`` and its other
        threads' CPU, per second of the window."""
        return (self.wait_cpu_s + self.helper_cpu_s) / self.seconds if self.seconds > 0 else 0.0

    @property
    def main_threads(self) -> dict[str, float]:
        """Cores used by the main process's threads other than the loop's, by name, busiest first."""
        named = dict(self.main.by_thread)
        named.pop("MainThread", None)
        return _per_second(named, self.seconds)

    @property
    def receiving(self) -> tuple[float, float]:
        """(wall, CPU) share of the time the main process spent rebuilding received batches: as the sweep's
        envelope timed it, else (with workers) the loop thread's CPU inside ``next()``."""
        if not self.workers or self.seconds <= 0:
            return 0.0, 0.0
        if self.recv_s is not None and self.recv_cpu_s is not None:
            return self.recv_s / self.seconds, self.recv_cpu_s / self.seconds
        share = self.wait_cpu_s / self.loop_s if self.loop_s > 0 else 0.0
        return share, share

    @property
    def pinning(self) -> float:
        return (self.pin_s or 0.0) / self.seconds if self.seconds > 0 else 0.0

    @property
    def worker_cores(self) -> list[float]:
        """Per worker, cores used by all its threads."""
        return [w.cpu_s / self.seconds if self.seconds > 0 else 0.0 for w in self.workers]

    @property
    def worker_busy(self) -> list[float]:
        """Per worker, its threads running or runnable, summed, per second: its demand for cores."""
        return [(w.cpu_s + w.runq_s) / self.seconds if self.seconds > 0 else 0.0 for w in self.workers]

    @property
    def per_worker_busy(self) -> float:
        busy = self.worker_busy
        return sum(busy) / len(busy) if busy else 0.0

    @property
    def worker_threads(self) -> dict[str, float]:
        """Cores used by the workers' threads, by name, summed over workers."""
        named: dict[str, float] = {}
        for w in self.workers:
            for k, v in w.by_thread.items():
                named[k] = named.get(k, 0.0) + v
        return _per_second(named, self.seconds)

    @property
    def cores_used(self) -> float:
        """Cores the loader's processes used, every thread."""
        cpu = self.main.cpu_s + sum(w.cpu_s for w in self.workers)
        return cpu / self.seconds if self.seconds > 0 else 0.0

    @property
    def machine_cores(self) -> float:
        """Cores busy on the CPUs we may use, every program."""
        return self.machine_cpu_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def others_cores(self) -> float:
        """Cores other programs used meanwhile."""
        return max(0.0, self.machine_cores - self.cores_used)

    @property
    def iowait(self) -> float:
        """Share of the CPUs' time idle waiting for I/O."""
        total = self.machine_cpu_s + self.machine_iowait_s
        return self.machine_iowait_s / total if total > 0 else 0.0

    @property
    def producer_looks(self) -> dict[str, int]:
        """Looks at the producers by ``"kind/call"``: the workers', else the main process's (its loader threads,
        or its loop thread inside ``next()``)."""
        out: dict[str, int] = {}
        for p in self.workers or [self.main]:
            for k, n in p.looks.items():
                out[k] = out.get(k, 0) + int(n)
        return out

    @property
    def waits(self) -> dict[str, float]:
        """What the producers did, as shares of their time (empty when nobody looked): ``computing``,
        ``runq`` (runnable, waiting for a core), then each kind of wait of :mod:`fastdata.core.system`
        (``network``, ``disk``, ``lock``, ``sleep``, ``idle``: waiting for work, ``other``). The looks give the
        shares; the running ones are split into computing and waiting for a core by the producers' CPU and
        run-queue seconds."""
        looks = self.producer_looks
        total = sum(looks.values())
        if not total:
            return {}
        kinds = {k: 0.0 for k in WAIT_KINDS}
        for counted, n in looks.items():
            kind = split(counted)[0]
            kinds[kind if kind in kinds else "other"] += n / total
        procs = self.workers or [self.main]
        cpu, runq = sum(p.cpu_s for p in procs), sum(p.runq_s for p in procs)
        if cpu + runq > 0:
            kinds["runq"] = kinds["computing"] * runq / (cpu + runq)
            kinds["computing"] -= kinds["runq"]
        return kinds

    def wait_calls(self, kind: str) -> list[str]:
        """The system calls the producers were seen waiting in for ``kind``, most seen first."""
        calls: dict[str, int] = {}
        for counted, n in self.producer_looks.items():
            k, call = split(counted)
            if k == kind and call:
                calls[call] = calls.get(call, 0) + n
        return sorted(calls, key=lambda c: -calls[c])

    def stage_ms(self, totals: Mapping[str, tuple[float, float]] | None = None) -> dict[str, float | None]:
        """Milliseconds per sample in each stage (None where nothing was timed), from ``totals`` where
        given (a whole run's, for datasets that do a stage's work outside every window)."""
        out: dict[str, float | None] = {}
        for s in STAGES:
            secs, items = (totals or {}).get(s) or self.stages.get(s) or (0.0, 0.0)
            if not items:
                secs, items = self.stages.get(s, (0.0, 0.0))
            out[s] = 1000.0 * secs / items if items > 0 else None
        return out

    def stage_busy(self, producers: int | None = None) -> dict[str, float | None]:
        """Share of the producers' time in each stage (None where nothing was timed). The producers are the
        worker processes (or the main process), unless given (the loader threads, in thread mode)."""
        n = producers or self.producers
        out: dict[str, float | None] = {}
        for s in STAGES:
            secs, items = self.stages.get(s, (0.0, 0.0))
            out[s] = secs / (self.seconds * n) if items > 0 and self.seconds > 0 else None
        return out

    @property
    def dstate(self) -> float:
        """Share of the looks that found a loader thread in D state."""
        return self.blocked_looks / self.looks if self.looks else 0.0

    def blkio(self, producers: int | None = None) -> float:
        """Block-I/O delay of every loader thread, per producer (see :meth:`stage_busy`), as a share of the time."""
        total = self.main.blkio_s + sum(w.blkio_s for w in self.workers)
        return total / (self.seconds * (producers or self.producers)) if self.seconds > 0 else 0.0

    @property
    def device_mb_s(self) -> float:
        total = self.main.read_bytes + sum(w.read_bytes for w in self.workers)
        return total / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def read_mb_s(self) -> float:
        total = self.main.rchar + sum(w.rchar for w in self.workers)
        return total / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def first_wait(self) -> float:
        """Share of the time spent waiting for passes' first batches (start-ups)."""
        return self.first_wait_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def switches(self) -> tuple[float, float]:
        """(voluntary, involuntary) context switches per second, every thread of every process."""
        procs = [self.main, *self.workers]
        if self.seconds <= 0:
            return 0.0, 0.0
        return sum(p.voluntary for p in procs) / self.seconds, sum(p.involuntary for p in procs) / self.seconds

    @property
    def pss(self) -> float:
        """PSS of the loader's processes at the end, bytes (0: not read)."""
        return self.main.pss + sum(w.pss for w in self.workers)

    @property
    def data_s(self) -> float | None:
        """Seconds one process needs to make one batch, from the stage times (None: the dataset times no
        stage but collate)."""
        if not self.batches:
            return None
        ms = self.stage_ms()
        known = [v for s, v in ms.items() if v is not None and s != "collate"]
        if not known:
            return None
        return (sum(known) + (ms.get("collate") or 0.0)) * (self.samples / self.batches) / 1000


T = TypeVar("T")


class OfWindow(Generic[T]):
    """A record's figure that is its window's (``record.window``), under the window's name: never a copy."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, record: Any, owner: type | None = None) -> T:
        return self if record is None else getattr(record.window, self.name)  # type: ignore[return-value]


WAIT_KINDS = ("computing", "runq", *KINDS[1:])  # the shares of Window.waits, in order
STEP_SHARE = 0.1  # the loop spends this share of its time outside next(): it runs a training step


def _per_second(named: Mapping[str, float], seconds: float, least: float = 0.005) -> dict[str, float]:
    if seconds <= 0:
        return {}
    cores = {k: v / seconds for k, v in named.items()}
    return {k: v for k, v in sorted(cores.items(), key=lambda kv: -kv[1]) if v >= least}


def _process(data: Mapping[str, Any] | Process) -> Process:
    if isinstance(data, Process):
        return data
    known = {f.name for f in dataclasses.fields(Process)}
    return Process(**{k: v for k, v in data.items() if k in known})


def _since(after: Any, before: Any) -> Any:
    """``after - before`` field by field: amounts subtract (never below zero), states are ``after``'s,
    lists go by index (an entry new since ``before`` counts from zero), dicts by key."""
    out = {}
    for f in dataclasses.fields(after):
        a, b = getattr(after, f.name), getattr(before, f.name)
        if f.metadata.get("last"):
            out[f.name] = a
        elif isinstance(a, Process):
            out[f.name] = _since(a, b)
        elif isinstance(a, list):
            out[f.name] = [_since(x, b[i]) if i < len(b) else x for i, x in enumerate(a)]
        elif isinstance(a, dict):
            out[f.name] = {k: _minus(v, b.get(k)) for k, v in a.items()}
        elif a is None or b is None:
            out[f.name] = a if b is None else None
        else:
            out[f.name] = max(type(a)(0), a - b)
    return type(after)(**out)


def _minus(a: Any, b: Any) -> Any:
    if b is None:
        return a
    if isinstance(a, tuple):
        return tuple(max(0.0, x - y) for x, y in zip(a, b))
    return max(0.0, a - b)


def _plus(a: Any, b: Any) -> Any:
    out = {}
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.metadata.get("last"):
            out[f.name] = max(x, y)
        elif isinstance(x, Process):
            out[f.name] = _plus(x, y)
        elif isinstance(x, list):
            n = max(len(x), len(y))
            out[f.name] = [
                _plus(x[i], y[i]) if i < len(x) and i < len(y) else (x[i] if i < len(x) else y[i]) for i in range(n)
            ]
        elif isinstance(x, dict):
            keys = dict.fromkeys([*x, *y])
            out[f.name] = {k: _add(x.get(k), y.get(k)) for k in keys}
        elif x is None or y is None:
            out[f.name] = y if x is None else x
        else:
            out[f.name] = x + y
    return type(a)(**out)


def _add(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tuple):
        return tuple(x + y for x, y in zip(a, b))
    return a + b


__all__ = ["STEP_SHARE", "WAIT_KINDS", "OfWindow", "Process", "Window"]
