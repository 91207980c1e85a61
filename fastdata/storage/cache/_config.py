"""A dataset's ``cache_dir=`` and ``cache_limit=``, and their environment defaults."""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Literal, Union

from fastdata.core import default_cache_dir
from fastdata.core.errors import ConfigError
from fastdata.storage.cache._node import NodeCache

CacheDir = Union[str, "os.PathLike[str]", Literal[False], None]
"""A folder; None: ``$FASTDATA_CACHE_DIR/remote`` when that variable is set, else no cache; False: no cache."""

CacheCheck = Literal["epoch", "build"]
"""When a cached object's version is asked of the store: ``"epoch"``, once per epoch and node (a HEAD, by
the first process of the node that opens it in the epoch: an object replaced between epochs is read as
it is now); ``"build"``, once per node after the dataset was built (objects are taken to stay as they
were: a replacement is seen by a dataset built later)."""

ENV_DIR = "FASTDATA_CACHE_DIR"
ENV_LIMIT = "FASTDATA_CACHE_LIMIT"
SUBFOLDER = "remote"  # under $FASTDATA_CACHE_DIR, beside the other things fastdata keeps there
INDEX_SHARE = 0.5  # the fallback cache of shards downloaded to be indexed: at most this share of the free disk
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12}
_UNITS |= {"tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_limit(limit: int | str | None, name: str = "cache_limit") -> int | None:
    """Bytes in ``limit``: a number of bytes, or a size like ``"50GB"``, ``"1.5TiB"``; None: no limit.

    Raises:
        ConfigError: it is not a size, or not above 0.
    """
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        raise ConfigError(f"{name}={limit!r}: give a number of bytes or a size like '50GB'")
    if isinstance(limit, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", limit)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ConfigError(f"{name}={limit!r} is not a size; write it like 50GB, 500MiB or a number of bytes")
        limit = int(float(m.group(1)) * _UNITS[unit])
    if limit <= 0:
        raise ConfigError(f"{name}={limit!r}: must be more than 0 bytes (or None for no limit)")
    return limit


def cache_from(cache_dir: CacheDir, cache_limit: int | str | None, counters: Any = None) -> NodeCache | None:
    """The cache a dataset asked for, or None.

    Args:
        cache_dir: a folder; None: ``$FASTDATA_CACHE_DIR/remote`` when ``FASTDATA_CACHE_DIR`` is set,
            else no cache; False: no cache, whatever the environment says.
        cache_limit: the most bytes it may hold (int, or a size like ``"50GB"``); None:
            ``$FASTDATA_CACHE_LIMIT`` when set, else no limit.
        counters: where the cache's counters go (the dataset's shared state).

    Raises:
        ConfigError: a limit that is not a size, a ``cache_dir`` of the wrong type.
    """
    if cache_dir is False:
        return None
    if cache_dir is None:
        env = os.environ.get(ENV_DIR)
        if not env:
            return None
        cache_dir = os.path.join(env, SUBFOLDER)
    if not isinstance(cache_dir, (str, os.PathLike)) or not os.fspath(cache_dir):
        raise ConfigError(f"cache_dir={cache_dir!r}: give a folder, None (the environment's) or False (no cache)")
    if cache_limit is None and os.environ.get(ENV_LIMIT):
        limit = parse_limit(os.environ[ENV_LIMIT], ENV_LIMIT)
    else:
        limit = parse_limit(cache_limit)
    return NodeCache(os.path.abspath(os.fspath(cache_dir)), limit, counters)


def index_cache(cache_limit: int | str | None, counters: Any = None) -> NodeCache:
    """The cache a dataset falls back on when remote shards have no index beside them (no ``.idx`` sidecar,
    no manifest: shards written by webdataset or ``tar``) and it was given no ``cache_dir``: indexing such a
    shard means downloading it whole, so the download is kept and the samples are read from it, one fetch
    instead of two. It is fastdata's own cache folder (``default_cache_dir() / "remote"``), limited to
    ``cache_limit``, or ``$FASTDATA_CACHE_LIMIT``, or half of the free space on its disk now."""
    folder = default_cache_dir() / SUBFOLDER
    if cache_limit is None and os.environ.get(ENV_LIMIT):
        limit = parse_limit(os.environ[ENV_LIMIT], ENV_LIMIT)
    elif cache_limit is not None:
        limit = parse_limit(cache_limit)
    else:
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        limit = max(1, int(INDEX_SHARE * shutil.disk_usage(existing).free))
    return NodeCache(os.path.abspath(folder), limit, counters)


__all__ = ["ENV_DIR", "ENV_LIMIT", "CacheCheck", "CacheDir", "cache_from", "index_cache", "parse_limit"]
