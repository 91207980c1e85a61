"""Threads that stand for DataLoader workers: one dataset copy each, batches handed out in worker order.

Thread mode (``fd.Loader(ds, num_workers=N, workers="threads")``) fetches and decodes in ``N`` threads of
the main process instead of ``N`` worker processes: for work that releases the GIL (file and S3 reads,
PIL/OpenCV/PyAV decode, direct HDF5 reads) that costs no pickling and no shared memory, and a batch is
an ordinary object the moment it is made. The guarantees are those of the process mode, because each
thread does what a worker process would:

- **the same batches in the same order**: thread ``t`` of ``N`` stands for DataLoader worker ``t`` of
  ``N`` (:func:`fastdata.core.epoch.acting_as_worker`: everything in fastdata that asks which worker it
  is asks there). A map-style dataset's batches of indices come from its sampler in the main thread and
  are dealt to the threads in turn, as the DataLoader deals them; an iterable dataset that deals its own
  batches (``TarShardDataset(batch_size=...)``) runs worker ``t``'s plan in thread ``t``, and the batches
  are taken from the threads in turn. So the order never depends on ``N``, and a count of batches still
  names the point to resume from;
- **a dataset per thread**: handles are per process (a :class:`~fastdata.core.process.HandleCache` is not
  safe to share between threads), so each thread reads its own copy, made as a ``spawn`` worker's is
  (pickled: ``__getstate__`` drops handles), except that tensors and arrays (the shared epoch and
  counters, indexes) and plain functions are shared, not copied (:func:`thread_copies`);
- **errors** reach the caller as the same exception, with a note naming the thread;
- **early exit** (``break``, an error, ``close()``) stops the threads' work: nothing is fetched after the
  iterator is closed, and ``close()`` closes every copy in its own thread.

Random streams: threads share the process's ``random``/``numpy``/``torch`` generators, so a transform
that draws from them is not reproducible across runs in thread mode (fastdata's own randomness, such as
shuffles and clip starts, is keyed by sample and epoch, and does not depend on it).

The hybrid (worker processes that each run a few threads) is built from the same pieces, in
:mod:`fastdata.loading.threads`.
"""

from __future__ import annotations

import collections
import functools
import io
import os
import pickle
import queue
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, cast

import numpy as np
import torch

from fastdata.core.epoch import Warmable, acting_as_worker
from fastdata.core.errors import ConfigError, FastdataError
from fastdata.core.system import name_this_thread

# A list or tuple of at least this many plain values (URLs, paths, counts) is shared between the
# copies rather than copied: datasets never change them, and a million URLs per thread adds up.
SHARE_ATOMS_FROM = 256
_ATOMS = (str, int, float, bool, bytes, type(None))


class _SharingPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, shared: list[Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared = shared

    def persistent_id(self, obj: Any) -> int | None:
        if isinstance(obj, (torch.Tensor, np.ndarray, types.FunctionType)) or (
            type(obj) in (list, tuple) and len(obj) >= SHARE_ATOMS_FROM and all(type(v) in _ATOMS for v in obj)
        ):
            self.shared.append(obj)
            return len(self.shared) - 1
        return None


class _SharingUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: list[Any]) -> None:
        super().__init__(file)
        self.shared = shared

    def persistent_load(self, pid: Any) -> Any:
        return self.shared[pid]


def thread_copies(dataset: Any, n: int) -> list[Any]:
    """``n`` copies of ``dataset``, one per loader thread, that share no handle with it or each other.

    Each is the dataset pickled and unpickled (as a ``spawn`` worker gets it: ``__getstate__`` drops open
    handles, and each copy opens its own on first use), except that tensors and numpy arrays (the shared
    epoch, counters and plans, indexes), long lists of plain values (URLs) and plain functions (a
    lambda ``transform``) are shared with the dataset, not copied: they are read, never changed, by
    reading.

    Raises:
        ConfigError: the dataset cannot be pickled (it holds something like a lock or an open file
            outside a handle cache), naming what failed.
    """
    buffer, shared = io.BytesIO(), cast(list[Any], [])
    try:
        _SharingPickler(buffer, shared).dump(dataset)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"thread mode reads a copy of {type(dataset).__name__} in each thread, made by pickling it (as a "
            f"spawn worker gets it), and it cannot be pickled: {e}; make what it holds picklable (open "
            "resources lazily, drop them in __getstate__), or use worker processes"
        ) from e
    data = buffer.getvalue()
    return [_SharingUnpickler(io.BytesIO(data), shared).load() for _ in range(n)]


