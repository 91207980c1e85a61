"""File locks of the cache: ``flock(2)`` on a lock file beside each entry, shared or exclusive.

Why ``flock`` by hand and not the ``filelock`` package: a reader pins its entry with a *shared* lock
held as long as its file is open (so that no process evicts it) and the one downloader holds it
*exclusive* (so that the others wait for it, blocked in the kernel, not polling), and ``filelock`` has no
shared mode. The kernel drops a dead process's locks, so a download killed midway never leaves its entry
locked.

A lock file may be deleted (by an eviction, which holds it exclusively) while another process waits
for it; that process then holds a lock on a file nobody else can see. :func:`lock` checks, once it has the
lock, that the path still names the file it locked, and starts over when it does not.
"""

from __future__ import annotations

import fcntl
import os


def lock(path: str, *, shared: bool, blocking: bool = True) -> int | None:
    """Lock ``path`` (created if missing): shared or exclusive, waiting for it or not.

    Returns:
        int | None: the open file descriptor holding the lock (closing it releases the lock), or None
        when ``blocking`` is False and another holder has it.
    """
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _still_there(path, fd):
            return fd
        os.close(fd)  # removed while we waited: lock the file that is there now


def relock(path: str, fd: int, *, shared: bool) -> bool:
    """Turn the lock held on ``fd`` shared or exclusive. ``flock`` drops the old lock before taking the
    new one, so another process may have evicted the entry in between: False when ``path`` no longer
    names the locked file (the caller closes ``fd`` and starts over)."""
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    return _still_there(path, fd)


def _still_there(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


__all__ = ["lock", "relock"]
