"""The tar datasets: :class:`TarShardDataset` (streamed, ``_shards``) and :class:`IndexedTarDataset`
(random access, ``_indexed``), the shards they share (``_source``), remote shards read through the
node-local cache (``_cached_shards``), and their side of the resume protocol (``_resume``, and ``_elastic``
for another number of ranks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.datasets.tar._indexed import IndexedTarDataset
    from fastdata.datasets.tar._shards import TarShardDataset
    from fastdata.datasets.tar._source import tar_urls

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "IndexedTarDataset",
    "TarShardDataset",
    "tar_urls",
]
