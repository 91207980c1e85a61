"""Samples that carry their batch through a slot when a plain ``DataLoader`` batches them.

A dataset read per sample through ``DataLoader(ds, batch_size=64, num_workers=W)`` with the default
collate function gets its batches pickled by the stock transport: a dict of lists of ``bytes``, every
value copied into the pipe one by one (15.6k samples/s of ~30 KB bytes here, against 101k in the
training process). The user did not ask for slots, and the DataLoader's ``collate_fn`` is theirs; but
``default_collate`` builds a batch of dict samples as ``copy.copy(first_sample)`` updated with the
collated lists, so a batch of :class:`SlotSample` samples is a ``SlotSample`` too, and that is the hook:
pickled in a worker (by the DataLoader's queue), a ``SlotSample`` packs itself into one of the worker's
reused slots (:class:`~fastdata.loading.transport.WorkerRing`) and travels as a small descriptor;
the main process gets a plain ``dict`` whose lists of bytes are ``bytes`` again. Anywhere else (the main
process, ``copy``, ``pickle`` outside a worker) it is a plain dict.

fastdata's datasets hand out ``SlotSample`` samples in DataLoader worker processes only
(:func:`slot_samples`); a batch that finds no free slot, or has nothing a slot carries, goes the stock way.
``fd.Loader`` batches through its own slots and unwraps them (:mod:`fastdata.loading.transport`).
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import get_worker_info

from fastdata.core import process
from fastdata.loading.transport import _slots
from fastdata.loading.transport._layout import PlainDict

_WIRE = ("bytes", False, False, None)  # what the main process makes of the batch: bytes as bytes, views
# never wait for a free slot: a SlotSample may be pickled inside a list (collate_fn=list), one slot per
# sample, and a batch of 64 would then wait for slots its own earlier samples hold; such samples go the
# stock way at once
_WAIT_S = 0.0


class SlotSample(PlainDict):
    """A sample dict that, pickled in a DataLoader worker, travels through one of the worker's slots (see
    the module doc); everywhere else a plain ``dict``."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        if get_worker_info() is None or not _collated(self):
            return (dict, (dict(self),))
        return _ring().pack(dict(self), _WAIT_S, _WIRE).__reduce__()

    def __copy__(self) -> SlotSample:
        return SlotSample(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> SlotSample:
        return SlotSample(_copy.deepcopy(dict(self), memo))


def _collated(sample: dict[str, Any]) -> bool:
    """Whether ``sample`` is a batch (``default_collate`` made its values lists): one sample on its own,
    in a list (``collate_fn=list``) or as ``batch_size=None`` hands it over, pickles faster as it is
    than through a slot of its own (measured: 7.3k against 9.6k samples/s for ``collate_fn=list``)."""
    return any(type(v) is list and v and type(v[0]) is bytes for v in sample.values())


_rings: dict[int, _slots.WorkerRing] = {}  # this worker's ring, by pid (a forked child makes its own)


def _ring() -> _slots.WorkerRing:
    pid = process.pid()
    ring = _rings.get(pid)
    if ring is None:
        _rings.clear()
        ring = _rings[pid] = _slots.WorkerRing(6, 1 << 30)
    return ring


class PlainBatches:
    """A ``collate_fn`` wrapper that hands its batches on as plain dicts: for the stock transport, which
    must pickle them the DataLoader's own way (``fd.Loader(transport="stock")``)."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> Any:
        batch = self.collate_fn(samples)
        return dict(batch) if isinstance(batch, SlotSample) else batch

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlainBatches) and other.collate_fn == self.collate_fn

    def __hash__(self) -> int:
        return hash(self.collate_fn)

    def __repr__(self) -> str:
        return f"PlainBatches({self.collate_fn!r})"


def slot_samples(samples: Iterator[Any]) -> Iterator[Any]:
    """``samples``, each dict a :class:`SlotSample` when this is a DataLoader worker (the same iterator
    elsewhere: no generator in between, which costs a hop per sample)."""
    if get_worker_info() is None:
        return samples
    return _as_slot_samples(samples)


def _as_slot_samples(samples: Iterator[Any]) -> Iterator[Any]:
    for sample in samples:
        yield SlotSample(sample) if type(sample) is dict else sample


def slot_sample(sample: Any) -> Any:
    """One sample as :func:`slot_samples` would hand it out."""
    return SlotSample(sample) if type(sample) is dict and get_worker_info() is not None else sample


__all__ = ["PlainBatches", "SlotSample", "slot_sample", "slot_samples"]
