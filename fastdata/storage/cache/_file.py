"""A reader of one cached entry (the storage reader the cache hands out): the local copy read through a
read-only memory map, like ``LocalReader``, named by the remote URL, and
holding its entry's shared lock until it is closed, so that no eviction on the node removes it.

Its bytes are checked before they are served: each block (``BLOCK`` bytes) against the CRC-32 recorded
when the entry was downloaded, the first time a process reads it (a block checked once is remembered by
the process, for this file, for as long as the process lives: ~2 GB/s, once). A block that does not match
was damaged on this node (the disk, or someone writing into the cache): the entry is fetched again, once
(by one process of the node, the others waiting for it), with a warning that names the local copy, and
the read goes on from the new copy. Still damaged after that: :class:`~fastdata.core.errors.CacheError`."""

from __future__ import annotations

import mmap
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from fastdata.core.errors import CacheError
from fastdata.storage._remote import Version
from fastdata.storage.cache._layout import Record
from fastdata.storage.cache._locks import release

COUNT_EVERY = 16 << 20  # bytes read between two updates of ``cache_local_bytes``
VERIFY = True  # check blocks against their recorded CRC-32 (off only to measure what the check costs)
REMEMBERED = 4096  # files whose checked blocks a process remembers (least recently opened forgotten)

# (device, inode) of an entry's file -> its blocks this process checked (1) or not (0). A new copy of an
# entry is a new inode, checked anew; a forked worker checks for itself (forgets its parent's).
_checked: OrderedDict[tuple[int, int], bytearray] = OrderedDict()
os.register_at_fork(after_in_child=_checked.clear)


def _checked_blocks(st: os.stat_result, blocks: int) -> bytearray:
    key = (st.st_dev, st.st_ino)
    seen = _checked.get(key)
    if seen is None or len(seen) != blocks:
        seen = _checked[key] = bytearray(blocks)
        while len(_checked) > REMEMBERED:
            _checked.popitem(last=False)
    else:
        _checked.move_to_end(key)
    return seen


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
        record (Record | None): the entry's record: the CRC-32 of each block, checked before a block is
            served. None: not checked.
        refetch (Callable[[int], Record] | None): fetches the entry again when a block is damaged, given the
            inode of the damaged copy; returns the new copy's record (see ``NodeCache``).
    """

    def __init__(
        self,
        path: str,
        url: str,
        version: Version,
        pin: int,
        counters: Any = None,
        hit: bool = True,
        record: Record | None = None,
        refetch: Callable[[int], Record] | None = None,
    ) -> None:
        self.url, self.path, self.version, self.size = url, path, version, version.size
        self.identity: tuple[Any, ...] = ("cache", version.size, version.etag)
        self.hit = hit
        self._pin: int | None = pin
        self._pid = os.getpid()  # the pin is released by the process that took it, never by a forked child
        self._counters = counters
        self._uncounted = 0
        self._map: mmap.mmap | None = None
        self._refetch, self._refetched = refetch, False
        self._block, self._left, self._ino = 0, 0, 0  # block size; blocks not checked yet; the copy mapped
        self._sums: list[int] = []
        self._seen = bytearray()
        try:
            self._map_file(record)
        except BaseException:
            self.close()
            raise

    def _map_file(self, record: Record | None) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_size != self.size:
                raise CacheError(
                    f"the cached copy of {self.url} at {self.path} holds {st.st_size} bytes, its record says "
                    f"{self.size}: delete it (or the whole cache folder), or read with cache_dir=False",
                    self.url,
                )
            old, self._map = self._map, (mmap.mmap(fd, 0, prot=mmap.PROT_READ) if self.size else None)
        finally:
            os.close(fd)
        if old is not None:
            try:
                old.close()
            except BufferError:
                pass  # a view of the old copy is still alive; the map goes when it does
        self._ino = st.st_ino
        if VERIFY and record is not None and record.block > 0:
            self._block, self._sums = record.block, record.sums
            self._seen = _checked_blocks(st, len(record.sums))
            self._left = self._seen.count(0)
        else:
            self._left = 0

    def _check(self, start: int, end: int) -> None:
        """Check the blocks holding bytes ``[start, end)`` that this process has not checked yet."""
        block = self._block
        b, last = start // block, (min(end, self.size) - 1) // block
        while b <= last:
            if self._seen[b]:
                b += 1
                continue
            lo = b * block
            assert self._map is not None
            with memoryview(self._map) as view:
                good = zlib.crc32(view[lo : min(lo + block, self.size)]) == self._sums[b]
            if good:
                self._seen[b] = 1
                self._left -= 1
                b += 1
            else:
                self._damaged(b)
                if self._left == 0:
                    return
                block = self._block
                b, last = start // block, (min(end, self.size) - 1) // block

    def _damaged(self, b: int) -> None:
        """Block ``b`` does not match its checksum: fetch the entry again (once) and map the new copy."""
        where = f"the cached copy of {self.url} at {self.path}"
        if self._refetched or self._refetch is None:
            raise CacheError(
                f"{where} is damaged (block {b} does not match the checksum recorded at download)"
                + (" again after it was fetched again: check the disk" if self._refetched else "")
                + "; delete it (or the whole cache folder), or read with cache_dir=False",
                self.url,
            )
        self._refetched = True
        self._map_file(self._refetch(self._ino))

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
        if self._left and length > 0 and offset < self.size:
            self._check(offset, offset + length)
        data = self._map[offset : offset + length]
        self._count(len(data))
        return data

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)`` range, in order."""
        if self._map is None:
            return [self.read(o, n) for o, n in ranges]
        if self._left:
            for o, n in ranges:
                if n > 0 and o < self.size:
                    self._check(o, o + n)
        m = self._map
        out = [m[o : o + n] for o, n in ranges]
        self._count(sum(len(b) for b in out))
        return out

    def buffer(self) -> memoryview | bytes:
        """The whole file as a buffer (no copy), for parsers that scan it (counted as read whole)."""
        if self._left and self.size:
            self._check(0, self.size)  # all of it, before a view escapes (a new copy could not replace it)
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
        if pin is not None and self._pid == os.getpid():
            # closing (never LOCK_UN) releases the pin once every copy of the descriptor is closed; a forked
            # child closed its inherited copy at the fork (its number may name another file by now)
            release(pin)

    def __enter__(self) -> CachedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a CachedFile is not pickled; open it again in the process that reads")

    def __repr__(self) -> str:
        return f"CachedFile({self.url!r})"


__all__ = ["CachedFile"]
