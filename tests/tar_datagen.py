"""Tar shards made byte by byte for the bad-input, sidecar and fuzz tests: written by Python's
``tarfile`` (ustar, GNU, PAX), then damaged in exactly one field, with the header checksum fixed up
afterwards so that only the damage meant is there."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable


def tar_bytes(
    members: Iterable[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT, mtime: int = 1_700_000_000
) -> bytes:
    """A tar of regular files ``(name, data)``, in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def samples(n: int, first: int = 0, exts: tuple[str, ...] = ("jpg", "cls")) -> list[tuple[str, bytes]]:
    """Members of ``n`` samples ``sNNNN.EXT``, each member's bytes unique and of its own length."""
    return [
        (f"s{i:04d}.{ext}", f"{ext}-{i}-".encode() * (3 + i % 5 + 40 * (ext == "jpg")))
        for i in range(first, first + n)
        for ext in exts
    ]


def headers(data: bytes) -> dict[str, int]:
    """Where each member's own header starts, by name (as tarfile reads the archive)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return {m.name: m.offset_data - 512 for m in tf}


def fix_checksum(data: bytearray, at: int) -> None:
    """Recompute the checksum of the header at byte ``at`` after a field was changed."""
    block = data[at : at + 512]
    block[148:156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(block)


def patch(data: bytes, at: int, field: int, value: bytes, *, checksum: bool = True) -> bytes:
    """``data`` with ``value`` written at byte ``field`` of the header at byte ``at``; its checksum
    fixed (``checksum``) so that only the field is damaged, or left as it was."""
    out = bytearray(data)
    out[at + field : at + field + len(value)] = value
    if checksum:
        fix_checksum(out, at)
    return bytes(out)


def pax_header(records: bytes, name: str = "././@PaxHeader") -> bytes:
    """A PAX extended header (type ``x``) holding ``records`` exactly as given, padded to blocks."""
    info = tarfile.TarInfo(name)
    info.type, info.size = tarfile.XHDTYPE, len(records)
    return info.tobuf(tarfile.USTAR_FORMAT) + records + bytes(-len(records) % 512)


def member(name: str, data: bytes, size_field: int | None = None) -> bytes:
    """One regular member (header and padded data); ``size_field`` overrides the header's size."""
    info = tarfile.TarInfo(name)
    info.size = len(data) if size_field is None else size_field
    return info.tobuf(tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


END = bytes(1024)  # the end-of-archive marker
