"""Where a cache keeps what: the folder's layout, the entries' names and records, and the listing that
eviction and ``fastdata inspect CACHE_DIR`` read.

::

    CACHE_DIR/
      .fastdata-cache            what this folder is: {"format": 1} (written when the cache is first used)
      .lock                      the cache-wide lock: held for a moment to account space and evict
      .usage                     bytes held (entries and downloads under way), kept under that lock
      objects/
        <url>-<version>          an entry: one version of one remote object, whole, as the store gave it
        <url>-<version>.json     its record: URL, size, ETag, SHA-256 if known, and a CRC-32 of each
                                 block of BLOCK bytes (checked by each process before it serves the
                                 block's bytes); written last, so an entry without one is not there
        <url>-<version>.lock     its lock: shared by every reader that has it open, exclusive while it
                                 is downloaded or evicted
        <url>-<version>.part     a download under way (or one killed midway: deleted by the next)
        <url>.checked            the object's version as the store last gave it, and when (so that the
                                 processes of the node ask the store once per epoch, not each of them),
        <url>.checked.lock       held by the one process asking

``<url>`` is the first 32 hex digits of the SHA-256 of the object's URL, ``<version>`` 16 of its ETag and
size: a new version of an object is a new entry; the old one is deleted when the new version is found, unless
a reader holds it (then eviction deletes it later).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastdata.core.errors import ConfigError
from fastdata.storage._remote import Version

MARKER = ".fastdata-cache"
FORMAT = 1
OBJECTS = "objects"
SUFFIXES = (".json", ".lock", ".part")
BLOCK = 1 << 20  # bytes per checksum: a read checks the blocks it touches, once per process


@dataclass(frozen=True)
class Record:
    """An entry's record (its ``.json``): what it holds."""

    url: str
    size: int
    etag: str
    sha256: str = ""
    block: int = 0
    sums: list[int] = field(default_factory=list)

    def fits(self, url: str, size: int, etag: str) -> bool:
        """It is the record of this version of ``url``, with a checksum of every block."""
        blocks = -(-size // self.block) if self.block > 0 else -1
        return (self.url, self.size, self.etag) == (url, size, etag) and len(self.sums) == blocks


@dataclass
class Listed:
    """One entry found in the folder, for eviction and inspection.

    Attributes:
        name (str): the entry's file name under ``objects/``.
        record (Record | None): its record; None for a download under way or left by a killed one.
        size (int): bytes on disk (the entry's, or the ``.part`` file's length).
        last_used (int): when a reader last opened it (the file's mtime), in ns since the epoch.
        part (bool): it is a ``.part`` file (no complete entry beside it).
    """

    name: str
    record: Record | None
    size: int
    last_used: int
    part: bool = False


def url_digest(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:32]


def entry_name(url: str, version: Version) -> str:
    """The file name of ``version`` of ``url`` under ``objects/``."""
    tag = hashlib.sha256(f"{version.etag}\n{version.size}".encode()).hexdigest()[:16]
    return f"{url_digest(url)}-{tag}"


class Layout:
    """The paths of one cache folder.

    Args:
        root (str | PathLike): the cache folder (created on :meth:`create`).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.objects = self.root / OBJECTS

    def create(self) -> bool:
        """Make the folder (and its marker) if it is not there; refuse a folder of another format.

        Returns:
            bool: whether this process may write it (False: a read-only cache, filled by another user or
            mounted read-only, which is read but never added to).

        Raises:
            OSError: the folder cannot be made, or is not a cache and cannot be made one.
            ConfigError: it is a cache of another format.
        """
        marker = self.root / MARKER
        self.objects.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            tmp = marker.with_name(f"{MARKER}.{os.getpid()}.{threading.get_ident()}.tmp")  # threads race here
            try:
                tmp.write_text(json.dumps({"format": FORMAT}))
                os.replace(tmp, marker)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        try:
            found = json.loads(marker.read_text()).get("format")
        except ValueError:
            found = None
        if found != FORMAT:
            raise ConfigError(
                f"cache_dir={str(self.root)!r}: holds a cache of format {found!r}, this fastdata writes format "
                f"{FORMAT}; delete the folder or give another one"
            )
        return os.access(self.objects, os.W_OK)

    def path(self, name: str, suffix: str = "") -> str:
        return os.fspath(self.objects / f"{name}{suffix}")

    @property
    def lock_path(self) -> str:
        return os.fspath(self.root / ".lock")

    @property
    def usage_path(self) -> str:
        return os.fspath(self.root / ".usage")

    def read_record(self, name: str) -> Record | None:
        """The entry's record, or None when it has none (not complete) or it cannot be read."""
        try:
            with open(self.path(name, ".json")) as f:
                record = Record(**json.load(f))
            int(record.block), [int(s) for s in record.sums]
            return record
        except (OSError, ValueError, TypeError):
            return None

    def write_record(self, name: str, record: Record) -> None:
        """Write the record last, atomically: an entry is complete once it is there."""
        _write_atomically(self.path(name, ".json"), json.dumps(asdict(record)))

    def remove(self, name: str) -> None:
        """Delete every file of an entry: the record first (so that it is no longer complete), then its
        data, its download and its lock file. The caller holds its lock exclusively."""
        for suffix in (".json", "", ".part", ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(name, suffix))

    def listing(self) -> list[Listed]:
        """Every entry and download in the folder (one ``stat`` each), in no order."""
        names: set[str] = set()
        try:
            with os.scandir(self.objects) as it:
                files = {e.name for e in it}
        except FileNotFoundError:
            return []
        for file in files:
            base = file
            for suffix in SUFFIXES:
                if file.endswith(suffix):
                    base = file[: -len(suffix)]
            if not base.endswith(".tmp") and ".checked" not in file and "-" in base:
                names.add(base)
        out = []
        for name in names:
            sizes, newest = 0, 0
            for suffix in ("", ".part"):
                if f"{name}{suffix}" in files:
                    try:
                        st = os.stat(self.path(name, suffix))
                    except FileNotFoundError:
                        continue
                    sizes, newest = sizes + st.st_size, max(newest, st.st_mtime_ns)
            complete = name in files and f"{name}.json" in files
            record = self.read_record(name) if complete else None
            # an entry without a record (a download under way, killed midway, or killed between its last
            # two steps) is not complete: its bytes count, and an eviction deletes it once nobody holds it
            out.append(Listed(name, record, sizes, newest, part=record is None))
        return out

    def read_usage(self) -> int | None:
        try:
            with open(self.usage_path) as f:
                return int(f.read().strip() or "0")
        except (OSError, ValueError):
            return None

    def write_usage(self, used: int) -> None:
        _write_atomically(self.usage_path, str(max(0, used)))


def _write_atomically(final: str, text: str) -> None:
    """Write ``text`` under a temporary name and rename it into place; on a full disk (or any failure)
    the temporary file is removed, never left behind."""
    tmp = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def is_cache(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a cache folder (it holds the marker)."""
    return (Path(path) / MARKER).is_file()


__all__ = ["BLOCK", "FORMAT", "MARKER", "Layout", "Listed", "Record", "entry_name", "is_cache", "url_digest"]
