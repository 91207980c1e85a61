"""The digests fastdata writes beside the files it makes, and verifies them with.

``"xxh3_128"`` (the ``xxhash`` package) where only fastdata reads the digest back (a local conversion's
manifest, a node's cache): 12.5 GB/s per core here against SHA-256's 1.3, which was a third of a
conversion's time. ``"sha256"`` where a store or a user checks it (an object's ``x-amz-meta-sha256``,
``sha256sum``), and in every manifest written before. A manifest entry names its digest by its key
(``{"name": ..., "xxh3_128": "..."}``), so an older manifest's ``"sha256"`` still verifies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from fastdata.core.errors import check_choice

DigestName = Literal["xxh3_128", "sha256"]
DIGESTS: tuple[DigestName, ...] = ("xxh3_128", "sha256")
FAST: DigestName = "xxh3_128"


def new_digest(name: DigestName) -> Any:
    """A running digest (``update``, ``copy``, ``hexdigest``) of the kind ``name``."""
    check_choice("digest", name, DigestName)
    if name == "sha256":
        return hashlib.sha256()
    import xxhash  # a dependency of fastdata; imported on use, like the writers that need it

    return xxhash.xxh3_128()


def entry_digest(entry: Mapping[str, Any]) -> tuple[DigestName, str] | None:
    """``(name, hex digest)`` that a manifest entry or a conversion record carries, or None."""
    return next(((name, str(entry[name])) for name in DIGESTS if entry.get(name)), None)


def digest_of(blocks: Iterable[bytes | memoryview], name: DigestName) -> str:
    """The hex digest ``name`` of the bytes in ``blocks``, in order."""
    h = new_digest(name)
    for block in blocks:
        h.update(block)
    return str(h.hexdigest())


__all__ = ["DIGESTS", "FAST", "DigestName", "digest_of", "entry_digest", "new_digest"]
