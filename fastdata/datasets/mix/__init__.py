"""``Mix``: samples drawn from several fastdata datasets in set proportions (``_mix``), reading each source
by draw number (``_sources``), the next mixed batch read ahead (``_ahead``) and its small parts (``_parts``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.datasets.mix._mix import Mix

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "Mix",
]
