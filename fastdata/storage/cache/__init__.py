"""The node-local cache: remote shards and objects fetched once per node, into a local folder shared by
every DataLoader worker and every rank on the node (file locks, no coordinator process), each download
written under a temporary name and checked before use, least recently used entries evicted over a limit
but never one a reader on the node has open. :func:`cache_from` builds one from a dataset's
``cache_dir=`` / ``cache_limit=`` (or ``FASTDATA_CACHE_DIR`` / ``FASTDATA_CACHE_LIMIT``). The layout on
disk is described in :mod:`fastdata.storage.cache`, the protocol in
:mod:`fastdata.storage.cache`. It knows no format: the datasets decide what goes through it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.core.errors import CacheError
    from fastdata.storage.cache._config import SUBFOLDER, CacheCheck, CacheDir, cache_from, index_cache, parse_limit
    from fastdata.storage.cache._file import CachedFile
    from fastdata.storage.cache._fill import Filler
    from fastdata.storage.cache._layout import Layout, is_cache
    from fastdata.storage.cache._locks import lock, release
    from fastdata.storage.cache._node import COUNTERS, CacheWarning, NodeCache

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "COUNTERS",
    "SUBFOLDER",
    "CacheCheck",
    "CacheDir",
    "CacheError",
    "CacheWarning",
    "CachedFile",
    "Filler",
    "Layout",
    "NodeCache",
    "cache_from",
    "index_cache",
    "is_cache",
    "lock",
    "parse_limit",
    "release",
]
