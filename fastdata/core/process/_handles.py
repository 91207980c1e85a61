"""Per-process handles: a bounded LRU cache of open files, readers and clients, and one value per process.

The rules (see :mod:`fastdata.core.process`): a handle is opened on first use in the process that uses
it; a process created by ``fork`` never uses a handle it inherited (it opens its own); pickling drops
handles, so a dataset crosses into ``spawn`` workers without them; whatever is opened is closed at exit.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import resource
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from fastdata.core.epoch._world import current_worker
from fastdata.core.errors import ConfigError
from fastdata.core.process import _pid as process
from fastdata.core.system._procfs import open_fd_targets

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class HandleCache(Generic[K, T]):
    """A per-process, bounded LRU of open handles (files, HDF5 files, video readers, clients).

    ``get(key)`` opens the handle on first use in this process and closes the least recently used one
    when more than ``max_open`` are open. After a fork the child starts empty; the parent's handles
    are closed in the child (``close_inherited=True``, right for plain file descriptors) or left
    untouched (for libraries whose handles must not be used or destroyed in a forked child).
    Pickling drops every handle. Every cache is closed when its process exits.

    Args:
        opener (Callable[[K], T]): opens the handle for a key.
        closer (Callable[[T], None]): closes a handle. Defaults to calling ``handle.close()``.
        max_open (int | None): most handles open at once in one process. Defaults to
            :func:`default_max_open`, derived from ``ulimit -n`` and the number of workers.
        close_inherited (bool): close handles inherited through fork (True) or abandon them. Defaults
            to True.
    """

    def __init__(
        self,
        opener: Callable[[K], T],
        closer: Callable[[T], None] | None = None,
        *,
        max_open: int | None = None,
        close_inherited: bool = True,
    ) -> None:
        if max_open is not None and max_open < 1:
            raise ConfigError(f"max_open={max_open} must be >= 1")
        self._opener = opener
        self._closer = closer or _close
        self._max_open_arg = max_open
        self._close_inherited = close_inherited
        self._handles: OrderedDict[K, T] = OrderedDict()
        self._owner = process.pid()
        self._max_open = 0
        self.opened = 0  # handles opened by this process, for tests and probes

    @property
    def max_open(self) -> int:
        """The bound in force in this process (resolved on first use)."""
        return self._max_open or self._max_open_arg or default_max_open()

    def __len__(self) -> int:
        return len(self._handles) if self._owner == process._pid else 0

    def get(self, key: K) -> T:
        """The open handle for ``key``, opened now if this process has not opened it yet."""
        if self._owner != process._pid:
            self._forget_inherited()
        handles = self._handles
        handle = handles.get(key)
        if handle is not None:
            handles.move_to_end(key)
            return handle
        if not self._max_open:
            self._max_open = self.max_open
            _live_caches.add(self)
        while len(handles) >= self._max_open:
            _, old = handles.popitem(last=False)
            self._closer(old)
        handle = self._opener(key)
        handles[key] = handle
        self.opened += 1
        return handle

    def open_keys(self) -> list[K]:
        """The keys of the handles open in this process, least recently used first."""
        return list(self._handles) if self._owner == process._pid else []

    def discard(self, key: K) -> None:
        """Close and forget the handle for ``key`` (after an error left it in a bad state)."""
        if self._owner == process._pid and key in self._handles:
            self._closer(self._handles.pop(key))

    def close(self) -> None:
        """Close every handle this process opened. Idempotent."""
        if self._owner != process._pid:
            self._forget_inherited()
            return
        while self._handles:
            _, handle = self._handles.popitem(last=False)
            self._closer(handle)

    def _forget_inherited(self) -> None:
        inherited = list(self._handles.values())
        self._handles = OrderedDict()
        self._owner = process.pid()
        self._max_open = 0
        self.opened = 0
        if self._close_inherited:
            for handle in inherited:
                self._closer(handle)
        else:
            for handle in inherited:
                process.abandon(handle)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = OrderedDict()
        state["_max_open"] = 0
        state["opened"] = 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._owner = process.pid()


class ProcessLocal(Generic[T]):
    """One value per process (a client, a session), built on first use; see :class:`HandleCache`."""

    def __init__(
        self,
        factory: Callable[[], T],
        closer: Callable[[T], None] | None = None,
        *,
        close_inherited: bool = True,
    ) -> None:
        self._factory = factory
        self._cache: HandleCache[int, T] = HandleCache(
            lambda _: factory(), closer, max_open=1, close_inherited=close_inherited
        )

    def get(self) -> T:
        """The value for this process."""
        return self._cache.get(0)

    def close(self) -> None:
        """Close the value if this process built it. Idempotent."""
        self._cache.close()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "_factory": self._factory,
            "_closer": self._cache._closer,
            "_close_inherited": self._cache._close_inherited,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["_factory"], state["_closer"], close_inherited=state["_close_inherited"]
        )


def _close(handle: Any) -> None:
    handle.close()


_live_caches: weakref.WeakSet[HandleCache[Any, Any]] = weakref.WeakSet()


def close_all_handles() -> None:
    """Close every handle cache of this process (runs at exit, in workers too)."""
    for cache in list(_live_caches):
        try:
            cache.close()
        except Exception:  # noqa: BLE001 - closing at exit must not mask the real exit status
            pass


atexit.register(close_all_handles)
# multiprocessing children leave through os._exit(), which skips atexit; its finalizers still run.
multiprocessing.util.Finalize(None, close_all_handles, exitpriority=10)


def default_max_open(num_workers: int | None = None) -> int:
    """The default bound on open handles per process.

    Each process has its own descriptor table, but all DataLoader workers of a job share one machine
    and, in containers, often one low limit; and the main process also holds a descriptor for every
    shared-memory batch in flight. We keep the job's cached handles under a quarter of ``ulimit -n``:
    ``soft_limit // 4 // (num_workers + 1)``, between 4 and 1024. With ``ulimit -n 1024`` and 7 workers
    that is 32 handles per worker.

    Args:
        num_workers (int | None): workers of this process's DataLoader. Defaults to the current one's.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    if num_workers is None:
        _, num_workers = current_worker()
    return max(4, min(1024, soft // 4 // (num_workers + 1)))


def open_files(under: str = "/") -> Counter[str]:
    """The paths this process's descriptors point at now (from ``/proc/self/fd``), those under ``under``,
    each with its count of descriptors. Sockets, pipes and other anonymous descriptors have no path and
    are left out: what a dataset opens (files, shards, memory maps' descriptors) has one."""
    return Counter(target for target in open_fd_targets() if target.startswith(under))


__all__ = ["HandleCache", "ProcessLocal", "close_all_handles", "default_max_open", "open_files"]
