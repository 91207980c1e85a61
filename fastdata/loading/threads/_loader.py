"""``ThreadLoader``: a dataset read by threads of this process, by the plan a DataLoader would follow.

The thread-mode counterpart of :func:`fastdata.loading.build_dataloader` (``fd.Loader(...,
workers="threads")`` builds one): the same arguments, the same batches in the same order as a DataLoader
with ``num_workers=N`` processes, from ``N`` threads that each stand for one worker and read their own
copy of the dataset (see :mod:`fastdata.loading.threads`). It iterates like a DataLoader, has its
``len``, and keeps its threads and their dataset copies (like ``persistent_workers=True``) until
:meth:`close`, except for an iterable dataset, whose copies are taken afresh at each pass (each worker
plans its pass from the dataset's state, as a new worker would).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler

from fastdata.core.errors import ConfigError, check_positive
from fastdata.loading._plan import Collate, ReadPlan
from fastdata.loading.threads._gang import ThreadGang, iterable_batches, map_batches, thread_copies


class ThreadLoader:
    """Batches of ``dataset`` read by ``num_threads`` threads of this process (see the module doc).

    Args:
        dataset: any dataset (fastdata's are read the fastdata way, as by ``build_dataloader``).
        num_threads (int): threads, each standing for one DataLoader worker.
        plan (ReadPlan | None): how to read it, as for :func:`~fastdata.loading.build_dataloader`. Defaults
            to None: ``ReadPlan()``.
        prefetch_factor (int | None): batches each thread reads ahead. Defaults to 2.
        pin_memory (bool): pin each batch (in its thread) where CUDA is available. Defaults to False.
        wrap_collate (Callable | None): as for ``build_dataloader`` (the harness's probes).

    Raises:
        ConfigError: for options that do not apply to this kind of dataset, or a dataset that cannot be
            copied for the threads (on first iteration).
    """

    def __init__(
        self,
        dataset: Any,
        plan: ReadPlan | None = None,
        *,
        num_threads: int,
        prefetch_factor: int | None = None,
        pin_memory: bool = False,
        wrap_collate: Callable[[Collate, bool], Collate] | None = None,
    ) -> None:
        check_positive("num_threads", num_threads)
        if prefetch_factor is not None:
            check_positive("prefetch_factor", prefetch_factor)
        read = (plan or ReadPlan()).resolve(dataset)
        self.dataset = dataset
        self.num_threads = num_threads
        self.prefetch = prefetch_factor or 2
        self.collate = wrap_collate(read.collate, read.batched) if wrap_collate is not None else read.collate
        self.batched = read.batched
        kw = read.kwargs
        self.batch_size: int | None = kw.get("batch_size")
        self.drop_last = bool(kw.get("drop_last", False))
        self.iterable = isinstance(dataset, IterableDataset)
        self.batch_sampler: Any = kw.get("batch_sampler")
        self.sampler: Any = kw.get("sampler")
        if not self.iterable and self.sampler is None and self.batch_sampler is None:
            self.sampler = RandomSampler(dataset) if kw.get("shuffle") else SequentialSampler(dataset)
        if self.batch_sampler is None and self.sampler is not None and self.batch_size is not None:
            self.batch_sampler = BatchSampler(self.sampler, self.batch_size, self.drop_last)
        self.pin_memory = bool(pin_memory) and _cuda()
        self._gang: ThreadGang | None = None

    def threads(self) -> ThreadGang:
        """The threads and their dataset copies (made on first use, kept until :meth:`close`)."""
        if self._gang is None or self._gang.closed:
            n = self.num_threads
            self._gang = ThreadGang(thread_copies(self.dataset, n), [(t, n) for t in range(n)])
        return self._gang

    def __len__(self) -> int:
        if self.iterable:
            return len(self.dataset)
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: what the pass reads is settled now, as a DataLoader's workers settle it when
        # its iterator starts them. An iterable dataset plans its pass in each worker from its own state
        # (a pending resume position), so, like a DataLoader's workers without persistent_workers, each
        # pass gets fresh copies, taken now; a map-style one keeps its copies (and their open handles).
        if self.iterable:
            self.close()
        gang = self.threads()
        if not self.iterable:
            if self.batch_sampler is not None:
                return map_batches(
                    gang, self.batch_sampler, self.collate, prefetch=self.prefetch, pin_memory=self.pin_memory
                )
            return map_batches(
                gang,
                ([i] for i in self.sampler),
                _one(self.collate),
                prefetch=self.prefetch,
                pin_memory=self.pin_memory,
            )
        start = functools.partial(_items, self.collate, self.batch_size, self.drop_last)
        return iterable_batches(gang, start, prefetch=self.prefetch, pin_memory=self.pin_memory)

    def close(self) -> None:
        """Stop the threads, closing each dataset copy in its own thread. Idempotent; iterating again
        starts new ones."""
        if self._gang is not None:
            self._gang.close()
            self._gang = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"ThreadLoader({type(self.dataset).__name__}, num_threads={self.num_threads})"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _one(collate: Collate) -> Collate:
    def single(samples: list[Any]) -> Any:
        return collate(samples[0])  # unbatched: the collate function (default_convert) sees one sample

    return single


def _items(collate: Collate, batch_size: int | None, drop_last: bool, copy: Any) -> Iterator[Any]:
    """In a thread: this copy's part of the pass, each item through ``collate`` (batched first when
    ``batch_size``), as a DataLoader worker hands its items over."""
    items = iter(copy)
    if batch_size is None:
        return _each(items, collate)
    return _batched(items, collate, batch_size, drop_last)


def _each(items: Iterator[Any], collate: Collate) -> Iterator[Any]:
    try:
        for item in items:
            yield collate(item)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()  # the dataset's generator ends (closing its readers) in this thread


def _batched(items: Iterator[Any], collate: Collate, batch_size: int, drop_last: bool) -> Iterator[Any]:
    try:
        batch: list[Any] = []
        for item in items:
            batch.append(item)
            if len(batch) == batch_size:
                yield collate(batch)
                batch = []
        if batch and not drop_last:
            yield collate(batch)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def thread_loader_for(dataset: Any, num_threads: int, plan: ReadPlan | None = None, **kwargs: Any) -> ThreadLoader:
    """A :class:`ThreadLoader` from DataLoader-style keyword arguments: ``persistent_workers`` is accepted
    and means nothing (threads always persist), the options that only mean something for worker
    processes (``multiprocessing_context``, ``worker_init_fn``, ``timeout``) are refused."""
    kwargs.pop("persistent_workers", None)  # loader threads always persist, until close()
    if kwargs.pop("in_order", True) is not True:
        raise ConfigError("in_order=False: loader threads hand batches out in order only; leave it out")
    for name in ("multiprocessing_context", "worker_init_fn", "timeout"):
        if kwargs.pop(name, None) not in (None, 0):
            raise ConfigError(
                f"{name}= is for worker processes; loader threads run in this process (each thread's dataset "
                "copy is warmed up as a worker's would be): leave it out"
            )
    unknown = sorted(set(kwargs) - _TAKES)
    if unknown:
        raise ConfigError(
            f"loader threads take no {', '.join(unknown)}; they take {', '.join(sorted(_TAKES))} (the options of "
            "worker processes do not apply to threads)"
        )
    return ThreadLoader(dataset, plan, num_threads=num_threads, **kwargs)


_TAKES = frozenset({"prefetch_factor", "pin_memory", "wrap_collate"})


__all__ = ["ThreadLoader", "thread_loader_for"]
