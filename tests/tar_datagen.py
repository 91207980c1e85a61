"""Tar shards made byte by byte for the bad-input, sidecar and fuzz tests: written by Python's
``tarfile`` (ustar, GNU, PAX), then damaged in exactly one field, with the header checksum fixed up
afterwards so that only the damage meant is there. And :func:`within`, the time limit that turns a
parser loop that does not advance into a failure instead of a hung test."""

from __future__ import annotations

import contextlib
import io
import signal
import tarfile
import time
from collections.abc import Iterable, Iterator


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


class Hung(Exception):
    """A block ran past its time limit."""


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Raise :class:`Hung` in the block when it runs longer than ``seconds`` (main thread only). The
    interval timer is pytest-timeout's too: whatever it had left is put back afterwards."""

    def hung(*_: object) -> None:
        raise Hung(f"still running after {seconds} s")

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, hung)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:
            left = old_delay - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), old_interval)
