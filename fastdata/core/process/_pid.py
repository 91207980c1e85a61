"""Which process this is, and what runs around a fork: the one per-process mechanism of fastdata.

Everything that belongs to one process (open files, clients, thread pools, shared-memory rings, reseed
marks) records :func:`pid` when it is made and compares it when it is used: a different value means
the object was inherited, through ``fork``, or arrived pickled in a ``spawn`` worker, and must not be
used as it is. :func:`pid` is a module global refreshed in the child right after every fork, so the
check costs one global read, not a system call (glibc no longer caches ``getpid()``).

Work that must happen around a fork (drop a lock another thread may hold, close idle decoders in the
parent while that is still safe) registers through :func:`at_fork`, not ``os.register_at_fork``
directly, so that the order is ours and each hook is written once.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_pid = os.getpid()
_forked = False
_before: list[Callable[[], None]] = []
_after_in_parent: list[Callable[[], None]] = []
_after_in_child: list[Callable[[], None]] = []
# Objects inherited through fork that must never be finalised in the child (decord's destructor hangs
# there): a reference kept here for the life of the process means their destructor never runs.
_abandoned: list[object] = []


def pid() -> int:
    """This process's id, cached: refreshed in the child right after a fork."""
    return _pid


def forked() -> bool:
    """Whether this process was made by ``fork`` from another that imported fastdata (so may hold
    copies of its parent's objects); False in the main process and in ``spawn``/``forkserver`` workers."""
    return _forked


def at_fork(
    *,
    before: Callable[[], None] | None = None,
    after_in_child: Callable[[], None] | None = None,
    after_in_parent: Callable[[], None] | None = None,
) -> None:
    """Run ``before`` in the parent just before every fork, ``after_in_child`` in the child right after,
    and ``after_in_parent`` in the parent right after.

    Hooks run in registration order (after-fork ones in the child after :func:`pid` is refreshed). A
    hook must not raise; one that does is a bug and is not hidden.
    """
    if before is not None:
        _before.append(before)
    if after_in_child is not None:
        _after_in_child.append(after_in_child)
    if after_in_parent is not None:
        _after_in_parent.append(after_in_parent)


def abandon(obj: object) -> None:
    """Keep ``obj`` referenced for the life of this process, so that its destructor never runs here."""
    _abandoned.append(obj)


def _run_before() -> None:
    for hook in _before:
        hook()


def _run_after_in_parent() -> None:
    for hook in _after_in_parent:
        hook()


def _run_after_in_child() -> None:
    global _pid, _forked
    _pid = os.getpid()
    _forked = True
    for hook in _after_in_child:
        hook()


os.register_at_fork(before=_run_before, after_in_parent=_run_after_in_parent, after_in_child=_run_after_in_child)

__all__ = ["abandon", "at_fork", "forked", "pid"]