# a marker the probe finds in the module globals of a frame: a loader thread blocked in this module (in
# SimpleQueue.get, a C call) waits on a queue for work, not on a lock (fastdata.loading.observe.measure)
WAITS_ON_QUEUES = True


class ThreadGang:
    """``len(copies)`` threads, thread ``j`` reading ``copies[j]`` as worker ``workers[j]``, each with its
    own queue of jobs (so a job given to thread ``j`` runs there, after the ones given to it before).

    Args:
        copies (list): one dataset copy per thread (:func:`thread_copies`).
        workers (list[tuple[int, int]]): ``(worker, num_workers)`` each thread stands for.
        name (str): thread name prefix. Defaults to "fastdata-loader".
    """

    def __init__(self, copies: list[Any], workers: list[tuple[int, int]], name: str = "fastdata-loader") -> None:
        if len(copies) != len(workers) or not copies:
            raise ValueError("one (worker, num_workers) per copy, and at least one copy")
        self.copies, self.workers = copies, workers
        self.token = int.from_bytes(os.urandom(8), "little") >> 1  # this set of threads, for pass tokens
        self._jobs: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in copies]
        self._threads = [
            threading.Thread(target=self._serve, args=(j,), name=f"{name}-{j}", daemon=True) for j in range(len(copies))
        ]
        self.closed = False
        self.stops: list[threading.Event] = []  # set by close(): streams still running stop putting
        for t in self._threads:
            t.start()

    def __len__(self) -> int:
        return len(self.copies)

    def _serve(self, j: int) -> None:
        name_this_thread(self._threads[j].name)  # the probe tells the loader's threads from the user's by it
        copy = self.copies[j]
        with acting_as_worker(*self.workers[j], token=self.token):
            if isinstance(copy, Warmable):
                try:
                    copy.warm()
                except Exception:  # noqa: BLE001 - a failed warm-up is left for the first read to report
                    pass
            while True:
                job = self._jobs[j].get()
                if job is None:
                    break
                fn, future = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(copy))
                except BaseException as e:  # noqa: BLE001 - handed to the caller, who re-raises it
                    future.set_exception(e)
            try:
                copy.close()  # in the thread that opened its handles
            except Exception:  # noqa: BLE001 - closing must not hide why the gang stopped
                pass

    def alive(self) -> int:
        """Threads still running (0 once :meth:`close` has returned)."""
        return sum(t.is_alive() for t in self._threads)

    def submit(self, j: int, fn: Callable[[Any], Any]) -> Future[Any]:
        """Run ``fn(copies[j])`` in thread ``j``; its future."""
        if self.closed:
            raise FastdataError("this loader's threads were closed; iterate the Loader again to start new ones")
        future: Future[Any] = Future()
        self._jobs[j].put((fn, future))
        return future

    def close(self) -> None:
        """Finish the jobs given, close each copy in its thread, stop the threads. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for stop in self.stops:  # a pass whose iterator is still held somewhere: its streams stop now
            stop.set()
        for jobs in self._jobs:
            jobs.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (Python 3.11), also on 3.10, where nothing shows the notes."""
    notes = getattr(error, "__notes__", None)
    if notes is None:
        setattr(error, "__notes__", [note])  # noqa: B010 - what add_note does
    elif note not in notes:
        notes.append(note)


def _noted(error: BaseException, where: str) -> BaseException:
    add_note(error, f"(raised in {where})")
    return error


def _result(future: Future[Any], where: str) -> Any:
    try:
        return future.result()
    except BaseException as e:
        _noted(e, where)
        raise


