"""How a tar dataset reads remote shards through a node-local cache (see :mod:`fastdata.storage.cache`), in
one process: each remote URL (shard, sidecar, manifest) opened from its local copy, its version asked
of the store once per epoch and node (or once after the dataset was built), remembered for the epoch so
that reopening a shard costs no request, and the next shards of this process's plan filled ahead."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fastdata.storage import ObjectChanged, Remote, Version, open_remote
from fastdata.storage.cache import CacheCheck, CachedFile, Filler, NodeCache


class CachedShards:
    """Remote shards of one dataset, read through ``cache``.

    Args:
        cache (NodeCache): the node's cache folder.
        example (str): one of the dataset's remote URLs (which store the cache downloads from).
        options (dict): the store's reader options (``storage_options``).
        stats: where requests are counted (the dataset's shared state).
        read_ahead (int): shards of the plan downloaded ahead of the one being read.
        check ("epoch" | "build"): when versions are asked of the store (see
            :data:`~fastdata.storage.cache.CacheCheck`).
        held (int): shard readers this process holds open at once (each pins its shard).
    """

    def __init__(
        self,
        cache: NodeCache,
        example: str,
        options: dict[str, Any],
        stats: Any,
        *,
        read_ahead: int,
        check: CacheCheck,
        held: int,
    ) -> None:
        self.cache, self._example, self._options, self._stats = cache, example, options, stats
        self.read_ahead, self.check, self.held = read_ahead, check, held
        self._built = time.time_ns()
        self._epoch_began: int | None = None  # time.time_ns() when this process began its epoch
        self._remote: Remote | None = None  # built on first use in each process
        self._filler: Filler | None = None
        self._versions: dict[str, Version] = {}  # remote URL -> the version this process read this epoch
        self._ordered: list[str] = []  # this process's plan (see plan())
        self._order: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_remote"], state["_filler"], state["_versions"] = None, None, {}
        return state

    def remote(self) -> Remote:
        """The store's side of the cache (versions, whole downloads)."""
        if self._remote is None:
            self._remote = open_remote(self._example, self._stats, **self._options)
        return self._remote

    def since(self) -> int | None:
        """Versions asked of the store at or after this time are good (see ``NodeCache.version``)."""
        return self._built if self.check == "build" else self._epoch_began

    def new_epoch(self) -> None:
        """A new epoch begins in this process: versions asked before it are not good for it."""
        self._versions.clear()
        self._epoch_began = time.time_ns()
        if self._filler is not None:
            self._filler.forget(self.since())

    def open(self, url: str) -> CachedFile | None:
        """The local copy of ``url`` (downloaded first if the node has none), or None when it is larger
        than the cache's limit (the caller reads it from the store)."""
        known = self._versions.get(url)
        if known is None and self._filler is not None:
            known = self._filler.version(url)  # asked by the read-ahead, off this thread's path
        try:
            cached = self.cache.open(url, self.remote(), known, since=self.since())
        except ObjectChanged:  # evicted since, and replaced in the store: read it as it is now
            self._versions.pop(url, None)
            cached = self.cache.open(url, self.remote())
        if cached is not None:
            self._versions[url] = cached.version
        return cached

    def plan(self, urls: Sequence[str]) -> None:
        """The shards this process reads next, in order: their versions are asked and the first
        ``read_ahead`` downloaded in the background now, and each one opened has those after it filled."""
        self._ordered = list(dict.fromkeys(urls))
        self._order = {u: i for i, u in enumerate(self._ordered)}
        if self.read_ahead:
            self._filling().ahead(self._ordered)

    def opened(self, url: str) -> None:
        """``url`` was opened: fill the cache with what follows it in the plan."""
        at = self._order.get(url)
        if at is not None and self.read_ahead:
            self._filling().ahead(self._ordered[at + 1 :])

    def _filling(self) -> Filler:
        if self._filler is None:
            self._filler = Filler(self.cache, self.remote, self.read_ahead, held=self.held)
            self._filler.since = self.since()
        return self._filler

    def close(self) -> None:
        """Drop the read-ahead not yet started."""
        if self._filler is not None:
            self._filler.cancel()


__all__ = ["CachedShards"]
