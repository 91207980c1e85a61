"""What a local file is, by its first bytes (its magic numbers), whatever its name.

``fastdata inspect`` used to choose an inspector by suffix, so a netCDF-4 file (``.nc``) or an AnnData
file (``.h5ad``), both HDF5 inside, an ``.m4a`` (an MP4 container) and a ``.tar.xz`` were refused as
"cannot inspect this kind of file", while the datasets read what the bytes are (h5py opens any HDF5
file, the tar reader tells gzip by its magic). :func:`sniff` reads at most a few KiB of the file:

- HDF5: the signature ``\\x89HDF\\r\\n\\x1a\\n`` at byte 0, 512, 1024, 2048 ... (after a user block);
- tar: ``ustar`` at byte 257 (POSIX and GNU), or a first header whose checksum holds (old V7 tars);
  compressed (gzip, xz, bzip2, zstd) when the first 512 decompressed bytes are a tar header (or, where
  the decompressor is not installed, the name says ``.tar``);
- video: the containers FFmpeg reads most (ISO BMFF ``ftyp``: MP4, MOV, M4A, 3GP; Matroska and WebM;
  AVI; MPEG-TS; MPEG-PS; FLV; Ogg; ASF).

Anything else is None: the caller falls back to the name.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from typing import Literal

Kind = Literal["tar", "hdf5", "video"]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_HEAD = 4096  # bytes read: a tar header, HDF5 signatures up to a 2 KiB user block, two MPEG-TS packets
_COMPRESSED = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"BZh": "bzip2",
    b"\x28\xb5\x2f\xfd": "zstd",
}


def _is_tar_header(block: bytes) -> bool:
    """Whether 512 bytes are a tar header: the ustar magic, or (V7) a checksum that holds."""
    if len(block) < 512:
        return False
    if block[257:262] == b"ustar":
        return True
    field = block[148:156].replace(b"\0", b" ").strip()
    if not field or not all(48 <= c <= 55 for c in field):
        return False
    total = sum(block[:148]) + 8 * 32 + sum(block[156:512])
    return bool(block[:100].strip(b"\0")) and int(field, 8) == total


def _decompressed_head(kind: str, data: bytes) -> bytes | None:
    """The first bytes ``data`` decompresses to (as much as they give), or None when this process has no
    decompressor for ``kind``."""
    try:
        if kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, 512)
        if kind == "xz":
            return lzma.LZMADecompressor().decompress(data, 512)
        if kind == "bzip2":
            return bz2.BZ2Decompressor().decompress(data, 512)
        try:
            import zstandard  # type: ignore[import-not-found]
        except ImportError:
            return None
        return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(data)[:512])
    except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error):
        return b""
    except Exception:  # noqa: BLE001 - zstandard's own error type: not a compressed tar
        return b""


def _is_video(head: bytes) -> bool:
    if head[4:8] == b"ftyp" or head[4:8] in (b"moov", b"mdat", b"wide", b"free"):
        return True  # ISO BMFF / QuickTime: MP4, MOV, M4A, 3GP
    if head[:4] == b"\x1aE\xdf\xa3":  # EBML: Matroska, WebM
        return True
    if head[:4] == b"RIFF" and head[8:12] in (b"AVI ", b"AVIX"):
        return True
    if head[:4] in (b"FLV\x01", b"OggS") or head[:4] == b"\x00\x00\x01\xba":  # FLV, Ogg, MPEG-PS
        return True
    if head[:16] == bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c"):  # ASF (WMV)
        return True
    # MPEG-TS: a sync byte every 188 bytes (192 for M2TS, whose packets carry 4 bytes of timecode first)
    for size, lead in ((188, 0), (192, 4)):
        if len(head) >= 3 * size and all(head[lead + k * size] == 0x47 for k in range(3)):
            return True
    return False


def sniff(path: str) -> Kind | None:
    """``"tar"``, ``"hdf5"`` or ``"video"`` for a local file of that kind by its first bytes, else None
    (unreadable files too: the inspector chosen by name reports why)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
    except OSError:
        return None
    if any(head[at : at + 8] == HDF5_SIGNATURE for at in (0, 512, 1024, 2048)):
        return "hdf5"
    if _is_tar_header(head[:512]):
        return "tar"
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            inner = _decompressed_head(kind, head)
            if inner is None:  # no decompressor here: trust a name that says tar
                return "tar" if ".tar" in path.lower() or path.lower().endswith((".tgz", ".tzst")) else None
            return "tar" if _is_tar_header(inner) else None
    if _is_video(head):
        return "video"
    return None


__all__ = ["HDF5_SIGNATURE", "Kind", "sniff"]
