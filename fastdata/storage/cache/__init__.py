"""The node-local cache: remote shards and objects fetched once per node, into a local folder shared by
every DataLoader worker and every rank on the node (file locks, no coordinator process), each download
written under a temporary name and checked before use, least recently used entries evicted over a limit
but never one a reader on the node has open. :func:`cache_from` builds one from a dataset's
``cache_dir=`` / ``cache_limit=`` (or ``FASTDATA_CACHE_DIR`` / ``FASTDATA_CACHE_LIMIT``). The layout on
disk is described in :mod:`fastdata.storage.cache._layout`, the protocol in
:mod:`fastdata.storage.cache._node`. It knows no format: the datasets decide what goes through it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.storage.cache._config import CacheCheck, CacheDir, cache_from, index_cache, parse_limit
    from fastdata.storage.cache._file import CachedFile
    from fastdata.storage.cache._layout import is_cache
    from fastdata.storage.cache._node import COUNTERS, CacheError, CacheWarning, NodeCache

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CacheCheck": "._config",
        "CacheDir": "._config",
        "cache_from": "._config",
        "index_cache": "._config",
        "parse_limit": "._config",
        "CachedFile": "._file",
        "is_cache": "._layout",
        "COUNTERS": "._node",
        "CacheError": "._node",
        "CacheWarning": "._node",
        "NodeCache": "._node",
    },
)

__all__ = [
    "COUNTERS",
    "CacheCheck",
    "CacheDir",
    "CacheError",
    "CacheWarning",
    "CachedFile",
    "NodeCache",
    "cache_from",
    "index_cache",
    "is_cache",
    "parse_limit",
]
