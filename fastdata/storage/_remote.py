"""What a node-local cache (:mod:`fastdata.storage.cache`) needs of a remote store, whatever it is: the
current version of an object, and the object whole, written into a local file. S3's is
:class:`fastdata.storage.s3.S3Remote`; :func:`fastdata.storage.open_remote` picks by scheme."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fastdata.core.errors import FastdataError


class ObjectChanged(FastdataError, OSError):
    """An object was replaced while it was being read (its ETag changed)."""


@dataclass(frozen=True)
class Version:
    """One version of a remote object: its size in bytes, its ETag (or another version tag), and its
    SHA-256 when the store keeps one (hex; "" when it does not)."""

    size: int
    etag: str
    sha256: str = ""


class Remote(Protocol):
    """A store the cache downloads from."""

    def stat(self, url: str) -> Version:
        """The object's current version (one request, no body).

        Raises:
            SourceNotFound: no such object. SourceUnreadable: access denied. SourceUnavailable: no answer.
        """
        ...

    def fetch_into(self, url: str, version: Version, fd: int, progress: Callable[[int], None] | None = None) -> None:
        """Write ``version`` of ``url`` into the open file ``fd``, at its offsets (the file is already
        ``version.size`` bytes long); ``progress(n)`` is told of each ``n`` bytes written.

        Raises:
            ObjectChanged (an OSError): the object is no longer that version. SourceUnavailable: no answer.
        """
        ...


__all__ = ["ObjectChanged", "Remote", "Version"]
