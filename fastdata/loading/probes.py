"""Probes of a running loader: what every process and thread of it does, read from ``/proc``, and the
stage table its workers write into shared memory.

Used by ``fastdata bench`` (sweeps) and meant for a monitor inside a training loop, so every reading is
cheap (a few small files per thread) and cumulative: the difference of two readings is a window.

* :class:`ProcessProbe`: one process, every thread of it (helper threads included: a video decoder's
  watchdog thread, a pool of fetch threads, the pin-memory thread): CPU and run-queue wait from
  ``/proc/PID/task/TID/schedstat``, voluntary and involuntary context switches from ``.../status``,
  block-I/O delay (``delayacct_blkio_ticks``, field 42 of ``.../stat``; zero unless the kernel's delay
  accounting is on, ``sysctl kernel.task_delayacct=1``), thread states, bytes read from the device and
  from anywhere (``/proc/PID/io``), PSS (``/proc/PID/smaps_rollup``). A thread that has exited keeps its
  last reading, so totals never go down.
* :class:`DStateSampler`: a background thread that looks at the states of the watched processes'
  threads a few times a second and counts the looks that found one in uninterruptible sleep (D: waiting
  for a disk, or an NFS/FUSE server).
* :func:`machine_busy`: CPU used by every process on the CPUs we may run on (the neighbours' share).
* :class:`StageTable`: one row per process (0: main, 1 + k: worker k) of stage totals (fetch, decode,
  transform, collate, from :mod:`fastdata.core.stages`) and of the marks of each epoch's first batch
  (when the worker started, when its ``worker_init_fn`` ended, when it began its first batch, how much it
  had read by then), from which a start-up splits into launching the process, its set-up, and filling
  a shuffle buffer. :class:`ProbeInit` (the workers' ``worker_init_fn``) attaches a worker to its row;
  :func:`batch_begin` / :func:`batch_end` are called around each batch's ``collate_fn``.

Only the standard library, numpy and torch: this module sits in ``fastdata.loading``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from time import perf_counter

import torch

from fastdata.core import stages
from fastdata.core.stages import STAGES

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


@dataclass
class ThreadReading:
    """Cumulative counters of one thread. Times in seconds."""

    name: str = ""
    cpu: float = 0.0
    runq: float = 0.0
    voluntary: int = 0
    involuntary: int = 0
    blkio: float = 0.0
    state: str = "?"


def read_thread(pid: int, tid: int) -> ThreadReading | None:
    """One thread's counters, or None when it has gone."""
    base = f"/proc/{pid}/task/{tid}"
    stat = _read(base + "/stat")
    if stat is None:
        return None
    t = ThreadReading()
    # the name is in parentheses and may hold spaces or parentheses itself: split after the last ")"
    left, _, rest = stat.rpartition(")")
    t.name = left.partition("(")[2]
    parts = rest.split()
    if parts:
        t.state = parts[0]
    if len(parts) > 39:
        t.blkio = int(parts[39]) / CLK_TCK  # field 42 of the line: delayacct_blkio_ticks
    sched = _read(base + "/schedstat")
    if sched:
        on, wait, *_ = sched.split()
        t.cpu, t.runq = int(on) / 1e9, int(wait) / 1e9
    elif len(parts) > 12:
        t.cpu = (int(parts[11]) + int(parts[12])) / CLK_TCK  # utime + stime, in ticks
    status = _read(base + "/status") or ""
    for line in status.splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            t.voluntary = int(line.split()[1])
        elif line.startswith("nonvoluntary_ctxt_switches"):
            t.involuntary = int(line.split()[1])
    return t


