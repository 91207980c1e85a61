"""Read-ahead that fills the cache: the objects a reader will open next, downloaded in the background,
one at a time, in the order given, by one thread per process (its downloads' parts still go to the
store's own thread pool). An object already there costs its HEAD; a download another process has under
way is waited for (the entry's lock), never repeated."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from fastdata.core._handles import ProcessLocal
from fastdata.storage._remote import Remote
from fastdata.storage.cache._node import NodeCache


def _shutdown(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


_threads: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(1, thread_name_prefix="fastdata-cache-fill"), _shutdown, close_inherited=False
)


class Filler:
    """Downloads into ``cache`` ahead of its reader: :meth:`ahead` queues what comes next.

    Args:
        cache (NodeCache): where to. remote (Callable[[], Remote]): the store's side, built in the
            process that downloads.
        depth (int): objects downloaded ahead of the one being read. Defaults to 2.
        held (int): objects the reader holds open at once (pinned: not evictable). Defaults to 1.
    """

    def __init__(self, cache: NodeCache, remote: Callable[[], Remote], depth: int = 2, held: int = 1) -> None:
        self.cache, self.remote, self.depth, self.held = cache, remote, depth, held
        self._queued: dict[str, Future[None]] = {}

    def ahead(self, urls: list[str]) -> None:
        """Fill the cache with ``urls`` (the next ones to be read, in order), ``depth`` of them at most."""
        want = urls[: self.depth]
        for url, f in list(self._queued.items()):
            if f.done():
                del self._queued[url]
        pool = _threads.get()
        for url in want:
            if url not in self._queued:
                self._queued[url] = pool.submit(self._fill, url)

    def _fill(self, url: str) -> None:
        try:
            remote = self.remote()
            version = remote.stat(url)
            limit = self.cache.limit
            if limit is not None and version.size * (self.depth + self.held + 1) > limit:
                return  # filling ahead would evict what is about to be read: leave it to the reader
            reader = self.cache.open(url, remote, version)
        except Exception:  # noqa: BLE001 - a read-ahead that fails is the reader's to meet, under its policy
            return
        if reader is not None:
            reader.close()

    def cancel(self) -> None:
        """Drop what is queued and not started (a download under way finishes: it is of use next time)."""
        for f in self._queued.values():
            f.cancel()
        self._queued.clear()


__all__ = ["Filler"]
