"""One S3 object, whole, into a local file: what the node-local cache (:mod:`fastdata.storage.cache`)
asks of S3 (the :class:`~fastdata.storage.Remote` of ``s3://`` URLs).

:func:`stat` is one HEAD: the object's size, ETag (its version) and, for objects that fastdata's uploader
wrote, the SHA-256 it stored as metadata. :meth:`S3Remote.fetch_into` writes the object into an open
file: ranged GETs of ``part_size`` bytes, each pinned to the ETag (``If-Match``, so that an object replaced
meanwhile fails with :class:`~fastdata.storage.s3.ObjectChanged` instead of mixing two versions),
issued in parallel on the process's thread pool and written at their offsets as they arrive (so at most
the parts in flight are held in memory), each resumed where its body broke off (:func:`get`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import fields
from typing import Any

from fastdata.core.errors import check_positive
from fastdata.storage._remote import Version
from fastdata.storage.s3._client import MiB, S3Config, Stats, parse_url
from fastdata.storage.s3._fetch import call, get
from fastdata.storage.s3._upload import SHA256_KEY


class S3Remote:
    """The S3 side of the cache: versions and whole downloads of ``s3://`` objects.

    Args:
        config (S3Config): how to reach the store.
        stats (Stats): where requests and bytes are counted (the dataset's counters).
        part_size (int): bytes per ranged GET of a download, in bytes. Defaults to 8 MiB.
        parallel (bool): fetch the parts on the process's thread pool; False fetches them one by one in
            the calling thread (a caller that already runs on that pool: a fetch waiting on parts queued
            behind it would never finish). Defaults to True.
    """

    def __init__(self, config: S3Config, stats: Stats, *, part_size: int = 8 * MiB, parallel: bool = True) -> None:
        check_positive("part_size", part_size)
        self.config, self.stats, self.part_size, self.parallel = config, stats, part_size, parallel

    @classmethod
    def from_options(cls, stats: Any = None, *, parallel: bool = True, **options: Any) -> S3Remote:
        """Built from a reader's options: the :class:`S3Config` fields (or ``config=``) and ``part_size``; the
        reader's other options (``readahead``, ``prefetch`` ...) do not apply to whole downloads."""
        known = {f.name for f in fields(S3Config)}
        config = S3Config.from_options(options.get("config"), **{k: v for k, v in options.items() if k in known})
        extra = {"part_size": options["part_size"]} if "part_size" in options else {}
        return cls(config, stats if isinstance(stats, Stats) else Stats(stats), parallel=parallel, **extra)

    def stat(self, url: str) -> Version:
        """The object's current version (one HEAD).

        Raises:
            SourceNotFound: no such key or bucket. SourceUnreadable: access denied.
            S3Unavailable: the store did not answer after every retry.
        """
        bucket, key = parse_url(url)
        head = call(self.config, self.stats, url, lambda s3: s3.head_object(Bucket=bucket, Key=key))
        sha256 = str(head.get("Metadata", {}).get(SHA256_KEY, ""))
        return Version(int(head["ContentLength"]), str(head.get("ETag", "")), sha256)

    def fetch_into(self, url: str, version: Version, fd: int, progress: Callable[[int], None] | None = None) -> None:
        """Write version ``version`` of ``url`` into the open file ``fd`` (at its offsets; the file is
        already ``version.size`` bytes long). ``progress(n)`` is told of each ``n`` bytes written.

        Raises:
            ObjectChanged: the object is no longer that version. S3Unavailable ...: as :func:`get`.
        """
        if version.size == 0:
            return
        parts = [(s, min(version.size, s + self.part_size)) for s in range(0, version.size, self.part_size)]

        def one(start: int, end: int) -> None:
            data = get(
                self.config, self.stats, url, start, end - start, etag=version.etag or None, size=version.size
            ).data
            write_at(fd, data, start)
            if progress is not None:
                progress(len(data))

        if not self.parallel or len(parts) == 1:
            for start, end in parts:
                one(start, end)
            return
        from fastdata.storage.s3._reader import executor

        pool = executor(self.config)
        futures: list[Future[Any]] = [pool.submit(one, s, e) for s, e in parts[1:]]
        try:
            one(*parts[0])
            for f in futures:
                f.result()
        finally:
            for f in futures:
                f.cancel()
            for f in futures:
                if not f.cancelled():
                    try:
                        f.result()  # never leave a part writing into a file the caller is about to close
                    except Exception:  # noqa: BLE001 - the first failure is the one raised above
                        pass


def write_at(fd: int, data: bytes, offset: int) -> None:
    """All of ``data`` into ``fd`` at ``offset``. ``os.pwrite`` may write fewer bytes than asked (a disk that
    fills midway writes what fits and fails only on the next call): what it left out would be a hole of
    zeros in a file of the right size, read later as the object's bytes. So write the rest until done, and a
    write of nothing is the full disk's error."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[n:], offset + n


__all__ = ["S3Remote", "write_at"]
