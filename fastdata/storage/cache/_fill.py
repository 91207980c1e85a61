"""Read-ahead that fills the cache, in the order its reader will open objects:

* the versions of the next ``check`` objects are asked for in parallel, by a few threads of this process
  (of the store, a HEAD each, unless another process of the node asked since this epoch began: see
  :meth:`~fastdata.storage.cache.NodeCache.version`), so that opening an object finds its version
  already known: a shuffle window that spans several shards opens all of them at once, and one HEAD
  after another would be on its path;
* the next ``depth`` objects are downloaded, one at a time, by one thread of this process (a download's
  parts still go to the store's own thread pool). An object already there costs nothing more; a
  download another process has under way is waited for (the entry's lock), never repeated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from fastdata.core import process
from fastdata.core.errors import CacheError
from fastdata.core.process import ProcessLocal
from fastdata.storage._remote import Remote, Version
from fastdata.storage.cache._node import NodeCache

CHECK_THREADS = 4


def _shutdown(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


_fill_threads: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(1, thread_name_prefix="fastdata-cache-fill"), _shutdown, close_inherited=False
)
_check_threads: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="fastdata-cache-check"),
    _shutdown,
    close_inherited=False,
)


class Filler:
    """Fills ``cache`` ahead of its reader: :meth:`ahead` is told what comes next.

    Args:
        cache (NodeCache): where to. remote (Callable[[], Remote]): the store's side, built in the
            process that downloads.
        depth (int): objects downloaded ahead of the one being read. Defaults to 2.
        held (int): objects the reader holds open at once (pinned: not evictable). Defaults to 1.
        check (int): objects whose version is asked for ahead. Defaults to 8.
    """

    def __init__(
        self, cache: NodeCache, remote: Callable[[], Remote], depth: int = 2, held: int = 1, check: int = 8
    ) -> None:
        self.cache, self.remote, self.depth, self.held, self.check = cache, remote, depth, held, check
        self._fills: dict[str, Future[None]] = {}
        self._versions: dict[str, Future[Version]] = {}  # asked of the store this epoch
        self.since: int | None = None  # when this epoch began (see NodeCache.version)
        self._pid = process.pid()
        self._full = False  # a fill found the cache folder unusable (full, not writable): fill no more this epoch

    def _mine(self) -> None:
        """Forget what a parent process queued: its threads did not come through the fork, so its
        futures would never finish here."""
        if self._pid != process.pid():
            self._fills, self._versions, self._pid = {}, {}, process.pid()

    def ahead(self, urls: list[str]) -> None:
        """``urls`` come next, in order: ask the versions of the first ``check``, download the first ``depth``."""
        self._mine()
        checks = _check_threads.get()
        for url in urls[: self.check]:
            if url not in self._versions:
                self._versions[url] = checks.submit(self.cache.version, url, self.remote(), self.since)
        for url, f in list(self._fills.items()):
            if f.done():
                del self._fills[url]
        if self._full:
            return  # the reader meets the error itself; more downloads would only keep this process busy
        fills = _fill_threads.get()
        for url in urls[: self.depth]:
            if url not in self._fills:
                self._fills[url] = fills.submit(self._fill, url)

    def version(self, url: str) -> Version | None:
        """The version of ``url`` asked ahead (waiting for the answer if it is on its way), or None."""
        self._mine()
        asked = self._versions.get(url)
        if asked is None:
            return None
        try:
            return asked.result()
        except Exception:  # noqa: BLE001 - asked again by the reader, which meets the error under its policy
            self._versions.pop(url, None)
            return None

    def _fill(self, url: str) -> None:
        if self._full:
            return
        try:
            version = self.version(url)
            remote = self.remote()
            if version is None:
                version = self.cache.version(url, remote, self.since)
            limit = self.cache.limit
            if limit is not None and version.size * (self.depth + self.held + 1) > limit:
                return  # filling ahead would evict what is about to be read: leave it to the reader
            reader = self.cache.open(url, remote, version)
        except CacheError:
            self._full = True  # the fills queued after this one return at once
            return
        except Exception:  # noqa: BLE001 - a read-ahead that fails is the reader's to meet, under its policy
            return
        if reader is not None:
            reader.close()

    def forget(self, since: int | None) -> None:
        """Forget the versions asked: a new epoch, begun at ``since`` (``time.time_ns()``), asks again."""
        self._versions.clear()
        self.since = since
        self._full = False

    def cancel(self) -> None:
        """Drop the fills not started; wait for a download under way to finish (it is of use next time), so
        that once the dataset is closed none of its files is still open here."""
        self._mine()
        fills = list(self._fills.values())
        self._fills.clear()
        for f in fills:
            f.cancel()
        for f in fills:
            if not f.cancelled():
                with contextlib.suppress(Exception):  # its error is the next reader's to see, not close()'s
                    f.result()


__all__ = ["Filler"]
