"""One download into the cache: the object written under ``.part``, checked (its size; the store's SHA-256
when the store keeps one), a CRC-32 taken of each block (``BLOCK``
bytes) for the readers to check against later, then renamed into place and its record written last.

Whatever fails on the way (a full disk, a dropped connection, bytes that do not match the store's
SHA-256) leaves no ``.part`` and no temporary record behind: the error is raised to the caller, which
holds the entry's lock and decides what the entry is then.

Why CRC-32 (``zlib``, ~2 GB/s here) for the blocks and not the SHA-256: a block is checked by every process
that reads it, so the check must cost little beside the read; it is there to find a disk's or a user's
damage to a local copy (bit flips, a truncated or overwritten file), not an adversary, and the store's own
bytes are checked with the SHA-256 the store lists, at download."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import zlib
from collections.abc import Callable

from fastdata.core.errors import CacheError, SourceUnreadable
from fastdata.storage._remote import Remote, Version
from fastdata.storage.cache._layout import BLOCK, Layout, Record
from fastdata.storage.cache._locks import open_owned, release


def fetch_entry(
    layout: Layout, name: str, url: str, version: Version, remote: Remote, progress: Callable[[int], None]
) -> Record:
    """Download ``version`` of ``url`` into entry ``name`` (the caller holds its lock) and write its record.

    Raises:
        SourceUnreadable: the bytes the store gave do not have the SHA-256 it lists (the store's copy is bad).
        CacheError: fewer bytes came than the store said. OSError: from the disk (ENOSPC ...).
        And whatever the store raises.
    """
    part = layout.path(name, ".part")
    try:
        fd = open_owned(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            reserve(fd, version.size)
            remote.fetch_into(url, version, fd, progress=progress)
            got = os.fstat(fd).st_size
            if got != version.size:
                raise CacheError(f"{url}: downloaded {got} bytes, the store says {version.size}", url)
            sha256, sums = digests(fd, version.size, whole=bool(version.sha256))
            if version.sha256 and sha256 != version.sha256:
                raise SourceUnreadable(
                    f"{url}: the bytes downloaded do not have the SHA-256 the store lists for the object "
                    f"({version.sha256[:12]}...); upload it again, or check the store",
                    url,
                )
        finally:
            release(fd)
        os.replace(part, layout.path(name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
        raise
    record = Record(url, version.size, version.etag, version.sha256, BLOCK, sums)
    layout.write_record(name, record)
    return record


def reserve(fd: int, size: int) -> None:
    """Give the file ``size`` bytes of disk now, so that a disk too small for the object fails here (ENOSPC)
    and not midway, and no block of the copy is a hole that reads as zeros. Where the file system cannot
    allocate ahead, the file is only made that long (the writes then find a full disk)."""
    if size > 0 and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


def digests(fd: int, size: int, *, whole: bool) -> tuple[str, list[int]]:
    """The SHA-256 of the file's first ``size`` bytes (with ``whole``; else "") and the CRC-32 of each block,
    in one pass."""
    sha = hashlib.sha256() if whole else None
    sums = []
    for at in range(0, size, BLOCK):
        data = os.pread(fd, min(BLOCK, size - at), at)
        if sha is not None:
            sha.update(data)
        sums.append(zlib.crc32(data))
    return (sha.hexdigest() if sha is not None else ""), sums


__all__ = ["digests", "fetch_entry", "reserve"]
