"""``build_dataloader``: the one way fastdata builds the ``torch.utils.data.DataLoader`` for a dataset.

:class:`fastdata.Loader`, the benchmark harness (``fastdata.bench``) and the conformance tests all build
their DataLoader here, so all three read a dataset the same way:

- an iterable dataset that batches itself (``TarShardDataset(batch_size=...)``) is read with
  ``batch_size=None`` and :func:`as_is` (its batches are already collated);
- a map-style fastdata dataset is read in the order of its rank-aware ``sampler()``, and batched by its
  own ``collate`` when it has one (``HDF5Dataset``); any other map-style dataset is shuffled by torch;
- :data:`fastdata.worker_init_fn` runs in every worker, before the caller's own ``worker_init_fn``;
- ``multiprocessing_context`` may be a start method's name ("fork", "spawn", "forkserver");
- ``transport="slots"`` hands batches from workers to the main process through reused shared-memory slots
  (:mod:`fastdata.loading.transport`); ``threads_per_worker`` runs a few threads in each worker
  (:mod:`fastdata.loading.hybrid`).

:func:`read_plan` is the part that decides how a dataset is read (sampler, batching, collate function);
the thread mode (:mod:`fastdata.loading.thread_loader`) reads by the same plan.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch.utils.data import DataLoader, IterableDataset, default_collate, default_convert

from fastdata.core.errors import ConfigError, check_choice, check_positive
from fastdata.core.seeding import WorkerInit, compose_worker_init
from fastdata.core.seeding import worker_init_fn as default_worker_init
from fastdata.core.sharding import Remainder
from fastdata.loading.hybrid import threaded
from fastdata.loading.protocol import BatchingDataset, Collating, MapDataset, ResumableBatchSampler
from fastdata.loading.transport import batch_as_is as as_is
from fastdata.loading.transport import private_default_collate, slot_collate_for

Collate = Callable[[Any], Any]
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


@dataclass
class ReadPlan:
    """How a dataset is read, whoever reads it (DataLoader workers or loader threads).

    Attributes:
        kwargs (dict): the DataLoader's ``batch_size`` and ``drop_last``, and its ``sampler`` (with
            ``shuffle`` when there is none) or ``batch_sampler``.
        batched (bool): the reader batches (True), or the dataset yields finished batches or samples.
        collate (Callable): the collate function chosen (the caller's, the dataset's own, :func:`as_is`,
            or torch's default), before any wrapping.
        default (bool): ``collate`` is torch's ``default_collate``, chosen here (a transport may stack
            its tensors elsewhere).
    """

    kwargs: dict[str, Any]
    batched: bool
    collate: Collate
    default: bool = False


def read_plan(
    dataset: Any,
    *,
    batch_size: int | None = None,
    sampler: Any = None,
    batch_sampler: Any = None,
    shuffle: bool = True,
    remainder: Remainder | None = None,
    drop_last: bool = False,
    collate_fn: Collate | None = None,
) -> ReadPlan:
    """The :class:`ReadPlan` of ``dataset`` (see the module doc; the arguments are
    :func:`build_dataloader`'s).

    Raises:
        ConfigError: for options that do not apply to this kind of dataset.
    """
    name = type(dataset).__name__
    kwargs: dict[str, Any] = {}
    default: Collate
    if isinstance(dataset, IterableDataset):
        if sampler is not None or batch_sampler is not None:
            raise ConfigError(f"{name} is iterable and reads its own part of the epoch: pass no sampler")
        if isinstance(dataset, BatchingDataset) and dataset.batch_size is not None:
            own = dataset.batch_size
            if batch_size is not None and batch_size != own:
                raise ConfigError(
                    f"batch_size={batch_size} differs from {name}(batch_size={own}); it batches itself: "
                    "pass batch_size=None or the same size"
                )
            if drop_last:
                raise ConfigError(f"{name} batches itself: set drop_last on the dataset, not here")
            batch_size, batched, default = None, False, as_is
        else:
            batched = batch_size is not None
            default = default_collate if batched else default_convert
            kwargs["drop_last"] = drop_last
        kwargs["batch_size"] = batch_size
    elif batch_sampler is not None:
        if sampler is not None or batch_size is not None or drop_last:
            raise ConfigError(
                "batch_sampler decides the batches: pass batch_size, drop_last and the order to the batch "
                "sampler, not beside it"
            )
        kwargs["batch_sampler"] = batch_sampler
        batched = True
        default = dataset.collate if isinstance(dataset, Collating) else default_collate
    else:
        if isinstance(sampler, ResumableBatchSampler):
            raise ConfigError(f"{type(sampler).__name__} yields whole batches: pass it as batch_sampler=")
        if sampler is None and isinstance(dataset, MapDataset):
            sampler = dataset.sampler(shuffle=shuffle, remainder=remainder or "drop")
        if sampler is not None:
            kwargs["sampler"] = sampler
        else:
            kwargs["shuffle"] = shuffle
        kwargs.update(batch_size=batch_size, drop_last=drop_last)
        batched = batch_size is not None
        if batched:
            default = dataset.collate if isinstance(dataset, Collating) else default_collate
        else:
            default = default_convert
    collate = collate_fn or default
    return ReadPlan(kwargs, batched, collate, default=collate is default_collate)


def build_dataloader(
    dataset: Any,
    *,
    batch_size: int | None = None,
    num_workers: int = 0,
    sampler: Any = None,
    batch_sampler: Any = None,
    shuffle: bool = True,
    remainder: Remainder | None = None,
    drop_last: bool = False,
    collate_fn: Collate | None = None,
    worker_init_fn: WorkerInitFn | None = None,
    multiprocessing_context: Any = None,
    transport: Transport = "stock",
    threads_per_worker: int = 1,
    wrap_collate: Callable[[Collate, bool], Collate] | None = None,
    wrap_worker_init: Callable[[WorkerInitFn], WorkerInitFn] | None = None,
    dataloader_class: type[DataLoader[Any]] = DataLoader,
    **dataloader_kwargs: Any,
) -> DataLoader[Any]:
    """The DataLoader that reads ``dataset`` the fastdata way (see the module doc).

    Args:
        dataset: any dataset; fastdata's are recognised by :mod:`fastdata.loading.protocol`.
        batch_size (int | None): samples per batch, for the DataLoader to batch. An iterable dataset
            that batches itself takes None (or its own batch size); None otherwise means one sample at a
            time. Defaults to None.
        num_workers (int): DataLoader worker processes. Defaults to 0.
        sampler: map-style only: the sampler to read through instead of ``dataset.sampler()``.
        batch_sampler: map-style only: a sampler of whole batches (``HDF5Dataset.chunk_sampler(...)``);
            excludes ``batch_size``, ``sampler``, ``shuffle`` and ``drop_last``.
        shuffle (bool): map-style only: a new order every epoch. Defaults to True.
        remainder ("drop" | "pad" | "uneven" | None): map-style only: passed to ``dataset.sampler()``.
            Defaults to None (the sampler's default, "drop").
        drop_last (bool): drop the last, smaller batch (when the DataLoader batches). Defaults to False.
        collate_fn (Callable | None): Defaults to the dataset's own ``collate`` (map-style, batched),
            :func:`as_is` (a dataset that batches itself), else torch's default.
        worker_init_fn (Callable | None): run in each worker after :data:`fastdata.worker_init_fn`.
        multiprocessing_context (str | BaseContext | None): a start method or its name; ignored without
            workers (torch refuses one there).
        transport ("slots" | "stock"): how workers hand batches over (:data:`Transport`); ignored without
            workers. Defaults to "stock".
        threads_per_worker (int): threads in each worker process that fetch and decode (the hybrid, see
            :mod:`fastdata.loading.hybrid`); 1: the worker reads by itself. Needs workers when above 1.
            Defaults to 1.
        wrap_collate (Callable | None): ``wrap_collate(collate, batched)`` returns the collate function
            to use instead of the chosen one (``batched``: the DataLoader batches, rather than the
            dataset); the harness's probes hook in here. With ``transport="slots"`` the slots wrap what it
            returns (so the probes time the collate function, and what they return travels in a slot).
        wrap_worker_init (Callable | None): likewise for the composed ``worker_init_fn``.
        dataloader_class (type[DataLoader]): ``DataLoader`` or a subclass (torchdata's
            ``StatefulDataLoader``). Defaults to ``DataLoader``.
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
    plan = read_plan(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        batch_sampler=batch_sampler,
        shuffle=shuffle,
        remainder=remainder,
        drop_last=drop_last,
        collate_fn=collate_fn,
    )
    kwargs: dict[str, Any] = {**dataloader_kwargs, **plan.kwargs}
    collate = plan.collate
    if transport == "slots" and num_workers:
        collate = slot_collate(plan, wrap_collate, bool(kwargs.get("pin_memory")))
    elif wrap_collate is not None:
        collate = wrap_collate(collate, plan.batched)
    kwargs["collate_fn"] = collate
    init: WorkerInitFn = fastdata_worker_init(worker_init_fn)
    kwargs["worker_init_fn"] = wrap_worker_init(init) if wrap_worker_init is not None else init
    if num_workers and multiprocessing_context is not None:
        ctx = multiprocessing_context
        kwargs["multiprocessing_context"] = multiprocessing.get_context(ctx) if isinstance(ctx, str) else ctx
    if threads_per_worker > 1:
        dataset = threaded(dataset, threads_per_worker)
    return dataloader_class(dataset, num_workers=num_workers, **kwargs)


def slot_collate(plan: ReadPlan, wrap_collate: Callable[[Collate, bool], Collate] | None, pin_memory: bool) -> Collate:
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
    "ReadPlan",
    "Transport",
    "as_is",
    "batches_itself",
    "build_dataloader",
    "fastdata_worker_init",
    "read_plan",
    "slot_collate",
]