def _fetch(indices: Sequence[int], collate: Callable[[Any], Any], pin: bool, copy: Any) -> Any:
    # what torch's map-style fetcher does, in the thread: __getitems__ when the dataset has one
    getitems = getattr(copy, "__getitems__", None)
    data = getitems(indices) if getitems else [copy[i] for i in indices]
    return _pinned(collate(data)) if pin else collate(data)


def _pinned(batch: Any) -> Any:
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(batch)


def map_batches(
    gang: ThreadGang,
    index_batches: Iterable[Sequence[int]],
    collate: Callable[[Any], Any],
    *,
    prefetch: int = 2,
    pin_memory: bool = False,
) -> Iterator[Any]:
    """The batches of a map-style dataset, in the order of ``index_batches``: batch ``k`` is fetched and
    collated by thread ``k % N``, at most ``prefetch * N`` ahead of the one handed out (as a DataLoader
    with ``N`` workers and ``prefetch_factor=prefetch`` reads ahead).
    """
    n = len(gang)
    batches = iter(index_batches)
    pending: collections.deque[tuple[Future[Any], int]] = collections.deque()
    sent = 0

    def send() -> None:
        nonlocal sent
        indices = next(batches, None)
        if indices is not None:
            job = functools.partial(_fetch, indices, collate, pin_memory)
            pending.append((gang.submit(sent % n, job), sent % n))
            sent += 1

    try:
        for _ in range(prefetch * n):
            send()
        while pending:
            future, j = pending.popleft()
            batch = _result(future, f"loader thread {j} of {n}")
            send()
            yield batch
    finally:
        for future, _ in pending:
            future.cancel()
        for future, _ in pending:  # those already running: let them finish before the copies are reused
            if not future.cancelled():
                try:
                    future.result()
                except BaseException:  # noqa: BLE001 - their batches are not wanted any more
                    pass


_END = object()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _stream(out: queue.Queue[Any], stop: threading.Event, pin: bool, start: Callable[[Any], Any], copy: Any) -> None:
    """Run in a thread: put the batches of ``iter(start(copy))`` into ``out`` until they end or ``stop``."""

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)  # wakes to see ``stop`` when the consumer has gone
                return True
            except queue.Full:
                continue
        return False

    it: Iterator[Any] | None = None
    try:
        it = iter(start(copy))
        for batch in it:
            if not put(_pinned(batch) if pin else batch):
                return
        put(_END)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, who re-raises it
        put(_Failed(e))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()  # a generator's finally (closing its shard readers) runs in this thread


def iterable_batches(
    gang: ThreadGang,
    start: Callable[[Any], Iterable[Any]] = iter,
    *,
    prefetch: int = 2,
    pin_memory: bool = False,
    name: str = "loader thread",
) -> Iterator[Any]:
    """The batches of an iterable dataset whose worker ``t`` of ``N`` reads its own part: thread ``t``
    iterates ``start(copy)`` into a queue of ``prefetch`` batches, and the batches are taken from the
    threads in turn, skipping a thread whose part has ended (as the DataLoader takes them from workers).
    """
    n = len(gang)
    stop = threading.Event()
    gang.stops = [s for s in gang.stops if not s.is_set()] + [stop]
    queues: list[queue.Queue[Any]] = [queue.Queue(prefetch) for _ in range(n)]
    futures = [gang.submit(j, functools.partial(_stream, queues[j], stop, pin_memory, start)) for j in range(n)]
    active = [True] * n
    j = 0
    try:
        while any(active):
            if not active[j]:
                j = (j + 1) % n
                continue
            item = _take(queues[j], futures[j], f"{name} {j} of {n}")
            if item is _END:
                active[j] = False
            elif isinstance(item, _Failed):
                raise _noted(item.error, f"{name} {j} of {n}")
            else:
                yield item
            j = (j + 1) % n
    finally:
        stop.set()
        for f in futures:
            try:
                f.result()  # the streams see ``stop`` within 50 ms, or end their current batch first
            except BaseException:  # noqa: BLE001 - a stream's error already went to its queue
                pass


def _take(q: queue.Queue[Any], future: Future[Any], where: str) -> Any:
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if future.done() and q.empty():
                error = future.exception()
                raise FastdataError(f"{where} stopped without a word") from error
