"""The node-local cache: remote objects fetched once per node into a local folder, shared by every worker
process and every rank on the node, with no coordinator process (see :mod:`fastdata.storage.cache`).

Opening an object (:meth:`NodeCache.open`):

1. its current version (size, ETag) is asked of the store (one HEAD, no body), unless the caller knows it;
2. the entry of that version is locked *shared*; if its record is there, the entry is complete: its mtime
   is set to now (least recently used goes first) and a reader of it is returned, holding the shared lock
   until it is closed (a *pin*: no eviction removes an entry a reader on the node has open);
3. else the lock is taken *exclusive*: one process downloads, every other one waits in the kernel for
   the lock and finds the record when it gets it. The downloader writes under ``.part`` (the space
   reserved first, see below), checks the size and, when the store keeps one, the SHA-256 (every GET is
   pinned to the ETag, so the bytes are that version's), renames it into place and writes the record
   last. A download killed midway leaves a ``.part`` and no record: never read, deleted by the next
   downloader (the kernel released the dead process's lock).

Space (``limit``): before a download, under the cache-wide lock, the bytes it needs are added to the
usage record; when that would pass the limit, the least recently used complete entries that no reader
holds (an exclusive lock taken without waiting) are deleted, with the leftovers of killed downloads,
until the usage is under the limit by a margin (so that small objects do not rescan the folder at every
download). When every entry is held the download goes ahead over the limit (warned once per process);
an object larger than the limit is not cached at all (the caller reads it from the store).

Checked, never trusted: an entry's record carries a CRC-32 of each block, and a reader checks each block
before serving it (see :class:`~fastdata.storage.cache.CachedFile`); a damaged copy is fetched again once,
under an exclusive lock of its data file (one process fetches, the others wait and read the new copy),
with a warning that blames the local copy. A record that cannot be read or does not fit its version (a
damaged record, or one written by an older fastdata without checksums) makes the entry incomplete: it is
fetched again.

A folder this process may not write (read-only mount, a cache filled by another user) is read: the
entries there are served (checked as above); what is not there is read from the store, with one
warning, never added.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import warnings
from typing import Any

from fastdata.core.errors import CacheError, ConfigError
from fastdata.storage._remote import ObjectChanged, Remote, Version
from fastdata.storage.cache._checked import current_version
from fastdata.storage.cache._fetch import fetch_entry
from fastdata.storage.cache._file import CachedFile
from fastdata.storage.cache._layout import Layout, Listed, Record, entry_name
from fastdata.storage.cache._locks import NOT_WRITABLE, lock, release, relock

COUNTERS = (
    "cache_hits",
    "cache_misses",
    "cache_evictions",
    "cache_remote_bytes",
    "cache_local_bytes",
    "cache_refetches",
)
"""What a cache counts: opens served by an entry already there (``cache_hits``, also after waiting for
another process's download), opens that downloaded (``cache_misses``), entries deleted to make room
(``cache_evictions``), bytes downloaded from the store into the cache (``cache_remote_bytes``), bytes
read out of it by readers (``cache_local_bytes``), and entries fetched again because their local copy was
found damaged (``cache_refetches``, each also warned)."""

MARGIN = 16  # an eviction frees down to limit - limit/MARGIN, so that the next downloads need no rescan
ENV_DIR = "FASTDATA_CACHE_DIR"


class CacheWarning(UserWarning):
    """The cache could not keep to its limit, or could not cache an object."""


class _Counters:
    """Adds to a dataset's shared counters from any thread (a shared-state slot has one writer per process)."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self._names = frozenset(getattr(sink, "counters", ())) if sink is not None else frozenset()
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        if n and name in self._names:
            with self._lock:
                self.sink.add(name, n)

    def __getstate__(self) -> dict[str, Any]:
        return {"sink": self.sink}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sink"])  # type: ignore[misc]


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, CacheWarning, stacklevel=4)


