"""A reader of one cached entry (the storage reader the cache hands out): the local copy read through a
read-only memory map, like :class:`~fastdata.storage._local.LocalReader`, named by the remote URL, and
holding its entry's shared lock until it is closed, so that no eviction on the node removes it."""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any

from fastdata.storage._remote import Version

COUNT_EVERY = 16 << 20  # bytes read between two updates of ``cache_local_bytes``


class CachedFile:
    """Random-access reads of the local copy of one remote object.

    Args:
        path (str): the entry's file. url (str): the remote object it is a copy of.
        version (Version): which version of it. pin (int): the file descriptor holding the entry's
            shared lock; this reader owns it and closes it on :meth:`close`.
        counters: where ``cache_local_bytes`` counts the bytes read (anything with ``add(name, n)``), or None.

    Attributes:
        identity (tuple): ``("cache", size, etag)``: a new version of the object is another identity, so an
            index made from this one is not used for it.
        hit (bool): the entry was there already (no byte of it fetched by this open).
    """

    def __init__(self, path: str, url: str, version: Version, pin: int, counters: Any = None, hit: bool = True) -> None:
        self.url, self.path, self.version, self.size = url, path, version, version.size
        self.identity: tuple[Any, ...] = ("cache", version.size, version.etag)
        self.hit = hit
        self._pin: int | None = pin
        self._counters = counters
        self._uncounted = 0
        self._map: mmap.mmap | None = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if os.fstat(fd).st_size != self.size:
                    raise OSError(f"{path}: holds {os.fstat(fd).st_size} bytes, its record says {self.size}")
                self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ) if self.size else None
            finally:
                os.close(fd)
        except BaseException:
            self.close()
            raise

    def _count(self, n: int) -> None:
        # counted in bulk: adding to the shared counters costs ~15 us, a read of a few members less
        self._uncounted += n
        if self._uncounted >= COUNT_EVERY:
            self._flush()

    def _flush(self) -> None:
        n, self._uncounted = self._uncounted, 0
        if self._counters is not None and n:
            self._counters.add("cache_local_bytes", n)

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer at the end of the file)."""
        if self._map is None:
            if self.size == 0 and self._pin is not None:
                return b""
            raise ValueError(f"{self.url}: read after close")
        data = self._map[offset : offset + length]
        self._count(len(data))
        return data

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)`` range, in order."""
        m = self._map
        if m is None:
            return [self.read(o, n) for o, n in ranges]
        out = [m[o : o + n] for o, n in ranges]
        self._count(sum(len(b) for b in out))
        return out

    def buffer(self) -> memoryview | bytes:
        """The whole file as a buffer (no copy), for parsers that scan it (counted as read whole)."""
        self._count(self.size)
        return memoryview(self._map) if self._map is not None else b""

    def close(self) -> None:
        """Unmap the file and release the entry's pin. Idempotent."""
        self._flush()
        m, self._map = self._map, None
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass  # a memoryview from buffer() is still alive; the map goes when it does
        pin, self._pin = self._pin, None
        if pin is not None:
            # closing (never LOCK_UN) releases the pin once every copy of the descriptor is closed: a forked
            # child that closes its inherited copy must not unpin its parent's reader
            os.close(pin)

    def __enter__(self) -> CachedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a CachedFile is not pickled; open it again in the process that reads")

    def __repr__(self) -> str:
        return f"CachedFile({self.url!r})"


__all__ = ["CachedFile"]
