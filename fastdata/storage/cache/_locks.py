"""File locks of the cache: ``flock(2)`` on a lock file beside each entry, shared or exclusive.

Why ``flock`` by hand and not the ``filelock`` package: a reader pins its entry with a *shared* lock
held as long as its file is open (so that no process evicts it) and the one downloader holds it
*exclusive* (so that the others wait for it, blocked in the kernel, not polling), and ``filelock`` has no
shared mode. The kernel drops a dead process's locks, so a download killed midway never leaves its entry
locked.

A lock file may be deleted (by an eviction, which holds it exclusively) while another process waits
for it; that process then holds a lock on a file nobody else can see. :func:`lock` checks, once it has the
lock, that the path still names the file it locked, and starts over when it does not.

A ``flock`` belongs to the open file, not to the process: a child forked while a thread of its parent held
one (a download filling the cache ahead) would hold it too, for as long as it lives, after the parent let
go, and every process of the node wanting that entry would wait for it forever. So every lock descriptor
is recorded while it is open (and so is a download's file: :func:`open_owned`), and a forked child closes
the ones it inherited at once (closing, never
``LOCK_UN``: its parent's lock stays as it was). :func:`release` closes a descriptor only in the process
that locked it.

A folder this process may not write (a read-only mount, a cache another user filled) is still locked for
reading: a lock file that is there is opened read-only (``flock`` needs no write access); one that is not
there cannot be made, and :func:`lock` raises the ``OSError`` (the caller reads around the cache).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading

NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)

_held: set[int] = set()  # the lock descriptors this process has open
_held_lock = threading.Lock()


def _before_fork() -> None:
    _held_lock.acquire()  # no descriptor half-recorded while the process forks


def _after_fork_parent() -> None:
    _held_lock.release()


def _after_fork_child() -> None:
    global _held_lock
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()
    _held_lock = threading.Lock()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)


def _open(path: str) -> int:
    flags = os.O_CLOEXEC
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    except OSError as e:
        if e.errno not in NOT_WRITABLE:
            raise
        try:
            return os.open(path, os.O_RDONLY | flags)  # read-only folder: a lock file that is there still locks
        except FileNotFoundError:
            raise e from None


def lock(path: str, *, shared: bool, blocking: bool = True) -> int | None:
    """Lock ``path`` (created if missing): shared or exclusive, waiting for it or not.

    Returns:
        int | None: the open file descriptor holding the lock (give it to :func:`release`), or None when
        ``blocking`` is False and another holder has it.

    Raises:
        OSError: the lock file is not there and cannot be made (errno in :data:`NOT_WRITABLE`: the folder
            is not writable).
    """
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    while True:
        with _held_lock:
            fd = _open(path)
            _held.add(fd)  # recorded before it locks: a child forked from now on closes its copy
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            release(fd)
            return None
        except BaseException:
            release(fd)
            raise
        if _still_there(path, fd):
            return fd
        release(fd)  # removed while we waited: lock the file that is there now


def open_owned(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for a descriptor a forked child must not keep (a download's ``.part``: a child holding it
    would keep the space of a failed download in use, on a full disk, for as long as it lives); give it to
    :func:`release`."""
    with _held_lock:
        fd = os.open(path, flags | os.O_CLOEXEC, mode)
        _held.add(fd)
    return fd


def release(fd: int) -> None:
    """Close lock descriptor ``fd`` if this process opened it (a copy inherited through a fork was closed
    then: its number may name another file now)."""
    with _held_lock:
        if fd in _held:
            _held.discard(fd)
            os.close(fd)


def relock(path: str, fd: int, *, shared: bool) -> bool:
    """Turn the lock held on ``fd`` shared or exclusive. ``flock`` drops the old lock before taking the
    new one, so another process may have evicted the entry in between: False when ``path`` no longer
    names the locked file (the caller releases ``fd`` and starts over)."""
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    return _still_there(path, fd)


def _still_there(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


__all__ = ["NOT_WRITABLE", "lock", "open_owned", "release", "relock"]
