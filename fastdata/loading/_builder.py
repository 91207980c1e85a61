"""``build_dataloader``: the one way fastdata builds the ``torch.utils.data.DataLoader`` for a dataset.

:class:`fastdata.Loader`, the benchmark harness (``fastdata.bench``) and the conformance tests all build
their DataLoader here, so all three read a dataset the same way:

- the dataset is read by a :class:`~fastdata.loading.ReadPlan` (sampler, batching, collate function), which
  loader threads (:mod:`fastdata.loading.threads`) follow too;
- :data:`fastdata.worker_init_fn` runs in every worker, before the caller's own ``worker_init_fn``;
- ``multiprocessing_context`` may be a start method's name ("fork", "spawn", "forkserver");
- ``transport="slots"`` hands batches from workers to the main process through reused shared-memory slots
  (:mod:`fastdata.loading.transport`); ``threads_per_worker`` runs a few threads in each worker (the hybrid,
  :mod:`fastdata.loading.threads`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any, Literal

from torch.utils.data import DataLoader, IterableDataset

from fastdata.core.epoch import WorkerInit, compose_worker_init
from fastdata.core.epoch import worker_init_fn as default_worker_init
from fastdata.core.errors import ConfigError, check_choice, check_positive
from fastdata.core.system import keep_freed_heap
from fastdata.loading._dataloader import FastDataLoader
from fastdata.loading._plan import Collate, ReadPlan, Resolved
from fastdata.loading._protocol import BatchingDataset
from fastdata.loading.threads._hybrid import threaded
from fastdata.loading.transport._collate import private_default_collate, slot_collate_for
from fastdata.loading.transport._samples import PlainBatches

WorkerInitFn = Callable[[int], object]


def batches_itself(dataset: Any) -> bool:
    """Whether ``dataset`` is an iterable dataset that yields whole batches (and so is read unbatched)."""
    return (
        isinstance(dataset, IterableDataset) and isinstance(dataset, BatchingDataset) and dataset.batch_size is not None
    )


def fastdata_worker_init(worker_init_fn: WorkerInitFn | None = None) -> WorkerInit:
    """:data:`fastdata.worker_init_fn` followed by ``worker_init_fn`` (kept as is when it already is one)."""
    if worker_init_fn is None:
        return default_worker_init
    if isinstance(worker_init_fn, WorkerInit):
        return worker_init_fn
    return compose_worker_init(worker_init_fn)


Transport = Literal["slots", "stock"]
"""How worker processes hand batches to the main process: ``"slots"``, through reused shared-memory
slots (:mod:`fastdata.loading.transport`), or ``"stock"``, the DataLoader's own way (a fresh shared tensor
per batch, everything else pickled)."""


def build_dataloader(
    dataset: Any,
    plan: ReadPlan | None = None,
    *,
    num_workers: int = 0,
    worker_init_fn: WorkerInitFn | None = None,
    multiprocessing_context: Any = None,
    transport: Transport = "stock",
    threads_per_worker: int = 1,
    wrap_collate: Callable[[Collate, bool], Collate] | None = None,
    wrap_worker_init: Callable[[WorkerInitFn], WorkerInitFn] | None = None,
    dataloader_class: type[DataLoader[Any]] = FastDataLoader,
    **dataloader_kwargs: Any,
) -> DataLoader[Any]:
    """The DataLoader that reads ``dataset`` the fastdata way (see the module doc).

    Args:
        dataset: any dataset; fastdata's are recognised by their protocol (``fastdata.loading.Dataset``).
        plan (ReadPlan | None): how to read it (batch size, sampler, order, collate function). Defaults to
            None: ``ReadPlan()``, one sample at a time in the dataset's own order.
        num_workers (int): DataLoader worker processes. Defaults to 0.
        worker_init_fn (Callable | None): run in each worker after :data:`fastdata.worker_init_fn`.
        multiprocessing_context (str | BaseContext | None): a start method or its name; ignored without
            workers (torch refuses one there).
        transport ("slots" | "stock"): how workers hand batches over (:data:`Transport`); ignored without
            workers. Defaults to "stock".
        threads_per_worker (int): threads in each worker process that fetch and decode (the hybrid, see
            :mod:`fastdata.loading.threads`); 1: the worker reads by itself. Needs workers when above 1.
            Defaults to 1.
        wrap_collate (Callable | None): ``wrap_collate(collate, batched)`` returns the collate function
            to use instead of the chosen one (``batched``: the DataLoader batches, rather than the
            dataset); the harness's probes hook in here. With ``transport="slots"`` the slots wrap what it
            returns (so the probes time the collate function, and what they return travels in a slot).
        wrap_worker_init (Callable | None): likewise for the composed ``worker_init_fn``.
        dataloader_class (type[DataLoader]): ``DataLoader`` or a subclass (torchdata's
            ``StatefulDataLoader``). Defaults to :class:`~fastdata.loading.FastDataLoader`
            (a ``DataLoader`` without the profiler's marker per batch while no profiler runs).
        **dataloader_kwargs: passed on (``pin_memory``, ``prefetch_factor``, ``persistent_workers`` ...).

    Raises:
        ConfigError: for options that do not apply to this kind of dataset.
    """
    check_choice("transport", transport, Transport)
    check_positive("threads_per_worker", threads_per_worker)
    if threads_per_worker > 1 and not num_workers:
        raise ConfigError(
            f"threads_per_worker={threads_per_worker} runs threads inside worker processes, and there are "
            "none (num_workers=0); pass num_workers >= 1, or read in threads of this process "
            "(fd.Loader(workers='threads'))"
        )
    read = (plan or ReadPlan()).resolve(dataset)
    kwargs: dict[str, Any] = {**dataloader_kwargs, **read.kwargs}
    collate = read.collate
    if transport == "slots" and num_workers:
        collate = slot_collate(read, wrap_collate, bool(kwargs.get("pin_memory")))
    else:
        if num_workers and read.batched:
            collate = PlainBatches(collate)  # the stock way: batches of SlotSample samples pickled as dicts
        if wrap_collate is not None:
            collate = wrap_collate(collate, read.batched)
    kwargs["collate_fn"] = collate
    init: WorkerInitFn = fastdata_worker_init(worker_init_fn)
    kwargs["worker_init_fn"] = wrap_worker_init(init) if wrap_worker_init is not None else init
    if num_workers and multiprocessing_context is not None:
        ctx = multiprocessing_context
        kwargs["multiprocessing_context"] = multiprocessing.get_context(ctx) if isinstance(ctx, str) else ctx
    if threads_per_worker > 1:
        dataset = threaded(dataset, threads_per_worker)
    if num_workers:
        keep_freed_heap()  # the batches' bytes arriving here reuse the heap, not fresh pages (see the module)
    return dataloader_class(dataset, num_workers=num_workers, **kwargs)


def slot_collate(plan: Resolved, wrap_collate: Callable[[Collate, bool], Collate] | None, pin_memory: bool) -> Collate:
    """The collate function that moves ``plan``'s batches through reused slots, with ``wrap_collate``
    (the harness's probes) inside it: the probes then time the collate function alone and count the
    real batch, and what they return (the batch in a wrapper) is laid into the slot like any batch.

    ``default_collate`` chosen here stacks straight into the slot when nothing wraps it; under a wrapper,
    which must see finished tensors, it stacks into private memory (never into a fresh shared tensor
    per batch, which is the cost slots remove). A wrapper class with ``outside_slots = True`` needs no finished
    batch: it wraps the slots' collate function instead, which then stacks into the slot as without it."""
    if wrap_collate is None or getattr(wrap_collate, "outside_slots", False):
        slots = slot_collate_for(
            None if plan.default else plan.collate, prebatched=not plan.batched, pin_memory=pin_memory
        )
        # a wrapper that reads only its input and the time (the monitor's, ``outside_slots = True``) wraps
        # the slots themselves: the batch is stacked straight into the slot as without it (under the other
        # kind, stacking privately and copying into the slot cost the tar demo's workers ~25% more CPU)
        return slots if wrap_collate is None else wrap_collate(slots, plan.batched)
    inner = private_default_collate if plan.default else plan.collate
    return slot_collate_for(wrap_collate(inner, plan.batched), pin_memory=pin_memory)


__all__ = [
    "Transport",
    "batches_itself",
    "build_dataloader",
    "fastdata_worker_init",
    "slot_collate",
]
