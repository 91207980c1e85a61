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
* :class:`ThreadSampler`: a background thread that looks at the watched processes' threads a few times a
  second: what each producer is waiting on (its state, its system call and the descriptor it waits on:
  :mod:`fastdata.core.system` names the kind), and whether any thread is in uninterruptible sleep (D:
  waiting for a disk, or an NFS/FUSE server).
* :func:`machine_busy`: CPU used by every process on the CPUs we may run on (the neighbours' share).
* :func:`memory_of` (PSS and USS), :func:`open_fds`, :func:`open_fd_targets`, :func:`rss`,
  :func:`own_counters` (this process, exited threads included), :func:`thread_runq`,
  :func:`procs_blocked`, :func:`delay_accounting`, :func:`cpu_model`.

Only the standard library (and :mod:`fastdata.core.system`, the rules): this module sits in ``fastdata.core``.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields

from fastdata.core.system import _waits as waits
from fastdata.core.system._thread_name import OWN, thread_name

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
                # a name once known is kept: a joined thread's task lingers in /proc a moment after Python
                # forgets it, and its kernel name ("python") must not replace its Python one
                known = self._seen.get(tid)
                reading.name = named.get(tid) or (known.name if known is not None else reading.name)
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


BUDGET = 100  # the pause between two looks is at least this many times a look's cost (~1% of a core) ...
MAX_PAUSE = 0.1  # ... and at most this: 10 looks a second whatever they cost (on a crowded machine a look took
# ~5 ms and the budget alone left 2-6 looks in a second's measurement: too few to tell a lock or the disk)


class ThreadSampler:
    """Looks, a few times a second, at what the loader's threads are doing (:mod:`fastdata.core.system`), and
    counts per process the looks of each kind of wait: the producers, not a window's end, since a read
    that waits 5 ms is over before anyone reads a file at a window's end.

    Each look reads, per watched worker process, every thread's state (``.../stat``) and, for a blocked
    one, its current system call (``.../syscall``) and the descriptors it waits on (``/proc/PID/fd/N``;
    a ``poll``'s array from ``/proc/PID/mem``, an epoll's from ``/proc/PID/fdinfo``). A worker counts as
    its main thread, unless that waits on a futex for one of its own threads (a decoder's helper, a
    fetch pool): then as what those do (``process_kind``). In the main process
    it looks at the loader threads (thread mode), or at the loop thread while it is inside ``next()``
    (the main process makes the batches itself, or receives them). It also counts the looks that found
    any thread of the loader in D state (uninterruptible sleep).

    About 0.1 ms of CPU per process per look, in its own thread (:attr:`cpu`, left out of the loader's
    figures); with many processes it looks less often, to stay within about 1% of a core.

    Args:
        interval (float): seconds between looks. Defaults to 0.025.
    """

    def __init__(self, interval: float = 0.025) -> None:
        self.interval = interval
        self._pids: list[int] = []
        self._main = 0
        self._loop = 0
        self._inside: Callable[[], bool] | None = None
        self._producers: Callable[[], Iterable[int]] | None = None
        self._queued: Callable[[int], bool] | None = None
        self._counts: dict[int, dict[str, int]] = {}
        self._mem: dict[int, int | None] = {}  # pid -> a descriptor of /proc/PID/mem (None: not readable)
        self._unix: set[int] = set()  # inodes of Unix-domain sockets (read again when an unknown socket is met)
        self._tcp: set[int] = set()  # ... and of sockets found not to be
        self.looks = 0
        self.blocked = 0  # looks that found at least one of the loader's threads in D state
        self.cpu = 0.0  # CPU-seconds the looking thread used: the probe's own cost, not the loader's
        self.native_id: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pids: Sequence[int]) -> None:
        """The worker processes to look at (each counted as one producer); the memory files of those no longer
        watched are closed (workers that do not persist are new processes every epoch)."""
        self._pids = list(pids)
        keep = {*self._pids, self._main}
        for pid in [p for p in self._mem if p not in keep]:
            mem = self._mem.pop(pid)
            if mem is not None:
                os.close(mem)

    def watch_main(
        self,
        pid: int,
        loop: int,
        inside: Callable[[], bool],
        producers: Callable[[], Iterable[int]] | None = None,
        queued: Callable[[int], bool] | None = None,
    ) -> None:
        """The main process ``pid``: its thread ``loop`` is looked at while ``inside()`` (it is in ``next()``),
        or, with ``producers``, the threads it names (loader threads), each counted apart; ``queued(tid)``
        tells whether a thread of this process that waits on a futex is waiting on a queue (for work, or
        for room for what it made: idle), which only its Python frames show."""
        self._main, self._loop, self._inside = pid, loop, inside
        self._producers, self._queued = producers, queued

    def start(self) -> ThreadSampler:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fastdata-looks", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        start = time.thread_time()
        pause = self.interval
        while not self._stop.wait(pause):
            before = time.thread_time()
            blocked = self._look()
            self.looks += 1
            self.blocked += blocked
            now = time.thread_time()
            self.cpu = now - start
            # many processes make a look dear: look less often, to keep within ~1% of a core
            pause = min(max(self.interval, BUDGET * (now - before)), MAX_PAUSE)

    def _count(self, pid: int, kind: str, call: str) -> None:
        counts = self._counts.setdefault(pid, {})
        k = waits.key(kind, call)  # type: ignore[arg-type]
        counts[k] = counts.get(k, 0) + 1

    def _look(self) -> bool:
        blocked = False
        for pid in self._pids:
            states = _states(pid)
            blocked = blocked or "D" in states.values()
            if pid in states:
                self._count(pid, *self._process(pid, pid, states))
        if self._main:
            states = _states(self._main)
            states.pop(self.native_id or -1, None)
            blocked = blocked or "D" in states.values()
            if self._producers is not None:
                for tid in self._producers():
                    if tid in states:
                        self._count(self._main, *self._thread_kind(self._main, tid, states[tid]))
            elif self._inside is not None and self._inside() and self._loop in states:
                self._count(self._main, *self._process(self._main, self._loop, states))
        return blocked

    def _process(self, pid: int, main: int, states: dict[int, str]) -> tuple[str, str]:
        first = self._thread_kind(pid, main, states[main])
        if first[0] != "lock":
            return first
        others, own = [], []
        for tid, s in states.items():
            if tid != main:
                kind = self._thread_kind(pid, tid, s, helper=True)
                others.append(kind)
                if thread_name(pid, tid).startswith(OWN):
                    own.append(kind)
        return waits.process_kind(first, others, own)  # type: ignore[arg-type]

    def _fd_kind(self, pid: int, fd: int) -> waits.FdKind:
        target = fd_target(pid, fd)
        if target and target.startswith("socket:[") and target[8:-1].isdigit():
            inode = int(target[8:-1])
            if inode not in self._unix and inode not in self._tcp:
                self._unix = unix_sockets()
                if inode not in self._unix:
                    self._tcp.add(inode)
        return waits.fd_kind(target, self._unix)

    def _thread_kind(self, pid: int, tid: int, state: str, helper: bool = False) -> tuple[waits.Kind, str]:
        if state == "R":
            return "computing", ""
        call, args = blocked_call(pid, tid)
        fds: list[waits.FdKind] | None = None
        if call in waits.POLLS or call in waits.EPOLLS:
            numbers = self._polled(pid, call, args)
            fds = None if numbers is None else [self._fd_kind(pid, n) for n in numbers]
            if fds is None and not _has_socket(pid):
                fds = ["pipe"]  # unreadable, but the process holds no socket: its pipes (a worker's queues)
        elif call in waits.ON_FD and args:
            fds = [self._fd_kind(pid, args[0])]
        kind = waits.kind_of(state, call, fds, helper)
        if kind == "lock" and pid == self._main and self._queued is not None and self._queued(tid):
            kind = "idle"
        return kind, call

    def _polled(self, pid: int, call: str, args: list[int]) -> list[int] | None:
        """The descriptors a poll-like call waits on (None: they could not be read)."""
        if call in waits.EPOLLS:
            return epoll_targets(pid, args[0]) if args else None
        if len(args) < 3:
            return None
        if pid not in self._mem:
            try:
                self._mem[pid] = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
            except OSError:
                self._mem[pid] = None
        mem = self._mem[pid]
        if mem is None:
            return None
        try:
            if call in ("poll", "ppoll"):
                n = min(args[1], 64)
                raw = os.pread(mem, 8 * n, args[0]) if n else b""
                return [fd for fd, _, _ in struct.iter_unpack("ihh", raw[: 8 * (len(raw) // 8)]) if fd >= 0]
            nfds = min(args[0], 1024)
            out: list[int] = []
            for ptr in args[1:3]:
                if ptr and nfds:
                    bits = int.from_bytes(os.pread(mem, (nfds + 7) // 8, ptr), "little")
                    out += [fd for fd in range(nfds) if bits >> fd & 1]
            return out
        except (OSError, OverflowError):
            return None

    def looked(self, pid: int) -> dict[str, int]:
        """Looks at process ``pid`` so far, by ``"kind/call"`` (``key``)."""
        return dict(self._counts.get(pid, {}))

    def counts(self) -> tuple[int, int]:
        """(looks so far, looks that found a thread in D state)."""
        return self.looks, self.blocked

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
            self._thread = None
        for mem in self._mem.values():
            if mem is not None:
                os.close(mem)
        self._mem = {}


def _states(pid: int) -> dict[int, str]:
    """Each thread's state letter (R, S, D ...) of process ``pid`` (empty when it has gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    out = {}
    for tid in tids:
        stat = _read(f"/proc/{pid}/task/{tid}/stat")
        if stat:
            out[int(tid)] = (stat.rpartition(")")[2].split() or ["?"])[0]
    return out


def blocked_call(pid: int, tid: int) -> tuple[str, list[int]]:
    """The system call thread ``tid`` is blocked in and its arguments, from ``/proc/PID/task/TID/syscall``
    (``("", [])`` when it runs, is in none, or the file cannot be read; an unknown number as ``"syscall N"``)."""
    parts = (_read(f"/proc/{pid}/task/{tid}/syscall") or "").split()
    if not parts or parts[0] == "running":
        return "", []
    try:
        nr = int(parts[0])
        args = [int(a, 16) for a in parts[1:7]]
    except ValueError:
        return "", []
    if nr < 0:
        return "", []  # blocked outside a system call (a page fault)
    return waits.SYSCALLS.get(nr, f"syscall {nr}"), args


def fd_target(pid: int, fd: int) -> str | None:
    """What descriptor ``fd`` of process ``pid`` points at (``socket:[...]``, ``pipe:[...]``, a path), or None."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def epoll_targets(pid: int, epfd: int) -> list[int] | None:
    """The descriptors epoll instance ``epfd`` of process ``pid`` watches (``tfd:`` of its fdinfo)."""
    text = _read(f"/proc/{pid}/fdinfo/{epfd}")
    if text is None:
        return None
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tfd:") and len(line.split()) > 1]


def unix_sockets() -> set[int]:
    """Inodes of the Unix-domain sockets of this network namespace (``/proc/net/unix``)."""
    out = set()
    for line in (_read("/proc/self/net/unix") or "").splitlines()[1:]:
        parts = line.split()
        if len(parts) > 6 and parts[6].isdigit():
            out.add(int(parts[6]))
    return out


def _has_socket(pid: int) -> bool:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True  # unknown: do not guess that it has none
    return any((fd_target(pid, int(n)) or "").startswith("socket:") for n in names)


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
    "ProcessCounters",
    "ProcessProbe",
    "ThreadReading",
    "ThreadSampler",
    "blocked_call",
    "cpu_model",
    "delay_accounting",
    "epoll_targets",
    "fd_target",
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
    "unix_sockets",
    "usable_cpus",
]