@dataclass
class ProcessCounters:
    """Counters of one process, summed over its threads (cumulative, or a window's differences).

    Attributes:
        cpu (float): CPU-seconds, every thread.
        runq (float): seconds threads were runnable but waiting for a core (another program held it).
        voluntary, involuntary (int): context switches: a thread gave up its core to wait (I/O, a lock,
            a queue), or was pushed off it (CPU pressure: more runnable threads than cores).
        blkio (float): seconds threads waited for block I/O (delay accounting; 0 when it is off).
        read_bytes (int): bytes read from the storage device (``read_bytes`` of ``/proc/PID/io``): what
            the page cache did not hold.
        rchar (int): bytes read through any read call (files, sockets, pipes, the page cache).
        threads (int): threads alive at the reading.
        dstate (int): threads in uninterruptible sleep (D) at the reading.
        by_thread (dict[str, float]): CPU-seconds per thread name (threads of one name summed).
    """

    cpu: float = 0.0
    runq: float = 0.0
    voluntary: int = 0
    involuntary: int = 0
    blkio: float = 0.0
    read_bytes: int = 0
    rchar: int = 0
    threads: int = 0
    dstate: int = 0
    by_thread: dict[str, float] = field(default_factory=dict)

    def minus(self, before: ProcessCounters) -> ProcessCounters:
        """The window from ``before`` to this reading (threads and D-state as of this reading)."""
        out = ProcessCounters(threads=self.threads, dstate=self.dstate)
        for f in fields(self):
            if f.name in ("threads", "dstate", "by_thread"):
                continue
            setattr(out, f.name, max(0, getattr(self, f.name) - getattr(before, f.name)))
        out.by_thread = {
            k: v - before.by_thread.get(k, 0.0) for k, v in self.by_thread.items() if v - before.by_thread.get(k, 0.0)
        }
        return out


class ProcessProbe:
    """Reads one process's counters over all its threads; a thread that exited keeps its last reading.

    Args:
        pid (int): the process.
        skip (Iterable[int]): thread ids to leave out (the main thread of a training loop, whose CPU
            is the step's, when that is counted apart).
        names (Callable[[], dict[int, str]] | None): thread names by native id, for threads whose
            ``/proc`` name says nothing (Python does not name its OS threads: every one is "python");
            :func:`python_thread_names` for the calling process.
    """

    def __init__(self, pid: int, skip: Iterable[int] = (), names: Callable[[], dict[int, str]] | None = None) -> None:
        self.pid = pid
        self.skip = set(skip)
        self.names = names
        self._seen: dict[int, ThreadReading] = {}
        self._io = (0, 0)
        self.alive = True

    def read(self) -> ProcessCounters:
        """Cumulative counters (since each thread started)."""
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
        except OSError:
            tids = []
            self.alive = False
        states: list[str] = []
        named = self.names() if self.names is not None else {}
        for tid in tids:
            if tid in self.skip:
                continue
            reading = read_thread(self.pid, tid)
            if reading is not None:
                reading.name = named.get(tid, reading.name)
                self._seen[tid] = reading
                states.append(reading.state)
        io = _read(f"/proc/{self.pid}/io")
        if io:
            values = dict(line.split(": ") for line in io.splitlines() if ": " in line)
            self._io = (int(values.get("read_bytes", 0)), int(values.get("rchar", 0)))
        out = ProcessCounters(read_bytes=self._io[0], rchar=self._io[1], threads=len(states))
        out.dstate = sum(s == "D" for s in states)
        for t in self._seen.values():
            out.cpu += t.cpu
            out.runq += t.runq
            out.voluntary += t.voluntary
            out.involuntary += t.involuntary
            out.blkio += t.blkio
            out.by_thread[t.name] = out.by_thread.get(t.name, 0.0) + t.cpu
        return out

    def thread(self, tid: int) -> ThreadReading | None:
        """The last reading of thread ``tid`` (None before it was read)."""
        return self._seen.get(tid)

    def pss(self) -> float:
        """Proportional set size in bytes (shared pages divided among their processes), 0 if unreadable."""
        return pss(self.pid)


