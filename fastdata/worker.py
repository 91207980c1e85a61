"""What makes a dataset safe under ``DataLoader(num_workers>0)``: per-process handles, a bounded
cache of open handles, state shared by all workers, per-worker seeding, and ``worker_init_fn``.

The rules (see DESIGN.md): a handle is opened on first use in the process that uses it; a process
created by ``fork`` never uses a handle it inherited (it opens its own); pickling drops handles, so a
dataset crosses into ``spawn`` workers without them; whatever is opened is closed at exit.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import random
import resource
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from fastdata.errors import ConfigError
from fastdata.world import World, current_worker

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

# Bumped in every child right after fork: a handle opened under an older generation belongs to the
# parent. Cheaper than comparing os.getpid() (a syscall) on every read.
_generation = 0
# Handles inherited through fork whose owner asked us not to close them (decord's destructor hangs
# in a forked child). Keeping a reference here means their destructor never runs in the child.
_abandoned: list[object] = []


def _after_fork_in_child() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        self._generation = _generation
        self._max_open = 0
        self.opened = 0  # handles opened by this process, for tests and probes

    @property
    def max_open(self) -> int:
        """The bound in force in this process (resolved on first use)."""
        return self._max_open or self._max_open_arg or default_max_open()

    def __len__(self) -> int:
        return len(self._handles) if self._generation == _generation else 0

    def get(self, key: K) -> T:
        """The open handle for ``key``, opened now if this process has not opened it yet."""
        if self._generation != _generation:
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

    def discard(self, key: K) -> None:
        """Close and forget the handle for ``key`` (after an error left it in a bad state)."""
        if self._generation == _generation and key in self._handles:
            self._closer(self._handles.pop(key))

    def close(self) -> None:
        """Close every handle this process opened. Idempotent."""
        if self._generation != _generation:
            self._forget_inherited()
            return
        while self._handles:
            _, handle = self._handles.popitem(last=False)
            self._closer(handle)

    def _forget_inherited(self) -> None:
        inherited = list(self._handles.values())
        self._handles = OrderedDict()
        self._generation = _generation
        self._max_open = 0
        self.opened = 0
        if self._close_inherited:
            for handle in inherited:
                self._closer(handle)
        else:
            _abandoned.extend(inherited)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = OrderedDict()
        state["_max_open"] = 0
        state["opened"] = 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._generation = _generation


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
        return {"_factory": self._factory, "_closer": self._cache._closer,
                "_close_inherited": self._cache._close_inherited}

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


class SharedState:
    """Small state that every worker of one dataset shares with the main process, in shared memory.

    It carries the epoch from ``set_epoch`` in the main process to persistent workers (which keep the
    dataset copy they were started with), and per-process counters (skipped samples, retries) back to
    the main process. Each process writes only its own slot, so no lock is needed.

    Pickled by the DataLoader into ``spawn`` workers, the tensor travels as shared memory; pickled any
    other way, it is copied by value.
    """

    SLOTS = 1025  # the main process, then up to 1024 workers (more wrap around)

    def __init__(self, counters: tuple[str, ...] = ("skipped",)) -> None:
        self.counters = counters
        self._tensor = torch.zeros(1 + self.SLOTS * len(counters), dtype=torch.int64).share_memory_()
        self._view: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"counters": self.counters, "_tensor": self._tensor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.counters = state["counters"]
        self._tensor = state["_tensor"]
        self._view = None

    @property
    def _array(self) -> np.ndarray:
        if self._view is None:
            self._view = self._tensor.numpy()
        return self._view

    @property
    def epoch(self) -> int:
        return int(self._array[0])

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._array[0] = value

    def add(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to this process's slot of ``counter``."""
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        slot = 0 if info is None else 1 + info.id % (self.SLOTS - 1)
        i = self.counters.index(counter)
        self._array[1 + i * self.SLOTS + slot] += n

    def count_skip(self) -> None:
        self.add("skipped")

    def total(self, counter: str) -> int:
        """The sum of ``counter`` over the main process and every worker."""
        i = self.counters.index(counter)
        return int(self._array[1 + i * self.SLOTS : 1 + (i + 1) * self.SLOTS].sum())

    def totals(self) -> dict[str, int]:
        return {name: self.total(name) for name in self.counters}


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from ``parts`` (seed, epoch, rank, worker ...), never the same stream."""
    state = np.random.SeedSequence([p & 0xFFFFFFFFFFFFFFFF for p in parts]).generate_state(2)
    return int((int(state[0]) << 32 | int(state[1])) & 0x7FFFFFFFFFFFFFFF)


def seed_process(world: World) -> int:
    """Seed ``random``, ``numpy`` and ``torch`` in this process from (seed, epoch, rank, worker)."""
    seed = derive_seed(world.seed, world.epoch, world.rank, world.worker)
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)
    return seed


# Set by worker_init_fn in a worker process: datasets then reseed the process at each new epoch, so
# persistent workers (whose init function runs only once) still get a new random stream per epoch.
_reseed_each_epoch = False
_seeded_epoch: int | None = None


def on_epoch(world: World) -> None:
    """Called by datasets when a worker starts an epoch; reseeds if ``worker_init_fn`` asked for it."""
    global _seeded_epoch
    if _reseed_each_epoch and _seeded_epoch != world.epoch:
        seed_process(world)
        _seeded_epoch = world.epoch


class WorkerInit:
    """The ``worker_init_fn`` to pass to ``DataLoader``; see :data:`worker_init_fn`.

    Args:
        *then: the user's own init functions, called after ours with the worker id.
    """

    def __init__(self, *then: Callable[[int], object]) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        global _reseed_each_epoch, _seeded_epoch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        dataset = info.dataset if info is not None else None
        world_of = getattr(dataset, "worker_world", None)
        if callable(world_of):
            world = world_of()
            seed_process(world)
            _reseed_each_epoch, _seeded_epoch = True, world.epoch
        elif info is not None:
            # not a fastdata dataset: torch already seeded random and torch; give numpy a stream too
            np.random.seed(info.seed % (1 << 32))
        warm = getattr(dataset, "warm", None)
        if callable(warm):
            warm()
        for fn in self.then:
            fn(worker_id)

    def __repr__(self) -> str:
        return f"WorkerInit(then={self.then!r})"


worker_init_fn = WorkerInit()
"""Pass to ``DataLoader(worker_init_fn=...)``: seeds ``random``/``numpy``/``torch`` from
(seed, epoch, rank, worker), reseeds at every new epoch even with ``persistent_workers=True``, and
opens the worker's handles before the first batch is asked for. fastdata datasets are correct without
it; it makes user transforms reproducible. Use :func:`compose_worker_init` to run your own function too.
"""


def compose_worker_init(*user_fns: Callable[[int], object]) -> WorkerInit:
    """``worker_init_fn`` followed by the user's own functions (each called with the worker id)."""
    return WorkerInit(*user_fns)


