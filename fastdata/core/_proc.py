"""The one reader of ``/proc``: what every process and thread of a loader does, and the machine around it.

Every other part of fastdata that needs a ``/proc`` file asks here (the loader's probe, the stage table's
own counters, open descriptors, memory), so there is one place that knows the files' layouts. Readings are
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
* :func:`memory_of` (PSS and USS), :func:`open_fds`, :func:`open_fd_targets`, :func:`rss`,
  :func:`own_counters` (this process, exited threads included), :func:`thread_runq`,
  :func:`procs_blocked`, :func:`delay_accounting`, :func:`cpu_model`.

Only the standard library: this module sits in ``fastdata.core``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields

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
    return memory_of(pid)[0]


def memory_of(pid: int) -> tuple[float, float]:
    """(PSS, USS) of process ``pid`` in bytes, from one read of ``/proc/PID/smaps_rollup`` (zeros where it
    cannot be read). PSS shares each page among the processes mapping it; USS counts the pages no other
    process shares: what the process adds."""
    text = _read(f"/proc/{pid}/smaps_rollup") or ""
    pss_kb = uss_kb = 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            pss_kb = int(line.split()[1])
        elif line.startswith(("Private_Clean:", "Private_Dirty:")):
            uss_kb += int(line.split()[1])
    return pss_kb * 1024.0, uss_kb * 1024.0


def rss() -> float:
    """This process's resident memory in bytes, from ``/proc/self/statm`` (0 where it cannot be read)."""
    try:
        return float((_read("/proc/self/statm") or "").split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, IndexError):
        return 0.0


def open_fds(pid: int) -> int:
    """Open file descriptors of process ``pid`` (0 where it cannot be read)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def open_fd_targets() -> list[str]:
    """What this process's descriptors point at now (from ``/proc/self/fd``): one entry per descriptor
    (``socket:[...]``, ``pipe:[...]`` for the anonymous ones)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:  # closed since listed (the listing's own descriptor among them)
            continue
    return out


def thread_runq() -> float:
    """Seconds the calling thread waited for a core (``/proc/thread-self/schedstat``)."""
    parts = (_read("/proc/thread-self/schedstat") or "").split()
    return int(parts[1]) / 1e9 if len(parts) > 1 else 0.0


def own_counters() -> list[float]:
    """This process's (CPU-seconds, run-queue seconds, voluntary and involuntary switches), every thread,
    exited threads' CPU and switches included (``getrusage``; the run-queue wait of the living threads)."""
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


def procs_blocked() -> int:
    """Processes of the machine in uninterruptible sleep now (``procs_blocked`` of ``/proc/stat``)."""
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("procs_blocked"):
            return int(line.split()[1])
    return 0


def delay_accounting() -> bool:
    """Whether the kernel's per-task delay accounting (block-I/O delay) is on."""
    return (_read("/proc/sys/kernel/task_delayacct") or "").strip() == "1"


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` ("" where it is not there)."""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


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
        self.cpu = 0.0  # CPU-seconds the looking thread used: the probe's own cost, not the loader's
        self.native_id: int | None = None
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
        self.native_id = threading.get_native_id()
        start = time.thread_time()
        while not self._stop.wait(self.interval):
            blocked = self._look()
            self.looks += 1
            self.blocked += blocked
            self.cpu = time.thread_time() - start

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


__all__ = [
    "CLK_TCK",
    "DStateSampler",
    "ProcessCounters",
    "ProcessProbe",
    "ThreadReading",
    "cpu_model",
    "delay_accounting",
    "machine_busy",
    "memory_of",
    "open_fd_targets",
    "open_fds",
    "own_counters",
    "procs_blocked",
    "pss",
    "python_thread_names",
    "read_thread",
    "rss",
    "thread_runq",
    "usable_cpus",
]
