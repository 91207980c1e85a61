"""The operating system's name of a thread (``/proc/PID/task/TID/comm``), set for fastdata's own threads.

Python 3.11 names threads for Python only; the kernel keeps the name of the thread that started them
(``pt_data_worker`` in a DataLoader worker), so from outside the process a loader thread looks like any
other. Naming it ``fastdata-...`` lets the probe (:mod:`fastdata.core.system`) tell fastdata's own reading
threads from the user's: a worker whose main thread waits on its own reading threads (the hybrid) waits on
what those do, not on a lock.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

OWN = "fastdata-"  # the prefix of the kernel name of fastdata's reading threads
_PR_SET_NAME = 15
_COMM = 15  # bytes the kernel keeps of a thread's name


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def name_this_thread(name: str) -> None:
    """Give the calling thread ``name`` (its first 15 bytes) in the kernel; nothing where that cannot be done."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:_COMM]), 0, 0, 0)


def thread_name(pid: int, tid: int) -> str:
    """The kernel's name of thread ``tid`` of process ``pid`` ("" once it has gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


__all__ = ["OWN", "name_this_thread", "thread_name"]
