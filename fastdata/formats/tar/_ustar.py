"""POSIX ustar headers, one at a time or for a whole batch of members at once.

:class:`~fastdata.formats.tar.TarShardWriter` writes a converted corpus's members in batches: the
names, sizes and mtimes of a shard's files are known from the plan before a byte is read, so their
512-byte headers are built together, in numpy (one array of ``(N, 512)`` bytes, the checksums summed
along its rows), instead of one ``struct.pack`` and one Python-level checksum per member. A name that
does not fit ustar's 100-byte name field goes the slow way, :func:`member_head` (the 155-byte prefix
field, or a PAX ``path`` record when no cut at a ``/`` fits).

Output is what ``tarfile``, GNU tar and ``webdataset`` read: mode 0644, uid/gid 0, no user or group name.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

BLOCK = 512
MAX_OCTAL = 0o77777777777
"""The largest size an 11-digit octal field holds (8 GiB - 1): bigger members get a PAX ``size`` record."""

_USTAR = struct.Struct("100s8s8s8s12s12s8sc100s6s2s32s32s8s8s155s12s")
_MODE, _ID, _DEV = b"0000644\0", b"0000000\0", b"0000000\0"
_MAGIC, _VERSION = b"ustar\0", b"00"
# the byte sum of the fields every header shares, with the checksum field counted as 8 spaces
_FIXED_SUM = sum(_MODE) + 2 * sum(_ID) + sum(_MAGIC) + sum(_VERSION) + 2 * sum(_DEV) + 8 * ord(" ")
_SHIFTS = np.arange(30, -1, -3, dtype=np.int64)  # 11 octal digits, most significant first


def _template() -> np.ndarray:
    row = np.frombuffer(
        _USTAR.pack(
            b"", _MODE, _ID, _ID, b"", b"", b" " * 8, b"0", b"", _MAGIC, _VERSION, b"", b"", _DEV, _DEV, b"", b""
        ),
        np.uint8,
    )
    return row.copy()


_TEMPLATE = _template()


def pack_header(name: bytes, prefix: bytes, size: int, mtime: int, typeflag: bytes) -> bytes:
    """One 512-byte ustar header (``name`` <= 100 bytes, ``prefix`` <= 155, ``size`` <= :data:`MAX_OCTAL`)."""
    size_f = b"%011o\0" % size
    mtime_f = b"%011o\0" % (mtime & MAX_OCTAL)
    chksum = _FIXED_SUM + sum(name) + sum(prefix) + sum(size_f) + sum(mtime_f) + typeflag[0]
    return _USTAR.pack(
        name,
        _MODE,
        _ID,
        _ID,
        size_f,
        mtime_f,
        b"%06o\0 " % chksum,
        typeflag,
        b"",
        _MAGIC,
        _VERSION,
        b"",
        b"",
        _DEV,
        _DEV,
        prefix,
        b"",
    )


def pax_record(keyword: bytes, value: bytes) -> bytes:
    """One ``"LEN keyword=value\\n"`` record; LEN counts itself, so find the fixed point."""
    body = b" " + keyword + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return str(n).encode() + body


def split_ustar(name: bytes) -> tuple[bytes, bytes] | None:
    """``(prefix, name)`` fitting ustar's 155 + 100 bytes, cut at a ``/``, or None."""
    if len(name) <= 100:
        return b"", name
    cut = name.rfind(b"/", 0, 156)  # the longest prefix that fits leaves the shortest name
    if cut > 0 and len(name) - cut - 1 <= 100:
        return name[:cut], name[cut + 1 :]
    return None


def member_head(name: bytes, size: int, mtime: int) -> bytes:
    """Everything before a regular member's data: its header, preceded by a PAX header and records when
    the name or the size does not fit ustar (a multiple of 512 bytes)."""
    if len(name) <= 100 and size <= MAX_OCTAL:
        return pack_header(name, b"", size, mtime, b"0")
    split = split_ustar(name)
    pax = b""
    if split is None:
        pax += pax_record(b"path", name)
        split = b"", name[:100]
    if size > MAX_OCTAL:
        pax += pax_record(b"size", str(size).encode())
    head = b""
    if pax:
        head = pack_header(b"././@PaxHeader", b"", len(pax), mtime, b"x") + pax + bytes(-len(pax) % BLOCK)
    prefix, short = split
    return head + pack_header(short, prefix, 0 if size > MAX_OCTAL else size, mtime, b"0")


def _octal(values: np.ndarray) -> np.ndarray:
    """``(N, 12)`` uint8: 11 octal digits and a NUL, as ``b"%011o\\0"`` writes them."""
    out = np.zeros((len(values), 12), np.uint8)
    out[:, :11] = ((values[:, None] >> _SHIFTS) & 7) + ord("0")
    return out


def ustar_headers(names: Sequence[bytes], sizes: Sequence[int], mtimes: Sequence[int]) -> np.ndarray:
    """Headers of regular members, one ``(N, 512)`` uint8 row each, equal byte for byte to
    :func:`pack_header`'s. Every name must fit in 100 bytes and every size in :data:`MAX_OCTAL`."""
    n = len(names)
    rows = np.tile(_TEMPLATE, (n, 1))
    if not n:
        return rows
    rows[:, :100] = np.array(names, dtype="S100").view(np.uint8).reshape(n, 100)
    rows[:, 124:136] = _octal(np.asarray(sizes, dtype=np.int64))
    rows[:, 136:148] = _octal(np.asarray(mtimes, dtype=np.int64) & MAX_OCTAL)
    chksum = rows.sum(axis=1, dtype=np.int64)  # the checksum field still holds 8 spaces, as counted
    digits = ((chksum[:, None] >> np.arange(15, -1, -3, dtype=np.int64)) & 7) + ord("0")
    rows[:, 148:154] = digits
    rows[:, 154] = 0
    rows[:, 155] = ord(" ")
    return rows


def heads(names: Sequence[bytes], sizes: Sequence[int], mtimes: Sequence[int]) -> tuple[bytes, list[int]]:
    """What goes before each member's data, for a batch: ``(blob, offsets)``, member ``i``'s head being
    ``blob[offsets[i]:offsets[i + 1]]`` (512 bytes, or more with PAX records)."""
    n = len(names)
    fits = [i for i in range(n) if len(names[i]) <= 100 and sizes[i] <= MAX_OCTAL]
    if len(fits) == n:
        return ustar_headers(names, sizes, mtimes).tobytes(), list(range(0, BLOCK * (n + 1), BLOCK))
    fast = ustar_headers([names[i] for i in fits], [sizes[i] for i in fits], [mtimes[i] for i in fits])
    parts: list[bytes] = [b""] * n
    for row, i in enumerate(fits):
        parts[i] = fast[row].tobytes()
    for i in set(range(n)) - set(fits):
        parts[i] = member_head(names[i], sizes[i], mtimes[i])
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + len(p))
    return b"".join(parts), offsets


__all__ = ["BLOCK", "MAX_OCTAL", "heads", "member_head", "pack_header", "pax_record", "split_ustar", "ustar_headers"]