class NodeCache:
    """A folder holding whole copies of remote objects, shared by every process on the node.

    Args:
        root (str | PathLike): the folder (created on first use). On a disk local to the node: the
            locks are ``flock(2)`` locks, which network file systems may not keep between machines.
        limit (int | None): the most bytes it holds, in bytes; the least recently used entries no
            reader holds are deleted to keep under it. None: no limit. Defaults to None.
        counters: where :data:`COUNTERS` are counted (a dataset's shared state), or None.
    """

    def __init__(self, root: str | os.PathLike[str], limit: int | None = None, counters: Any = None) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise ConfigError(f"cache_limit={limit!r}: give a number of bytes above 0 (or None for no limit)")
        self.layout = Layout(root)
        self.root = os.fspath(root)
        self.limit = limit
        self.counters = _Counters(counters)
        self._created = False
        self.writable = True  # False: a read-only cache, read but never added to (known once it is ready)
        self.problem = ""  # why the folder cannot be used, once that is known (the system's words)

    def __repr__(self) -> str:
        return f"NodeCache({self.root!r}, limit={self.limit})"

    def count_into(self, counters: Any) -> None:
        """Count :data:`COUNTERS` into ``counters`` (a dataset's shared state) from now on."""
        self.counters = _Counters(counters)

    def ways_out(self) -> str:
        """What a user can do about this folder: another one, or no cache (and the variable, if it named it)."""
        out = "give cache_dir= a folder this user may write, or cache_dir=False to read from the store"
        env = os.environ.get(ENV_DIR)
        if env and os.path.abspath(self.root).startswith(os.path.abspath(env)):
            out += f" (this folder comes from {ENV_DIR}={env!r}: point it elsewhere, or unset it)"
        return out

    def prepare(self) -> bool:
        """Make the folder ready now (it is made on first use otherwise); whether this process may write it.

        Raises:
            CacheError: it cannot be made, or it is not a cache and cannot be made one (the message names it
                and the ways out). ConfigError: it is a cache of another format.
        """
        self._ready()
        return self.writable

    def _ready(self) -> None:
        if not self._created:
            try:
                self.writable = self.layout.create()
            except OSError as e:
                self.problem = f"{e.strerror or e}: {e.filename}" if e.filename else str(e.strerror or e)
                raise CacheError(
                    f"cache_dir={self.root!r} cannot be used as a cache ({self.problem}); {self.ways_out()}",
                    self.root,
                ) from None
            self._created = True
            if not self.writable:
                self.problem = "read-only"

    def _not_cached(self, url: str, why: str) -> None:
        _warn_once(
            f"ro:{self.root}",
            f"cache_dir={self.root!r} {why}: objects not in it (such as {url}) are read from the store, not "
            f"cached; {self.ways_out()}",
        )

    # -- opening -----------------------------------------------------------------------------------------
    def open(
        self, url: str, remote: Remote, version: Version | None = None, *, since: int | None = None
    ) -> CachedFile | None:
        """A reader of the local copy of ``url`` (downloaded first if the node has none of its current
        version), pinned until it is closed; None when the object is larger than the limit (read it from
        the store).

        Args:
            version (Version | None): the version to read, when the caller knows it (a listing).
            since (int | None): when the caller knows none: a version asked of the store by any process of
                the node at or after this time (``time.time_ns()``; the start of the caller's epoch) is
                used as it is; else the store is asked (one HEAD, see :meth:`version`). None: always ask.

        Raises:
            SourceNotFound, SourceUnreadable, SourceUnavailable: from the store. ObjectChanged: the object
            was replaced during the download. CacheError: the download could not be written.
        """
        self._ready()
        try:
            return self._open(url, remote, version or self.version(url, remote, since))
        except ObjectChanged:
            # replaced between the version asked and the download: ask again, read the new one
            return self._open(url, remote, self.version(url, remote, None))

    def version(self, url: str, remote: Remote, since: int | None = None) -> Version:
        """The current version of ``url``: asked of the store by a process of this node at or after
        ``since``, else now (see ``current_version``)."""
        self._ready()
        return current_version(self.layout, url, remote, since, lambda old: self._drop(url, old))

    def _drop(self, url: str, old: Version) -> None:
        """The store holds a newer version of ``url``: delete the copy of ``old`` unless a reader holds it
        (then the least recently used rule deletes it later)."""
        self._evict(entry_name(url, old), count=False)

    def _open(self, url: str, remote: Remote, version: Version) -> CachedFile | None:
        if self.limit is not None and version.size > self.limit:
            _warn_once(
                f"big:{self.root}",
                f"{url}: {version.size} bytes, more than cache_limit={self.limit}: read from the store, not cached "
                "(raise cache_limit to cache it)",
            )
            return None
        name = entry_name(url, version)
        lock_path = self.layout.path(name, ".lock")
        while True:
            try:
                pin = lock(lock_path, shared=True)
            except OSError as e:
                if e.errno not in NOT_WRITABLE:
                    raise
                self._not_cached(url, "is read-only here")  # no lock file: the entry is not there
                return None
            assert pin is not None
            record = self._complete(name, url, version)
            if record is not None:
                return self._reader(name, url, version, pin, record, remote, hit=True)
            if not self.writable:
                release(pin)
                self._not_cached(url, "is read-only here")
                return None
            if not relock(lock_path, pin, shared=False):  # exclusive: the one downloader
                release(pin)
                continue
            record = self._complete(name, url, version)  # another process finished it while this one waited
            hit = record is not None
            try:
                if record is None:
                    record = self._download(name, url, version, remote)
            except BaseException:
                release(pin)
                raise
            if relock(lock_path, pin, shared=True) and self._complete(name, url, version) is not None:
                return self._reader(name, url, version, pin, record, remote, hit=hit)
            release(pin)  # evicted between the two locks: start over

    def _reader(
        self, name: str, url: str, version: Version, pin: int, record: Record, remote: Remote, *, hit: bool
    ) -> CachedFile:
        path = self.layout.path(name)
        try:
            with contextlib.suppress(OSError):  # a read-only cache keeps its times
                os.utime(path)  # least recently used goes first
            reader = CachedFile(
                path,
                url,
                version,
                pin,
                self.counters,
                hit=hit,
                record=record,
                refetch=lambda ino: self._refetch(name, url, version, remote, ino),
            )
        except BaseException:
            release(pin)
            raise
        self.counters.add("cache_hits" if hit else "cache_misses")
        return reader

    def _complete(self, name: str, url: str, version: Version) -> Record | None:
        """The entry's record when it has one that fits ``version`` and all of its bytes (the caller holds
        its lock); else None. A record that is there but damaged is warned about (the entry is fetched again)."""
        try:
            os.stat(self.layout.path(name, ".json"))
        except FileNotFoundError:
            return None
        record = self.layout.read_record(name)
        if record is None or not record.fits(url, version.size, version.etag):
            if record is None or record.block > 0:  # (an older fastdata's record has no checksums: no warning)
                _warn_once(
                    f"record:{name}",
                    f"the cached copy of {url} at {self.layout.path(name)} has a damaged record; fetching it again",
                )
            return None
        try:
            return record if os.stat(self.layout.path(name)).st_size == version.size else None
        except FileNotFoundError:
            return None

    def _refetch(self, name: str, url: str, version: Version, remote: Remote, damaged: int) -> Record:
        """The copy of ``url`` (inode ``damaged``) did not match its checksums: fetch it again, once for
        the node (the data file's exclusive lock: whoever gets it second finds the new copy), and return
        the new copy's record. The caller holds the entry's pin, so nothing evicts it meanwhile."""
        data = self.layout.path(name)
        where = f"the cached copy of {url} at {data}"
        if not self.writable:
            raise CacheError(
                f"{where} is damaged and cache_dir={self.root!r} is read-only here; delete that file with "
                "write access (or fill the cache again), or read with cache_dir=False",
                url,
            )
        held = lock(data, shared=False)
        assert held is not None
        try:
            record = self._complete(name, url, version)
            if os.fstat(held).st_ino != damaged and record is not None:
                return record  # another process of the node fetched it again while this one waited
            try:
                record = fetch_entry(
                    self.layout, name, url, version, remote, lambda n: self.counters.add("cache_remote_bytes", n)
                )
            except BaseException as e:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.layout.path(name, ".json"))  # incomplete: the next opener fetches it
                if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                    raise self._full(url, version) from e
                raise
            self.counters.add("cache_refetches")
            warnings.warn(f"fastdata: {where} was damaged; fetched again", CacheWarning, stacklevel=5)
            return record
        finally:
            release(held)

    def _full(self, url: str, version: Version) -> CacheError:
        return CacheError(
            f"{url}: no space left in cache_dir={self.root!r} for its {version.size} bytes; free space there, "
            f"set cache_limit= below the free space, or {self.ways_out()}",
            url,
        )

    # -- downloading -------------------------------------------------------------------------------------
    def _download(self, name: str, url: str, version: Version, remote: Remote) -> Record:
        """Fetch ``version`` of ``url`` into the entry ``name`` (the caller holds its lock exclusively).
        On any failure nothing of the entry is left (no ``.part``, no data, no record) and its space is
        given back; a full disk is a :class:`CacheError` naming the folder."""
        stale = _size_of(self.layout.path(name, ".part")) + _size_of(self.layout.path(name))  # a killed download's
        self._reserve(version.size, stale, keep=name)
        try:
            return fetch_entry(
                self.layout, name, url, version, remote, lambda n: self.counters.add("cache_remote_bytes", n)
            )
        except BaseException as e:
            for suffix in (".json", "", ".part"):
                with contextlib.suppress(OSError):
                    os.unlink(self.layout.path(name, suffix))
            self._unreserve(version.size)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                raise self._full(url, version) from e
            raise

    # -- space -------------------------------------------------------------------------------------------
    def _reserve(self, need: int, stale: int, keep: str) -> None:
        """Count ``need`` bytes as held (less ``stale``, a killed download of the same entry about to be
        overwritten), first evicting what no reader holds if that would pass the limit."""
        if self.limit is None:
            return
        with _Held(self.layout.lock_path):
            used = self.layout.read_usage()
            if used is None:
                used = sum(e.size for e in self.layout.listing())
            used -= stale
            if used + need > self.limit:
                used = self._evict_for(need, keep)
            self.layout.write_usage(used + need)

    def _unreserve(self, n: int) -> None:
        """Give back ``n`` reserved bytes. Never raises: it runs on the way out of a failed download, whose
        error is the one to report; a usage that cannot be written is deleted (recounted by the next)."""
        if self.limit is None:
            return
        try:
            with _Held(self.layout.lock_path):
                used = self.layout.read_usage()
                if used is not None:
                    try:
                        self.layout.write_usage(used - n)
                    except OSError:
                        os.unlink(self.layout.usage_path)
        except OSError:
            pass

    def _evict_for(self, need: int, keep: str) -> int:
        """Delete least recently used entries no reader holds until ``need`` more bytes fit under the limit
        with a margin; returns the bytes still held (counted from the folder). Under the cache-wide lock."""
        assert self.limit is not None
        listed = self.layout.listing()
        used = sum(e.size for e in listed if e.name != keep)
        target = self.limit - self.limit // MARGIN
        # leftovers of killed downloads first, then complete entries, least recently used first
        for entry in sorted(listed, key=lambda e: (not e.part, e.last_used)):
            if used + need <= target:
                break
            if entry.name == keep:
                continue
            if self._evict(entry.name, count=not entry.part):
                used -= entry.size
        if used + need > self.limit:
            _warn_once(
                f"full:{self.root}",
                f"cache_dir={self.root!r}: {used + need} bytes held, over cache_limit={self.limit}: the entries "
                "open by readers on this node are not evicted (raise cache_limit, or read fewer shards at once)",
            )
        return used

    def _evict(self, name: str, *, count: bool) -> bool:
        """Delete entry ``name`` if nobody holds it (its lock taken without waiting); whether it was."""
        held = lock(self.layout.path(name, ".lock"), shared=False, blocking=False)
        if held is None:
            return False
        try:
            self.layout.remove(name)
        finally:
            release(held)
        if count:
            self.counters.add("cache_evictions")
        return True

    # -- looking -----------------------------------------------------------------------------------------
    def entries(self) -> list[Listed]:
        """What the folder holds now (complete entries and downloads), least recently used first."""
        return sorted(self.layout.listing(), key=lambda e: e.last_used)


class _Held:
    """The cache-wide lock, held for a ``with`` block."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None

    def __enter__(self) -> _Held:
        self.fd = lock(self.path, shared=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            release(self.fd)


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


__all__ = ["COUNTERS", "CacheWarning", "NodeCache"]
