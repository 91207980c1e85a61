"""The hybrid: DataLoader worker processes that each fetch and decode in a few threads.

Processes take the work that holds the GIL (parsing, collating, the user's Python); threads in each of
them overlap the waits (S3 round trips) and the decoding that releases it. ``build_dataloader(...,
num_workers=W, threads_per_worker=T)`` hands the DataLoader a thin wrapper of the dataset
(:func:`threaded`) that, in each worker process, reads through ``T`` threads of
:mod:`fastdata.loading.threads` (each with its own copy of the dataset, made in that worker):

- an iterable dataset that deals its own batches (``TarShardDataset(batch_size=...)``): thread ``j`` of
  worker ``w`` stands for worker ``w + W * j`` of ``W * T``, and the worker hands out its threads'
  batches in turn. Worker ``w`` of ``W`` is dealt batches ``w, w + W, w + 2W ...``; its thread ``j`` reads
  every ``T``-th of them, which is exactly the part of worker ``w + W * j`` of ``W * T``. So the batches
  and their order are those of ``W`` plain workers (and of ``W * T``), and resuming works as before;
- a map-style dataset: each batch the worker is given is split into ``T`` runs, run ``j`` read by thread
  ``j`` (standing for worker ``w + W * j`` of ``W * T``, which keeps counters apart and tells S3Dataset's
  read-ahead where that thread's next run lies), and the samples come back in the batch's order.

Everything else (the sampler, ``worker_init_fn``, resume, the transport) sees the dataset itself: the
wrapper answers ``worker_world()`` for it and is otherwise invisible.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset

from fastdata.core import process
from fastdata.core.epoch import ResumeState, World, current_worker
from fastdata.core.errors import BadSample, ConfigError
from fastdata.loading._protocol import BatchingDataset
from fastdata.loading.threads._gang import ThreadGang, add_note, iterable_batches, thread_copies


class _Threaded:
    """What both wrappers share: the dataset, and this process's threads over copies of it."""

    def __init__(self, dataset: Any, threads: int, prefetch: int = 2) -> None:
        self.dataset, self.threads, self.prefetch = dataset, threads, prefetch
        self._gang: ThreadGang | None = None
        self._pid = -1

    def gang(self) -> ThreadGang:
        """This worker process's threads (made on first use in it), thread ``j`` standing for worker
        ``w + W * j`` of ``W * T``."""
        if self._gang is None or self._pid != process.pid():
            worker, workers = current_worker()
            t = self.threads
            self._gang = ThreadGang(
                thread_copies(self.dataset, t),
                [(worker + workers * j, workers * t) for j in range(t)],
                name=f"fastdata-worker{worker}",
            )
            self._pid = process.pid()
        return self._gang

    def __len__(self) -> int:
        return len(self.dataset)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_gang": None, "_pid": -1}  # threads belong to one process

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset!r}, threads={self.threads})"


class _Worldly:
    """The wrapper answers ``worker_world()`` for a dataset that has one (fastdata's), so that
    :data:`fastdata.worker_init_fn` seeds the worker from the dataset's world; a plain torch dataset's
    wrapper has none (:class:`ThreadedPlainMap`), and torch's own seeding applies."""

    dataset: Any

    def worker_world(self) -> World:
        return self.dataset.worker_world()  # type: ignore[no-any-return]


class ThreadedIterable(_Worldly, _Threaded, IterableDataset[Any]):
    """An iterable dataset that deals its own batches, read by ``threads`` threads in each worker (see
    the module doc)."""

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        gang = self.gang()
        # the pass starts where the dataset's pending resume says, as a plain worker's would; the copies
        # made earlier in this process take it now, and the dataset's own is used up
        state = ds.state_dict()
        ds.load_state_dict(ResumeState(ds.epoch, 0, "batches").to_dict())
        start = functools.partial(_resumed, state)
        return iterable_batches(gang, start, prefetch=self.prefetch, name="worker thread")


def _resumed(state: dict[str, Any], copy: Any) -> Iterator[Any]:
    copy.load_state_dict(state)
    return iter(copy)


class ThreadedPlainMap(_Threaded, Dataset[Any]):
    """A map-style dataset whose batches are read in ``threads`` runs at once in each worker (see the
    module doc); for a dataset without ``worker_world`` (:class:`ThreadedMap` for one with it)."""

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        gang = self.gang()
        runs = [r.tolist() for r in np.array_split(np.asarray(indices, dtype=np.int64), len(gang)) if len(r)]
        futures = [gang.submit(j, functools.partial(_read_run, run)) for j, run in enumerate(runs)]
        out: list[Any] = []
        emptied: BadSample | None = None
        try:
            for j, f in enumerate(futures):
                try:
                    out.extend(f.result())
                except BadSample as e:
                    # a run whose every sample was skipped: only the whole batch being empty is an error
                    if getattr(self.dataset, "on_error", "raise") != "skip":
                        add_note(e, f"(raised in worker thread {j} of {len(gang)})")
                        raise
                    emptied = e
        finally:
            for f in futures:
                f.cancel()
        if not out and emptied is not None:
            raise emptied
        return out


class ThreadedMap(_Worldly, ThreadedPlainMap):
    """:class:`ThreadedPlainMap` for a dataset that knows its worker's world (fastdata's)."""


def _read_run(run: list[int], copy: Any) -> list[Any]:
    getitems = getattr(copy, "__getitems__", None)
    if getitems is not None:
        return list(getitems(run))
    return [copy[i] for i in run]


def threaded(dataset: Any, threads: int) -> Any:
    """``dataset`` wrapped to be read by ``threads`` threads in each DataLoader worker (see the module
    doc); ``dataset`` itself for one thread."""
    if threads <= 1:
        return dataset
    if isinstance(dataset, IterableDataset):
        if not (isinstance(dataset, BatchingDataset) and dataset.batch_size is not None):
            raise ConfigError(
                f"threads_per_worker needs an iterable dataset that deals its own batches "
                f"({type(dataset).__name__}(batch_size=...)), so that the threads' batches keep their order"
            )
        return ThreadedIterable(dataset, threads)
    if not callable(getattr(dataset, "worker_world", None)):
        return ThreadedPlainMap(dataset, threads)  # a plain torch Dataset: its wrapper claims no world
    return ThreadedMap(dataset, threads)


__all__ = ["ThreadedIterable", "ThreadedMap", "ThreadedPlainMap", "threaded"]
