"""Batches from worker processes to the training process through reused shared-memory slots: each worker
packs a batch into a slot it owns (``_layout`` says where each tensor, array and byte string goes), the
main process maps the slot once and hands out views, and the slot is reused when they are dropped
(``_registry``); slots are page-locked once where CUDA exists (``_pinning``). :class:`SlotCollate` is the
collate function that does it; :func:`slot_dataloader` builds a plain DataLoader with it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.transport._collate import SlotCollate, SlotOptions, release, slot_dataloader, stats
    from fastdata.loading.transport._layout import PackedBytes

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SlotCollate": "._collate",
        "SlotOptions": "._collate",
        "release": "._collate",
        "slot_dataloader": "._collate",
        "stats": "._collate",
        "PackedBytes": "._layout",
    },
)

__all__ = ["PackedBytes", "SlotCollate", "SlotOptions", "release", "slot_dataloader", "stats"]