def python_thread_names() -> dict[int, str]:
    """This process's Python threads' names by native thread id (``fastdata-decode``, ``MainThread`` ...)."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def pss(pid: int) -> float:
    """PSS of process ``pid`` in bytes, from ``/proc/PID/smaps_rollup`` (0 where it cannot be read)."""
    text = _read(f"/proc/{pid}/smaps_rollup") or ""
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return float(line.split()[1]) * 1024
    return 0.0


def open_fds(pid: int) -> int:
    """Open file descriptors of process ``pid`` (0 where it cannot be read)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class DStateSampler:
    """Counts, a few times a second, whether a thread of the watched processes is in D state.

    ``/proc`` shows a thread's state only at the moment it is read, and a read that waits 5 ms on a disk
    is over before a window's end: so a background thread looks every ``interval`` seconds. It reads one
    small file per thread per look: about 0.1 ms of CPU per look for a few processes.

    Args:
        pids (Sequence[int]): the processes to watch (changeable with :meth:`watch`).
        interval (float): seconds between looks. Defaults to 0.05.
    """

    def __init__(self, pids: Sequence[int] = (), interval: float = 0.05) -> None:
        self.interval = interval
        self._pids = list(pids)
        self.looks = 0
        self.blocked = 0  # looks that found at least one of our threads in D state
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pids: Sequence[int]) -> None:
        self._pids = list(pids)

    def start(self) -> DStateSampler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fastdata-dstate", daemon=True)
            self._thread.start()
        return self

    def _look(self) -> bool:
        for pid in self._pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                stat = _read(f"/proc/{pid}/task/{tid}/stat")
                if stat and stat.rpartition(")")[2].split()[:1] == ["D"]:
                    return True
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            blocked = self._look()
            self.looks += 1
            self.blocked += blocked

    def counts(self) -> tuple[int, int]:
        """(looks so far, looks that found a thread in D state)."""
        return self.looks, self.blocked

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
            self._thread = None


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), or all of them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def machine_busy(cpus: Sequence[int]) -> tuple[float, float]:
    """(CPU-seconds used, seconds idle waiting for I/O) so far, summed over ``cpus``, from ``/proc/stat``."""
    text = _read("/proc/stat") or ""
    want = {f"cpu{c}" for c in cpus}
    busy = iowait = 0.0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name not in want:
            continue
        v = [int(x) for x in rest.split()]
        # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user already
        busy += sum(v[:8]) - v[3] - v[4]
        iowait += v[4]
    return busy / CLK_TCK, iowait / CLK_TCK


# ---- the stage table -------------------------------------------------------------------------------------

NSTAGE = 2 * len(STAGES)
# the marks of the latest epoch's first batch in a process's row, after the stage totals
MARKS = ("init_start", "init_end", "first_begin", "first_read", "first_read_s", "first_n", "epoch", "pid")
# the process's own counters, written by itself (cumulative over the processes that held the row): a
# worker that lives one short epoch exits before anyone reads its /proc files
SELF = ("cpu", "runq", "voluntary", "involuntary")
SELF_EVERY = 0.02  # seconds between two updates of them (a getrusage and a few small reads)
_COL = {name: NSTAGE + i for i, name in enumerate(MARKS + SELF)}
COLUMNS = NSTAGE + len(MARKS) + len(SELF)


class StageTable:
    """A shared-memory table: per process (row 0: main, 1 + k: worker k), stage totals and the marks of
    its latest epoch's first batch; and the epoch counter the main process bumps at each epoch's start.

    Pickled into ``spawn`` workers by the DataLoader, the tensors travel as shared memory. Clock values
    are ``time.perf_counter()`` readings: CLOCK_MONOTONIC on Linux, one clock for every process.

    Args:
        slots (int): rows; the main process and each worker need one.
    """

    def __init__(self, slots: int) -> None:
        self.tensor = torch.zeros((slots, COLUMNS), dtype=torch.float64).share_memory_()
        self.control = torch.zeros(2, dtype=torch.float64).share_memory_()  # epoch, when it started

    def attach(self, slot: int) -> None:
        """Probe the calling process, flushing into row ``slot`` (counting on from what it holds: the
        workers of a new epoch take over the rows of the last epoch's)."""
        global _attached
        row = self.tensor.numpy()[slot]
        stages.enable(row[:NSTAGE], start=row[:NSTAGE].tolist())
        row[_COL["pid"]] = os.getpid()
        _attached = _Attached(self, slot)
        _attached.read_at_end = _read_so_far()  # a replaced worker's row holds its predecessor's totals

    def new_epoch(self) -> None:
        """Called by the main process just before an epoch's ``iter(loader)``: each process marks its next
        batch as that epoch's first."""
        c = self.control.numpy()
        c[0] += 1
        c[1] = perf_counter()

    def totals(self) -> dict[str, tuple[float, float]]:
        """``{stage: (seconds, items)}`` summed over every process."""
        sums = self.tensor.numpy()[:, :NSTAGE].sum(axis=0)
        return {name: (float(sums[2 * i]), float(sums[2 * i + 1])) for i, name in enumerate(STAGES)}

    def counters(self, slot: int) -> dict[str, float]:
        """Row ``slot``'s own process counters (see :data:`SELF`): CPU-seconds and run-queue seconds of all
        its threads, voluntary and involuntary context switches; summed over the processes that held it."""
        row = self.tensor.numpy()[slot]
        return {name: float(row[_COL[name]]) for name in SELF}

    def marks(self, slot: int) -> dict[str, float]:
        """The marks of row ``slot`` (see :data:`MARKS`)."""
        row = self.tensor.numpy()[slot]
        return {name: float(row[_COL[name]]) for name in MARKS}

    @property
    def epoch(self) -> int:
        return int(self.control.numpy()[0])

    @property
    def epoch_started(self) -> float:
        return float(self.control.numpy()[1])


