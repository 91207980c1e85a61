"""What one inspected file holds (:class:`FileReport`), and the whole-file checksum every inspector uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastdata.core import DigestName, digest_of


@dataclass
class FileReport:
    """What one data file holds.

    Attributes:
        url (str): the file.
        format (str): ``"tar"``, ...
        samples (int): readable and bad samples, as a reader counts them.
        bytes (int): file size.
        extensions (dict[str, int]): members per extension.
        bad (list[str]): one line per bad member or damaged region, naming it and why.
        complete (bool): False when the file is truncated or damaged (samples after it are lost).
        notes (list[str]): other findings (a stale sidecar index ...).
        sha256 (str | None): the file's digest, when asked for.
        details (dict[str, Any]): format-specific facts (HDF5 fields and attributes, a video's codec ...).
    """

    url: str
    format: str
    samples: int = 0
    bytes: int = 0
    extensions: dict[str, int] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    complete: bool = True
    notes: list[str] = field(default_factory=list)
    sha256: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _sha256(reader: Any, name: DigestName = "sha256") -> str:
    step = 8 << 20
    return digest_of((reader.read(at, step) for at in range(0, reader.size, step)), name)


def sha256_of(url: str, name: DigestName = "sha256") -> str:
    """The SHA-256 (or the digest ``name``) of a whole file or object, read through its storage reader."""
    from fastdata.storage import open_reader

    reader = open_reader(url)
    try:
        return _sha256(reader, name)
    finally:
        reader.close()


__all__ = ["FileReport", "sha256_of"]
