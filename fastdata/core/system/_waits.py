"""What a thread is waiting on, from what ``/proc`` shows of it: its state, its current system call and the
kind of descriptor that call waits on. Pure rules (no file is read here; :mod:`fastdata.core.system` reads).

Kinds (:data:`KINDS`), as a look at a producer (a worker process, a loader thread) finds it:

* ``computing``: running or runnable (state R; the probe splits it into computing and waiting for a core
  from the threads' schedstat);
* ``network``: blocked on a socket (``recvfrom``, ``recvmsg``, ``connect``, ``sendto``, or ``poll``/``select``/
  ``epoll`` over sockets: Python's sockets with a timeout ``poll`` before each ``recv``);
* ``disk``: in uninterruptible sleep (D: a disk, an NFS or FUSE server, a page fault on a mapped file), or
  reading a regular file;
* ``lock``: waiting on a futex (a lock, a condition, a queue between threads; the GIL in thread mode);
* ``sleep``: ``nanosleep``/``clock_nanosleep``, or ``select``/``poll`` over no descriptor (``time.sleep``);
* ``idle``: waiting on a pipe or an eventfd: a DataLoader worker waiting for its next index (its index queue
  is a pipe), or a loader thread waiting for work or for room in its queue: the producer is ahead; and a
  listener in ``accept`` (no request of the producer's in flight);
* ``other``: anything else (``wait4`` on a child, ``io_uring_enter`` ...), named by its call.

Syscall numbers differ between architectures: x86-64 and arm64 (the generic table) are known; elsewhere a
blocked call is ``other`` and only the state tells running from D state.
"""

from __future__ import annotations

import platform
from typing import Literal

Kind = Literal["computing", "network", "disk", "lock", "sleep", "idle", "other"]
KINDS: tuple[Kind, ...] = ("computing", "network", "disk", "lock", "sleep", "idle", "other")
FdKind = Literal["socket", "unix", "pipe", "file", "other"]

_X86_64 = {
    0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev", 23: "select",
    24: "sched_yield", 34: "pause", 35: "nanosleep", 40: "sendfile", 42: "connect", 43: "accept", 44: "sendto",
    45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 74: "fsync", 75: "fdatasync", 128: "rt_sigtimedwait",
    130: "rt_sigsuspend", 202: "futex", 208: "io_getevents", 217: "getdents64", 230: "clock_nanosleep",
    232: "epoll_wait", 247: "waitid", 257: "openat", 262: "newfstatat", 270: "pselect6", 271: "ppoll",
    275: "splice", 281: "epoll_pwait", 288: "accept4", 295: "preadv", 299: "recvmmsg", 307: "sendmmsg",
    327: "preadv2", 332: "statx", 426: "io_uring_enter", 441: "epoll_pwait2", 449: "futex_waitv",
}  # fmt: skip
_GENERIC = {  # arm64 and the other architectures of the generic table
    4: "io_getevents", 22: "epoll_pwait", 56: "openat", 61: "getdents64", 63: "read", 64: "write", 65: "readv",
    66: "writev", 67: "pread64", 68: "pwrite64", 69: "preadv", 71: "sendfile", 72: "pselect6", 73: "ppoll",
    76: "splice", 79: "newfstatat", 82: "fsync", 83: "fdatasync", 95: "waitid", 98: "futex", 101: "nanosleep",
    115: "clock_nanosleep", 124: "sched_yield", 133: "rt_sigsuspend", 137: "rt_sigtimedwait", 202: "accept",
    203: "connect", 206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 242: "accept4",
    243: "recvmmsg", 260: "wait4", 269: "sendmmsg", 286: "preadv2", 291: "statx", 426: "io_uring_enter",
    441: "epoll_pwait2", 449: "futex_waitv",
}  # fmt: skip
SYSCALLS: dict[int, str] = {"x86_64": _X86_64, "aarch64": _GENERIC, "arm64": _GENERIC}.get(platform.machine(), {})