class _Attached:
    """This process's row, and what it has read up to the end of its last batch."""

    def __init__(self, table: StageTable, slot: int) -> None:
        self.table, self.slot = table, slot
        self.row = table.tensor.numpy()[slot]
        self.epoch = -1.0
        self.read_at_end = (0.0, 0.0)  # (items, seconds) read by the end of the last batch
        self.first = False
        # the row's counters count on from the process that held it before; ours from now
        self.base = [float(self.row[_COL[n]]) for n in SELF]
        self.start = own_counters()
        self.updated = 0.0

    def update(self, now: float) -> None:
        current = own_counters()
        for i, name in enumerate(SELF):
            self.row[_COL[name]] = self.base[i] + max(0.0, current[i] - self.start[i])
        self.updated = now


def own_counters() -> list[float]:
    """This process's (CPU-seconds, run-queue seconds, voluntary and involuntary switches), every thread,
    exited threads' CPU and switches included (``getrusage``)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    runq = 0.0
    try:
        for tid in os.listdir("/proc/self/task"):
            sched = _read(f"/proc/self/task/{tid}/schedstat")
            if sched:
                runq += int(sched.split()[1]) / 1e9
    except OSError:
        pass
    return [ru.ru_utime + ru.ru_stime, runq, float(ru.ru_nvcsw), float(ru.ru_nivcsw)]


_attached: _Attached | None = None


def _read_so_far() -> tuple[float, float]:
    """(samples read, seconds fetching, decoding and transforming) by this process so far."""
    tot = stages.totals()
    items = max(tot["fetch"][1], tot["decode"][1], tot["transform"][1])
    return items, tot["fetch"][0] + tot["decode"][0] + tot["transform"][0]


def batch_begin() -> None:
    """Called as a batch's ``collate_fn`` starts: the first batch of an epoch records its marks."""
    a = _attached
    if a is None:
        return
    epoch = float(a.table.control.numpy()[0])
    a.first = epoch != a.epoch
    if a.first:
        a.epoch = epoch
        items, secs = _read_so_far()
        row = a.row
        row[_COL["first_begin"]] = perf_counter()
        row[_COL["first_read"]] = items - a.read_at_end[0]
        row[_COL["first_read_s"]] = secs - a.read_at_end[1]


def batch_end(n: int) -> None:
    """Called as a batch's ``collate_fn`` returns ``n`` samples: remembers what was read, flushes."""
    a = _attached
    if a is None:
        return
    if a.first:
        a.row[_COL["first_n"]] = n
        a.row[_COL["epoch"]] = a.epoch
    a.read_at_end = _read_so_far()
    now = perf_counter()
    if now - a.updated >= SELF_EVERY or a.first:
        a.update(now)
    stages.flush()


def detach() -> None:
    """Stop probing the calling process."""
    global _attached
    _attached = None
    stages.disable()