def stagger(world: World, low: float, high: float) -> float:
    """Sleep a delay drawn from [low, high) seconds, seeded by (seed, rank, worker); return it.

    Spreads the first reads of many workers so they do not all open the same files at one instant.
    """
    if high <= 0:
        return 0.0
    rng = random.Random(derive_seed(world.seed, world.rank, world.worker, 0x57A6))
    delay = rng.uniform(low, high)
    time.sleep(delay)
    return delay


def open_files(under: str = "/") -> Counter[str]:
    """The paths this process's descriptors point at now (from ``/proc/self/fd``), those under ``under``,
    each with its count of descriptors. Sockets, pipes and other anonymous descriptors have no path and
    are left out: what a dataset opens (files, shards, memory maps' descriptors) has one."""
    paths: Counter[str] = Counter()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since listed (the listing's own descriptor among them)
            continue
        if target.startswith(under):
            paths[target] += 1
    return paths


class SharedEpoch:
    """``epoch`` and ``set_epoch`` kept in a :class:`SharedState` (``self._shared``), so that workers,
    persistent ones too, follow the main process's ``set_epoch``. For datasets and samplers."""

    _shared: SharedState

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (shared with every worker, persistent ones too)."""
        return self._shared.epoch

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new shuffle order, and new random streams in the workers."""
        self._shared.epoch = epoch
