"""Videos in an object store (``s3://``), read through the node-local cache.

The decoders (FFmpeg's demuxers behind PyAV, decord, OpenCV) open files and seek in them at will, so a
remote video is read from a whole local copy: the node-local cache's (:mod:`fastdata.storage.cache`),
downloaded once per node and shared by every worker and rank on it. A reader holds its copy (the cache's
pin: no eviction removes it) while it is open, and lets it go when it closes. Each copy is checked against
the checksums recorded at its download before a decoder sees it (once per process and copy).

A video's version is asked of the store once per node after the dataset was built (the clip index was
made from the versions then): a video replaced later is read as it is now, its clips as the index says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from fastdata.core.errors import ConfigError
from fastdata.storage import ObjectChanged, Remote, open_remote
from fastdata.storage.cache import CachedFile, CacheDir, NodeCache, cache_from, index_cache


def video_cache(cache_dir: CacheDir, cache_limit: int | str | None, first: str) -> NodeCache:
    """The cache remote videos are read through: the one asked for (``cache_dir`` or
    ``$FASTDATA_CACHE_DIR``), else fastdata's own cache folder (limited to ``cache_limit``, or half of the
    free disk), made ready now so that an unusable folder fails here and not in a worker.

    Raises:
        ConfigError: ``cache_dir=False`` (the decoders need a local copy).
        CacheError: the folder cannot be used.
    """
    if cache_dir is False:
        raise ConfigError(
            f"{first}: VideoClipDataset reads remote videos from local copies in the node-local cache (the "
            "decoders seek in files), so cache_dir=False cannot work; give cache_dir= a folder on a local disk "
            "(and cache_limit=)"
        )
    cache = cache_from(cache_dir, cache_limit) or index_cache(cache_limit)
    cache.prepare()
    return cache


class RemoteVideos:
    """Local copies of one dataset's remote videos, per process.

    Args:
        cache (NodeCache): the node-local cache.
        example (str): one of the videos (which store to download from).
        options (dict): the store's options (``storage_options``: endpoint, credentials ...).
        counters: where requests and cache counters are counted (the dataset's shared state).
    """

    def __init__(self, cache: NodeCache, example: str, options: dict[str, Any], counters: Any) -> None:
        self.cache, self.example, self.options, self.counters = cache, example, options, counters
        self.built = time.time_ns()  # versions asked of the store after this are good (see the module)
        self._remote: Remote | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_remote": None}  # a store client is built in each process

    def remote(self) -> Remote:
        if self._remote is None:
            self._remote = open_remote(self.example, self.counters, **self.options)
        return self._remote

    def stat(self, url: str, listed: int | None) -> Any:
        """``url``'s state for the video index: its listed size (or the store's, one HEAD, with a number
        from its ETag so that a new version is probed again)."""
        if listed is not None:
            return SimpleNamespace(st_size=listed, st_mtime_ns=0)
        version = self.remote().stat(url)
        return SimpleNamespace(st_size=version.size, st_mtime_ns=int.from_bytes(version.etag.encode()[-8:], "big"))

    def locate(self, url: str) -> tuple[str, Callable[[], None]]:
        """The local copy of ``url`` (downloaded first if the node has none), checked, and what lets it go.

        Raises:
            ConfigError: the video is larger than the cache's limit.
            SourceNotFound, SourceUnreadable, SourceUnavailable: from the store.
        """
        cached = self._open(url)
        try:
            view = cached.buffer()  # every block checked before a decoder reads the file
            if isinstance(view, memoryview):
                view.release()
        except BaseException:
            cached.close()
            raise
        return cached.path, cached.close

    def _open(self, url: str) -> CachedFile:
        try:
            cached = self.cache.open(url, self.remote(), since=self.built)
        except ObjectChanged:  # replaced during the download: read it as it is now
            cached = self.cache.open(url, self.remote())
        if cached is None:
            raise ConfigError(
                f"{url}: larger than cache_limit={self.cache.limit} bytes, and the decoders read remote videos "
                "from the cache's local copy; raise cache_limit"
            )
        return cached


__all__ = ["RemoteVideos", "video_cache"]
