"""Handing batches from DataLoader workers to the main process through reused shared-memory slots.

The stock DataLoader moves every batch through freshly allocated shared memory (a new torch shared
tensor per batch, whose pages are touched for the first time in the worker and mapped anew in the main
process) and pickles whatever is not a tensor (lists of ``bytes`` go through the pipe, copied four
times). On the machines this was measured on, fresh pages fill at ~0.5 GB/s against ~6 GB/s for reused
ones, so that, not reading, is the ceiling of a loader with workers.

:class:`SlotCollate` is a ``collate_fn`` that writes each batch into a slot that its worker owns and
reuses (see :mod:`fastdata.loading.transport`), and hands the main process a small descriptor; the batch the
user gets has tensors and arrays that are views of the slot, so nothing is copied on the way in. Use it
with a plain DataLoader (or :func:`slot_dataloader`)::

    from fastdata.loading.transport import SlotCollate, slot_dataloader

    loader = DataLoader(ds, batch_size=64, sampler=ds.sampler(), num_workers=4,
                        collate_fn=SlotCollate(ds.collate))           # map-style
    loader = DataLoader(tar_ds, batch_size=None, num_workers=4,
                        collate_fn=SlotCollate(prebatched=True))          # TarShardDataset(batch_size=64)
    loader = slot_dataloader(ds, batch_size=64, num_workers=4)         # the same, wrapped for you

When is a slot reused? Once the user has dropped every tensor, array and ``PackedBytes`` of its batch
(views of them included): a kept batch is never overwritten. A worker that finds no free slot (the
consumer keeps many batches) sends that batch the stock way instead, so keeping batches costs speed,
never correctness. ``hold=N`` lets a slot be reused once ``N`` later batches have arrived even if its
batch is still referenced (its tensors then change under you: for loops that never keep a batch but
hold one by accident); ``copy=True`` hands out private copies (still no pickling, no fresh shared pages).

Pinned once: with ``pin=True`` (set for you by :func:`slot_dataloader` and :func:`slot_collate_for` when
``pin_memory=True``) the main process page-locks each slot once, where CUDA is available, so the
DataLoader's pin-memory step costs nothing per batch (see :mod:`fastdata.loading.transport`).

Straight into the slot: with ``collate_fn=None`` samples' tensors are stacked straight into the slot;
a dataset that reads whole batches can allocate them in the slot with
``SlotPool`` (the ``BufferPool.empty`` interface), and then packing copies
nothing at all.

In the main process (``num_workers=0``) the collate function is applied unchanged. A DataLoader builder
(``fd.Loader``) passes :func:`slot_collate_for` as its ``collate_fn`` when it has workers, and calls
:func:`fastdata.loading.transport.release` when it closes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info
from torch.utils.data._utils.collate import (
    collate,
    collate_tensor_fn,
    default_collate_err_msg_format,
    default_collate_fn_map,
    np_str_obj_array_pattern,
)

from fastdata.core import process
from fastdata.core.errors import ConfigError, check_choice, check_positive
from fastdata.loading._batching import Unequal, as_tensors, check_shapes, explain
from fastdata.loading.transport._layout import BytesAs, Stack, packed_lists
from fastdata.loading.transport._slots import WorkerRing, stack_in_slots, stacking


@dataclass(frozen=True)
class SlotOptions:
    """How a worker's slots are sized and reused (see the module doc).

    Args:
        slots (int): slots per worker at most. Defaults to 6: the DataLoader keeps ``prefetch_factor``
            (2) batches per worker in flight, the user holds one, the pin-memory thread may hold one, and
            two spare cover a consumer that keeps one or two more.
        max_bytes (int): bytes of slots per worker at most. Defaults to 1 GiB. Each slot is made a quarter
            larger than the batch that first needed it; a batch larger than this travels the stock way.
        bytes_as ("bytes" | "packed"): what a list of ``bytes`` values becomes: ``bytes`` objects copied
            out of the slot (as through the pipe), or one :class:`~fastdata.loading.transport.PackedBytes`
            of views (no copy). Defaults to ``"bytes"``.
        copy (bool): hand out private copies and free the slot at once. Defaults to False.
        hold (int | None): free a slot at the latest when this many later batches have arrived in the main
            process, even if its batch is still referenced. Defaults to None (only when dropped).
        pin (bool): page-lock slots once in the main process, where CUDA is available. Defaults to False.
        wait_s (float): how long a worker waits for a free slot before sending a batch the stock way, in
            seconds. Defaults to 0.05.
    """

    slots: int = 6
    max_bytes: int = 1 << 30
    bytes_as: BytesAs = "bytes"
    copy: bool = False
    hold: int | None = None
    pin: bool = False
    wait_s: float = 0.05

    def __post_init__(self) -> None:
        check_positive("slots", self.slots)
        check_positive("max_bytes", self.max_bytes)
        check_choice("bytes_as", self.bytes_as, BytesAs)
        check_positive("wait_s", self.wait_s, allow_zero=True)
        if self.hold is not None:
            check_positive("hold", self.hold)
        if self.copy and self.hold is not None:
            raise ConfigError("copy=True frees every slot at once; hold= has nothing to do with it: pass one")


def _stack_later(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> Stack:
    check_shapes(batch)  # here, where the samples are known, not in the slot (see _checked)
    return Stack(list(batch))


def _arrays(batch: list[np.ndarray], *, collate_fn_map: Any = None) -> Any:
    """Numpy arrays as ``default_collate`` batches them (as tensors), read-only ones without torch's
    warning (see ``as_tensors``)."""
    if np_str_obj_array_pattern.search(batch[0].dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(batch[0].dtype))
    return collate(as_tensors(batch), collate_fn_map=collate_fn_map)


def _stack_checked(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    check_shapes(batch)
    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)  # in a worker: into shared memory


def _checked(samples: list[Any], collate_fn_map: dict[Any, Any]) -> Any:
    """``collate`` with ``collate_fn_map``; where the samples do not batch (images of different sizes, PIL
    images), a :class:`~fastdata.core.errors.CannotBatch` naming the key, the samples and the fixes."""
    try:
        return collate(samples, collate_fn_map=collate_fn_map)
    except (Unequal, RuntimeError, TypeError, KeyError) as e:
        why = explain(samples)
        if why is None:
            raise
        raise why from (None if isinstance(e, Unequal) else e)


def _views_as_list(batch: list[memoryview], *, collate_fn_map: Any = None) -> list[memoryview]:
    """Members read as views of their shard (see ``TarShardDataset``): kept as a list, as ``bytes`` are,
    for the slot to copy (``default_collate`` would take a view for a sequence and transpose it)."""
    return list(batch)


_LATER_MAP = {
    **default_collate_fn_map,
    torch.Tensor: _stack_later,
    np.ndarray: _arrays,
    memoryview: _views_as_list,
}
_CHECKED_MAP = {**default_collate_fn_map, torch.Tensor: _stack_checked, np.ndarray: _arrays}


def checked_default_collate(samples: list[Any]) -> Any:
    """``default_collate``, except that samples that do not batch raise
    :class:`~fastdata.core.errors.CannotBatch` saying why and what to do, and read-only numpy arrays do
    not make torch warn."""
    return _checked(samples, _CHECKED_MAP)


def slot_default_collate(samples: list[Any]) -> Any:
    """``default_collate``, except that tensors (and numpy arrays, which it turns into tensors) are left
    to be stacked straight into the slot: in a worker, ``default_collate`` would stack them into fresh
    shared memory, the very cost slots avoid. Samples that do not batch raise
    :class:`~fastdata.core.errors.CannotBatch`, as :func:`checked_default_collate` does."""
    return _checked(samples, _LATER_MAP)


def _stack_private(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    check_shapes(batch)
    return torch.stack(batch, 0)


_PRIVATE_MAP = {**default_collate_fn_map, torch.Tensor: _stack_private, np.ndarray: _arrays}


def private_default_collate(samples: list[Any]) -> Any:
    """``default_collate``, except that in a worker it stacks tensors into private memory, not into a new
    shared tensor per batch: for a collate function that wraps ``default_collate`` and must see finished
    tensors (the harness's probes) under :class:`SlotCollate`, which copies the batch into its slot."""
    return _checked(samples, _PRIVATE_MAP)


def batch_as_is(batch: Any) -> Any:
    """The ``collate_fn`` for a dataset that yields finished batches (``TarShardDataset(batch_size=...)``).

    With ``batch_size=None`` the DataLoader otherwise runs ``default_convert`` over every batch: for a
    batch of 64 dicts of bytes that is ~0.5 ms (8 us a sample, measured here), as much as reading the
    samples, to redo what the dataset's own collate already did. Pass it to a plain ``DataLoader`` too
    (``fastdata.as_is`` is this function).
    """
    return batch


def batch_default_collate(samples: list[Any]) -> Any:
    """The collate function of a dataset that batches itself (``TarShardDataset``'s default):
    ``default_collate``, except in a worker whose :class:`SlotCollate` hands the dataset's batches on
    unchanged (``prebatched=True``), where tensors are left to be stacked straight into the slot (as
    :func:`slot_default_collate` does) instead of into a fresh shared tensor per batch that the slot
    would then copy. Samples that do not batch raise :class:`~fastdata.core.errors.CannotBatch` naming
    the key, the samples and the fixes (see :mod:`fastdata.loading`)."""
    return slot_default_collate(samples) if stacking() else checked_default_collate(samples)


class SlotCollate:
    """A ``collate_fn`` that hands each batch to the main process through a reused slot (see the module).

    Args:
        collate_fn (Callable | None): builds the batch in the worker. Defaults to ``default_collate``
            (stacking straight into the slot), or to passing the item on with ``prebatched=True``.
        prebatched (bool): the DataLoader's items are finished batches (``batch_size=None`` over a dataset
            that batches itself). Defaults to False.
        options (SlotOptions | None): sizes and reuse; or pass its fields as keywords.
        **fields: :class:`SlotOptions` fields (``slots``, ``max_bytes``, ``bytes_as``, ``copy``, ``hold``,
            ``pin``, ``wait_s``).

    Raises:
        ConfigError: a bad option (at construction).
    """

    def __init__(
        self,
        collate_fn: Callable[[Any], Any] | None = None,
        *,
        prebatched: bool = False,
        options: SlotOptions | None = None,
        **fields: Any,
    ) -> None:
        if options is not None and fields:
            raise ConfigError("pass options= or SlotOptions fields as keywords, not both")
        try:
            self.options = options or SlotOptions(**fields)
        except TypeError as e:  # an unknown keyword
            names = ", ".join(f.name for f in dataclasses.fields(SlotOptions))
            raise ConfigError(f"SlotCollate: {e}; the options are {names}") from None
        if prebatched and collate_fn is None:
            collate_fn = batch_as_is
        self.collate_fn = collate_fn
        o = self.options
        self._wire = (o.bytes_as, o.copy, o.pin, o.hold)
        self._ring: WorkerRing | None = None

    def replace(self, **changes: Any) -> SlotCollate:
        """A copy with ``collate_fn`` and/or :class:`SlotOptions` fields changed."""
        collate_fn = changes.pop("collate_fn", self.collate_fn)
        return SlotCollate(collate_fn, options=dataclasses.replace(self.options, **changes))

    def __call__(self, samples: Any) -> Any:
        if get_worker_info() is None:
            batch = (self.collate_fn or default_collate)(samples)
            return packed_lists(batch) if self.options.bytes_as == "packed" else batch
        if self.collate_fn is batch_as_is:
            stack_in_slots()  # the dataset's own batches come here unchanged: they may hold Stacks
        batch = self.collate_fn(samples) if self.collate_fn is not None else slot_default_collate(samples)
        ring = self._ring
        if ring is None or ring.pid != process.pid():
            ring = self._ring = WorkerRing(self.options.slots, self.options.max_bytes)
        return ring.pack(batch, self.options.wait_s, self._wire)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ring": None}  # a ring belongs to one worker process

    def __repr__(self) -> str:
        return f"SlotCollate({self.collate_fn!r}, {self.options})"


def slot_collate_for(
    collate_fn: Callable[[Any], Any] | None,
    *,
    prebatched: bool = False,
    pin_memory: bool = False,
    transport: SlotCollate | None = None,
) -> SlotCollate:
    """The ``collate_fn`` a DataLoader builder passes to move its batches through slots.

    ``default_collate`` (or None) becomes :func:`slot_default_collate`, which stacks straight into the
    slot (in a worker ``default_collate`` stacks into fresh shared memory, the cost slots remove); a
    :class:`SlotCollate` is kept (pinned if ``pin_memory``); anything else is wrapped.

    Args:
        collate_fn (Callable | None): the user's (or the dataset's) collate function, or None.
        prebatched (bool): the DataLoader's items are finished batches (``batch_size=None`` over a
            dataset that batches itself) and ``collate_fn`` is None: pass them on as they are.
        pin_memory (bool): the DataLoader pins memory: pin the slots once instead.
        transport (SlotCollate | None): options to start from. Defaults to ``SlotCollate()``.
    """
    if isinstance(collate_fn, SlotCollate):  # the user chose already
        return collate_fn.replace(pin=True) if pin_memory and not collate_fn.options.pin else collate_fn
    base = transport or SlotCollate()
    if collate_fn is default_collate:
        collate_fn = None
    if collate_fn is None and prebatched:
        collate_fn = batch_as_is
    changes: dict[str, Any] = {"collate_fn": collate_fn if collate_fn is not None else base.collate_fn}
    if pin_memory:
        changes["pin"] = True
    return base.replace(**changes)


def slot_dataloader(dataset: Any, *, transport: SlotCollate | None = None, **dataloader_kwargs: Any) -> DataLoader[Any]:
    """A ``DataLoader`` over ``dataset`` whose workers hand batches over through slots.

    ``collate_fn`` (yours, or for an iterable dataset that batches itself with ``batch_size=None``, none)
    is wrapped in a :class:`SlotCollate`; ``pin_memory=True`` pins the slots once. Everything else goes to
    the DataLoader as given. With ``num_workers=0`` it is a plain DataLoader.

    Args:
        dataset: any dataset.
        transport (SlotCollate | None): slot options to use. Defaults to ``SlotCollate()``.
        **dataloader_kwargs: for ``torch.utils.data.DataLoader``.
    """
    kwargs = dict(dataloader_kwargs)
    if kwargs.get("num_workers", 0):
        prebatched = "batch_size" in kwargs and kwargs["batch_size"] is None and "batch_sampler" not in kwargs
        own = getattr(dataset, "batch_size", None)
        if isinstance(dataset, IterableDataset) and not prebatched and own:
            raise ConfigError(f"{type(dataset).__name__} batches itself (batch_size={own}): pass batch_size=None")
        kwargs["collate_fn"] = slot_collate_for(
            kwargs.get("collate_fn"),
            prebatched=prebatched,
            pin_memory=bool(kwargs.get("pin_memory")),
            transport=transport,
        )
    return DataLoader(dataset, **kwargs)


__all__ = [
    "SlotCollate",
    "SlotOptions",
    "batch_as_is",
    "batch_default_collate",
    "checked_default_collate",
    "private_default_collate",
    "slot_collate_for",
    "slot_dataloader",
    "slot_default_collate",
]
