"""Where bytes live. A *reader* gives random access to one file or object:

``reader.size``, ``reader.read(offset, length)``, ``reader.read_ranges([(offset, length), ...])``,
``reader.close()``. Backends are chosen by URL scheme and imported on first use, so that reading local
files never imports boto3. A remote store also has a :class:`~fastdata.storage.Remote` side
(:func:`open_remote`): versions and whole downloads, what the node-local cache (:mod:`fastdata.storage.cache`)
asks of it.
"""

from __future__ import annotations

import glob
import importlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from braceexpand import braceexpand

from fastdata.core import lazy_exports
from fastdata.core.errors import ConfigError, SourceNotFound


class Reader(Protocol):
    url: str
    size: int

    def read(self, offset: int, length: int) -> bytes: ...

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...

    def close(self) -> None: ...


# scheme -> (module, class, the extra to install when the import fails)
_BACKENDS = {
    "": ("fastdata.storage._local", "LocalReader", None),
    "file": ("fastdata.storage._local", "LocalReader", None),
    "s3": ("fastdata.storage.s3._reader", "S3Reader", "s3"),
}


def scheme(url: str) -> str:
    """``"s3"`` for ``s3://b/k``, ``""`` for a local path."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep else ""


def backend(url: str) -> Any:
    """The reader class for ``url``'s scheme, imported on first use."""
    name = scheme(url)
    if name not in _BACKENDS:
        known = ", ".join(f"{s}://" for s in _BACKENDS if s)
        raise ConfigError(f"{url}: unknown scheme {name!r}; fastdata reads {known} and local paths")
    module, cls, extra = _BACKENDS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        hint = f"; install it with pip install 'fastdata[{extra}]'" if extra else ""
        raise ImportError(f"reading {name}:// URLs needs {e.name}{hint}") from e


def open_reader(url: str, **options: Any) -> Reader:
    """Open ``url`` (a local path, ``file://``, or ``s3://bucket/key``) for random access."""
    if url.startswith("file://"):
        url = url[len("file://") :]
    return backend(url)(url, **options)  # type: ignore[no-any-return]


# scheme -> (module, class) of the Remote that the cache downloads through
_REMOTES = {"s3": ("fastdata.storage.s3._download", "S3Remote")}


def is_remote(url: str) -> bool:
    """Whether ``url`` names an object in a remote store (one a cache can hold)."""
    return scheme(url) in _REMOTES


def open_remote(url: str, stats: Any = None, *, parallel: bool = True, **options: Any) -> Any:
    """The :class:`~fastdata.storage.Remote` of ``url``'s store, for the cache: built from the same
    ``options`` as its reader (for ``s3://``: the ``S3Config`` fields and ``part_size``; the reader's other
    options are left out), counting into ``stats`` (a counter sink: a dataset's shared state)."""
    name = scheme(url)
    if name not in _REMOTES:
        raise ConfigError(f"{url}: the cache holds copies of remote objects ({', '.join(_REMOTES)}://), not this")
    backend(url)  # the install hint, when boto3 is missing
    module, cls = _REMOTES[name]
    return getattr(importlib.import_module(module), cls).from_options(stats, parallel=parallel, **options)


def expand_urls(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand brace ranges (``train-{000000..000099}.tar``) and, for local paths, globs.

    Raises:
        SourceNotFound: when a pattern matches nothing.
    """
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    urls: list[str] = []
    for item in items:
        for url in braceexpand(os.fspath(item)):
            if not scheme(url) and glob.has_magic(url):
                matched = sorted(glob.glob(url))
                if not matched:
                    raise SourceNotFound(f"{url}: the pattern matches no file")
                urls.extend(matched)
            else:
                urls.append(url)
    if not urls:
        raise SourceNotFound(f"{spec!r}: no files given")
    return urls


if TYPE_CHECKING:
    from fastdata.storage._local import file_identity
    from fastdata.storage._remote import ObjectChanged, Remote, Version

__getattr__, __dir__ = lazy_exports(__name__)


__all__ = [
    "ObjectChanged",
    "Reader",
    "Remote",
    "Version",
    "backend",
    "expand_urls",
    "file_identity",
    "is_remote",
    "open_reader",
    "open_remote",
    "scheme",
]
