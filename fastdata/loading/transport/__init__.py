"""Batches from worker processes to the training process through reused shared-memory slots: each worker
packs a batch into a slot it owns (``_layout`` says where each tensor, array and byte string goes), the
main process maps the slot once and hands out views, and the slot is reused when they are dropped
(``_registry``); slots are page-locked once where CUDA exists (``_pinning``). :class:`SlotCollate` is the
collate function that does it; :func:`slot_dataloader` builds a plain DataLoader with it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.transport._collate import (
        SlotCollate,
        SlotOptions,
        batch_default_collate,
        checked_default_collate,
        slot_dataloader,
    )
    from fastdata.loading.transport._layout import PackedBytes
    from fastdata.loading.transport._registry import release, reset_counts, stats
    from fastdata.loading.transport._samples import slot_sample, slot_samples
    from fastdata.loading.transport._slots import WorkerRing, stacking

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "PackedBytes",
    "SlotCollate",
    "SlotOptions",
    "WorkerRing",
    "batch_default_collate",
    "checked_default_collate",
    "release",
    "reset_counts",
    "slot_dataloader",
    "slot_sample",
    "slot_samples",
    "stacking",
    "stats",
]