# the calls whose first argument is the descriptor they wait on
ON_FD = frozenset(
    {"read", "pread64", "readv", "preadv", "preadv2", "write", "pwrite64", "writev", "recvfrom", "recvmsg",
     "recvmmsg", "sendto", "sendmsg", "sendmmsg", "connect", "accept", "accept4", "sendfile", "fsync", "fdatasync",
     "splice"}
)  # fmt: skip
POLLS = frozenset({"poll", "ppoll", "select", "pselect6"})  # descriptors in user memory (a pollfd array, fd sets)
EPOLLS = frozenset({"epoll_wait", "epoll_pwait", "epoll_pwait2"})  # descriptors listed in /proc/PID/fdinfo/EPFD
SLEEPS = frozenset({"nanosleep", "clock_nanosleep", "pause", "rt_sigsuspend", "rt_sigtimedwait", "sched_yield"})
LOCKS = frozenset({"futex", "futex_waitv"})
NETWORK_CALLS = frozenset({"recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "connect"})
# a listener waiting for a connection (multiprocessing's resource sharer in every DataLoader worker) serves no
# request of the producer's: idle
LISTENS = frozenset({"accept", "accept4"})
FILE_CALLS = frozenset({"openat", "newfstatat", "statx", "getdents64", "fsync", "fdatasync", "io_getevents"})


def fd_kind(target: str | None, unix: frozenset[int] | set[int] = frozenset()) -> FdKind:
    """What a descriptor's ``/proc/PID/fd/N`` link points at (None: it could not be read); ``unix``: the
    inodes of the machine's Unix-domain sockets (local IPC: torch hands tensors' descriptors over them)."""
    if target is None:
        return "other"
    if target.startswith("socket:"):
        inode = target[8:-1]
        return "unix" if inode.isdigit() and int(inode) in unix else "socket"
    if target.startswith(("pipe:", "anon_inode:[eventfd]", "anon_inode:[eventpoll]")):
        return "pipe"
    if target.startswith("/") and not target.startswith(("/dev/", "/proc/", "/sys/")):
        return "file"
    return "other"


def on_fds(kinds: list[FdKind], *, none: Kind = "sleep", unknown: Kind = "other", helper: bool = False) -> Kind:
    """The kind of a wait on several descriptors (a ``poll``): a socket among them is the network, else a
    regular file is the disk, else pipes are idle; no descriptor at all is a sleep (``none``); descriptors
    whose targets could not be read are ``unknown``. A Unix-domain socket is a local server's (the network)
    for a producer's own thread, and IPC machinery (idle) for a ``helper`` thread (multiprocessing's
    resource sharer, which hands tensors' descriptors over, runs in every DataLoader worker)."""
    if not kinds:
        return none
    if "socket" in kinds or ("unix" in kinds and not helper):
        return "network"
    if "file" in kinds:
        return "disk"
    if "pipe" in kinds or "unix" in kinds:
        return "idle"
    return unknown


def kind_of(state: str, call: str, fds: list[FdKind] | None, helper: bool = False) -> Kind:
    """A thread's kind of wait (see the module doc) from its state letter, its current call ("" when it is
    in none, or it could not be read) and the kinds of the descriptors the call waits on (None: not known);
    ``helper``: a thread other than the producer's own (see :func:`on_fds`)."""
    if state == "R":
        return "computing"
    if state == "D":
        return "network" if call in NETWORK_CALLS else "disk"
    if call in LOCKS:
        return "lock"
    if call in LISTENS:
        return "idle"
    if call in SLEEPS:
        return "sleep"
    if call in POLLS or call in EPOLLS:
        return on_fds(fds, helper=helper) if fds is not None else "other"
    if call in ON_FD:
        kind = on_fds(fds or [], none="other", helper=helper)
        return "network" if call in NETWORK_CALLS and kind == "other" and not fds else kind
    if call in FILE_CALLS:
        return "disk"
    return "other"


# a process's kind, when its main thread waits on one of its own threads (a futex): what those do, in order
BEHIND_A_LOCK: tuple[Kind, ...] = ("computing", "disk", "network")


# ... when the threads it waits on are fastdata's own reading threads (the hybrid's): what those do, in order
BEHIND_OWN: tuple[Kind, ...] = ("computing", "disk", "network", "sleep", "other", "lock", "idle")


def process_kind(
    main: tuple[Kind, str], others: list[tuple[Kind, str]], own: list[tuple[Kind, str]] | None = None
) -> tuple[Kind, str]:
    """The kind of a producing process from its main thread's and its other threads' ``(kind, call)``: the
    main thread's, unless it waits on a futex (a helper thread decoding, a pool fetching): then the first
    of :data:`BEHIND_A_LOCK` that another thread is in (a lock whose holder sleeps stays a lock). ``own``:
    the kinds of fastdata's own reading threads among the others (named ``OWN``);
    a main thread waiting on a futex while they read waits on what they do, whatever it is
    (:data:`BEHIND_OWN`: a hybrid worker whose threads sleep is sleeping, not on a lock)."""
    if main[0] != "lock":
        return main
    for kind in BEHIND_OWN if own else ():
        for k, call in own or ():
            if k == kind:
                return kind, call
    for kind in BEHIND_A_LOCK:
        for k, call in others:
            if k == kind:
                return kind, call or "a helper thread"
    return main


def key(kind: Kind, call: str) -> str:
    """How a look is counted: ``"kind/call"`` (``"network/recvfrom"``, ``"computing/"``)."""
    return f"{kind}/{call}"


def split(counted: str) -> tuple[str, str]:
    """``(kind, call)`` of a counted key."""
    kind, _, call = counted.partition("/")
    return kind, call


__all__ = [
    "BEHIND_A_LOCK",
    "BEHIND_OWN",
    "KINDS",
    "SYSCALLS",
    "FdKind",
    "Kind",
    "fd_kind",
    "key",
    "kind_of",
    "on_fds",
    "process_kind",
    "split",
]