class ProbeInit:
    """``worker_init_fn`` that attaches each worker to its row of a :class:`StageTable` (marking when it
    started and when its set-up ended), then runs the user's own.

    Args:
        table (StageTable): where the workers' totals go.
        then (Callable[[int], object] | None): the user's ``worker_init_fn``.
    """

    def __init__(self, table: StageTable, then: Callable[[int], object] | None = None) -> None:
        self.table, self.then = table, then

    def __call__(self, worker_id: int) -> None:
        started = perf_counter()
        slot = 1 + worker_id
        self.table.attach(slot)
        row = self.table.tensor.numpy()[slot]
        row[_COL["init_start"]] = started
        row[_COL["init_end"]] = 0.0
        if self.then is not None:
            self.then(worker_id)
        row[_COL["init_end"]] = perf_counter()


@dataclass
class StartSplit:
    """Where the wait for an epoch's first batch went, in seconds.

    Attributes:
        total (float): from ``iter(loader)`` to the first batch in the training loop.
        launch (float): starting the worker process (fork: copying the parent's page tables; spawn: a
            fresh interpreter importing torch and unpickling the dataset), until its ``worker_init_fn``.
        init (float): the worker's set-up: its ``worker_init_fn``, and whatever the dataset does before
            reading that no stage probe times (opening files or clients, building an index).
        fill (float): reading samples beyond the first batch before yielding it (a shuffle buffer).
        produce (float): reading the first batch's own samples.
        deliver (float): collating it and sending it to the training loop.
        read (float): samples the producing process read before its first batch.
        batch (float): samples in that first batch.
    """

    total: float = 0.0
    launch: float = 0.0
    init: float = 0.0
    fill: float = 0.0
    produce: float = 0.0
    deliver: float = 0.0
    read: float = 0.0
    batch: float = 0.0

    PARTS = ("launch", "init", "fill", "produce", "deliver")

    def largest(self) -> tuple[str, float]:
        name = max(self.PARTS, key=lambda p: getattr(self, p))
        return name, float(getattr(self, name))


def start_split(
    table: StageTable, slot: int, asked: float, started: float, arrived: float, restarted: bool
) -> StartSplit:
    """Split the wait for an epoch's first batch (``iter(loader)`` called at ``asked``, returned at
    ``started``; the batch in the loop at ``arrived``), from the marks of the process in row ``slot``
    (the one that made it: worker 0, or the main process).

    Launching is the longer of ``iter(loader)`` itself (under fork it forks every worker before any
    gets work: each fork copies the parent's page tables) and the time until the worker's
    ``worker_init_fn`` ran (under spawn the child boots after ``iter`` returns).

    Args:
        restarted (bool): the worker process was started for this epoch (not persistent, or the first).
    """
    m = table.marks(slot)
    split = StartSplit(total=max(0.0, arrived - asked))
    if not m["first_begin"] or m["first_begin"] < asked:
        return split  # the marks are an older epoch's: nothing to split
    ready = started
    split.launch = max(0.0, started - asked)
    if restarted and m["init_start"] >= asked:
        split.launch = max(split.launch, m["init_start"] - asked)
        init_end = m["init_end"] or m["init_start"]
        split.init = max(0.0, init_end - m["init_start"])
        ready = max(started, init_end)
    span = max(0.0, m["first_begin"] - ready)  # from ready to reading until the first collate
    read_s = min(m["first_read_s"], span)
    split.init += span - read_s  # time before the first batch no stage accounts for: set-up
    split.read, split.batch = m["first_read"], m["first_n"]
    if split.read > split.batch > 0:
        split.fill = read_s * (1 - split.batch / split.read)
    split.produce = read_s - split.fill
    split.deliver = max(0.0, arrived - m["first_begin"])
    return split


def thread_cpu() -> float:
    """CPU-seconds of the calling thread (``time.thread_time``)."""
    return time.thread_time()


__all__ = [
    "COLUMNS",
    "MARKS",
    "SELF",
    "DStateSampler",
    "ProbeInit",
    "ProcessCounters",
    "ProcessProbe",
    "StageTable",
    "StartSplit",
    "ThreadReading",
    "batch_begin",
    "batch_end",
    "detach",
    "machine_busy",
    "open_fds",
    "own_counters",
    "pss",
    "python_thread_names",
    "read_thread",
    "start_split",
    "thread_cpu",
    "usable_cpus",
]
