"""Compressed tar shards: gzip (``.tar.gz``, ``.tgz``), xz (``.tar.xz``), bzip2 (``.tar.bz2``) and zstd
(``.tar.zst``), or any name: told by the magic bytes at the start of the file (:func:`compression_of`),
as ``tar -xf`` and webdataset tell them.

A compressed stream can be read only from its start, so a compressed shard has no random access. It is
decompressed whole into memory, once per process that reads it, and from then on read like an
uncompressed shard. That suits :class:`~fastdata.TarShardDataset`, which reads its part of each shard
in one pass; :class:`~fastdata.IndexedTarDataset` jumps from shard to shard, so it refuses them
(:func:`refusal` says why and what to do). gzip, xz and bzip2 come with Python (``zlib``, ``lzma``,
``bz2``); zstd needs the ``zstandard`` package (``pip install 'fastdata[zstd]'``), and a zstd shard read
without it is refused naming the package and the other fix (``zstd -d``).

The decompressed shards a process keeps are bounded (:data:`RESIDENT_BYTES`, at least one shard):
the least recently read is dropped and decompressed again if it is read again. A stream that is cut
short or damaged keeps the tar bytes decoded before the damage; :attr:`CompressedShard.damage` says what
happened, and the scanner reports it as the shard's damage. Concatenated streams (``cat a.gz b.gz``,
pigz/pbzip2/pixz output, zstd frames) are read one after another, as the command-line tools read them.
"""

from __future__ import annotations

import bz2
import lzma
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

from fastdata.core import process
from fastdata.core.errors import ConfigError
from fastdata.storage import Reader

Compression = Literal["gzip", "xz", "bz2", "zstd"]
# magic bytes -> compression; bzip2's "BZh" is followed by the block size digit 1-9
MAGIC: dict[bytes, Compression] = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"(\xb5/\xfd": "zstd",
    **{b"BZh" + bytes([c]): "bz2" for c in b"123456789"},
}
SNIFF = 6  # bytes read to tell the compression (the longest magic)
UNDO = {"gzip": "gunzip -k", "xz": "unxz -k", "bz2": "bunzip2 -k", "zstd": "zstd -d"}

RESIDENT_BYTES = 2 << 30  # decompressed shards kept per process, in bytes (the most recent one always)
MAX_BYTES = 64 << 30  # a shard that decompresses to more is refused (a bomb, or a shard to decompress on disk)
_CHUNK = 4 << 20  # compressed bytes fed to zlib, lzma and bz2 at a time (their output is bounded by max_length)
# zstandard's decompressobj has no output bound: fed this little at a time, one call gives at most ~2 GiB
# (zstd's largest ratio is ~32000:1), so a bomb is caught within that of MAX_BYTES
_ZSTD_CHUNK = 64 << 10
_resident: OrderedDict[int, weakref.ref[CompressedShard]] = OrderedDict()
_resident_pid = process.pid()


def compression_of(reader: Reader) -> Compression | None:
    """The compression the file starts with (by its magic bytes, whatever its name), or None for a
    plain tar (or anything else)."""
    if reader.size < 2:
        return None
    head = bytes(reader.read(0, SNIFF))
    return next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)


def is_gzip(reader: Reader) -> bool:
    """Whether the file starts with gzip's magic bytes (whatever its name)."""
    return compression_of(reader) == "gzip"


def refusal(url: str, compression: Compression = "gzip") -> ConfigError:
    """The error for a compressed shard where random access is needed."""
    return ConfigError(
        f"{url}: is {compression}-compressed, so its samples cannot be read in random order; read it with "
        f"fastdata.TarShardDataset (it streams compressed shards), or decompress it once ('{UNDO[compression]}', "
        "or re-create the shards with 'fastdata convert')"
    )


def _zstandard(url: str) -> object:
    try:
        import zstandard
    except ImportError:
        raise ConfigError(
            f"{url}: is zstd-compressed; reading it needs the zstandard package (pip install 'fastdata[zstd]'), "
            "or decompress it once ('zstd -d')"
        ) from None
    return zstandard


class CompressedShard:
    """The uncompressed tar inside a compressed shard, as a reader (``read``, ``read_ranges``, ``buffer``).

    Args:
        source (Reader): the compressed file; this reader owns it from now on and closes it.
        compression ("gzip" | "xz" | "bz2" | "zstd"): how it is compressed. Defaults to "gzip".

    Attributes:
        url (str): the compressed file's URL.
        size (int): bytes of tar decompressed.
        damage (str | None): why the stream ended early (cut short, bad data), or None.
        identity: the compressed file's identity, for noticing it was replaced.
    """

    def __init__(self, source: Reader, compression: Compression = "gzip") -> None:
        self.url = source.url
        self.compression = compression
        self.identity = getattr(source, "identity", None)
        if compression == "zstd":
            try:
                _zstandard(self.url)
            except BaseException:
                source.close()
                raise
        self._source: Reader | None = source
        self._data: bytearray | None = None
        self.damage: str | None = None
        self.size = len(self._tar())

    def _tar(self) -> bytearray:
        data = self._data
        if data is None:
            if self._source is None:
                raise ValueError(f"{self.url}: read after close")
            data, self.damage = _decompress(self._source, self.compression)
            self._data = data
            _keep(self)
        elif id(self) in _resident:
            _resident.move_to_end(id(self))
        else:
            _keep(self)
        return data

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes of tar at ``offset`` (fewer at the end)."""
        return bytes(self._tar()[offset : offset + length])

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)`` range, in order."""
        data = memoryview(self._tar())
        return [bytes(data[o : o + n]) for o, n in ranges]

    def buffer(self) -> memoryview:
        """The whole tar as a buffer (no copy), for the scanner."""
        return memoryview(self._tar())

    def close(self) -> None:
        """Drop the decompressed bytes and close the compressed file. Idempotent."""
        self._data = None
        _resident.pop(id(self), None)
        source, self._source = self._source, None
        if source is not None:
            source.close()

    def __repr__(self) -> str:
        return f"CompressedShard({self.url!r}, {self.compression!r})"


GzipShard = CompressedShard  # the name this class had when it read gzip only


def _keep(shard: CompressedShard) -> None:
    """Count ``shard`` as the most recently read; drop the oldest others beyond the budget."""
    global _resident_pid
    if _resident_pid != process.pid():  # a forked child: the parent's shards are not ours to drop
        _resident.clear()
        _resident_pid = process.pid()
    _resident.pop(id(shard), None)
    _resident[id(shard)] = weakref.ref(shard)
    live = [(key, ref()) for key, ref in _resident.items()]
    total = sum(len(s._data) for _, s in live if s is not None and s._data is not None)
    for key, other in live:  # oldest first
        if total <= RESIDENT_BYTES:
            break
        if other is shard:
            continue
        if other is not None and other._data is not None:
            total -= len(other._data)
            other._data = None
        del _resident[key]


class _Stream:
    """One compressed stream's decoder, the same shape for every compression: ``feed(chunk, room)`` gives
    at most ``room`` bytes of output (``room`` is ignored by zstd, see :data:`_ZSTD_CHUNK`), ``pending``
    says whether it holds input it has not yet turned into output, ``eof`` whether the stream ended,
    ``left`` the input after its end."""

    def __init__(self, compression: Compression, url: str) -> None:
        if compression == "gzip":
            self._d: object = zlib.decompressobj(wbits=31)
        elif compression == "xz":
            self._d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        elif compression == "bz2":
            self._d = bz2.BZ2Decompressor()
        else:
            self._d = _zstandard(url).ZstdDecompressor().decompressobj()  # type: ignore[attr-defined]
        self.compression = compression

    def feed(self, chunk: memoryview, room: int) -> bytes:
        d = self._d
        if self.compression == "gzip":
            return d.decompress(chunk, room)  # type: ignore[attr-defined,no-any-return]
        if self.compression in ("xz", "bz2"):
            return d.decompress(chunk, max_length=room)  # type: ignore[attr-defined,no-any-return]
        return d.decompress(bytes(chunk))  # type: ignore[attr-defined,no-any-return]

    def consumed(self, fed: int) -> int:
        """How many of the ``fed`` bytes of the last call the decoder used (the rest is fed again)."""
        d = self._d
        if self.compression == "gzip":
            return fed - len(d.unconsumed_tail) - len(d.unused_data)  # type: ignore[attr-defined]
        if self.compression in ("xz", "bz2"):
            # lzma and bz2 keep unconsumed input inside (needs_input False) until asked again with b""
            return fed - len(d.unused_data)  # type: ignore[attr-defined]
        return fed - len(d.unused_data)  # type: ignore[attr-defined]

    @property
    def eof(self) -> bool:
        return bool(self._d.eof)  # type: ignore[attr-defined]

    @property
    def needs_input(self) -> bool:
        return getattr(self._d, "needs_input", True)  # type: ignore[no-any-return]


def _decompress(source: Reader, compression: Compression = "gzip") -> tuple[bytearray, str | None]:
    """All the tar bytes in the compressed stream(s) of ``source`` (concatenated streams one after
    another; bytes after the last one ignored, as the command-line tools do), and what went wrong, if
    anything."""
    data = memoryview(source.buffer() if hasattr(source, "buffer") else source.read(0, source.size))
    magics = [m for m, name in MAGIC.items() if name == compression]
    chunk_size = _ZSTD_CHUNK if compression == "zstd" else _CHUNK
    out = bytearray()
    pos, n = 0, len(data)

    def starts_stream(at: int) -> bool:
        return any(bytes(data[at : at + len(m)]) == m for m in magics)

    while pos < n and starts_stream(pos):
        decoder = _Stream(compression, source.url)
        while not decoder.eof:
            room = MAX_BYTES + 1 - len(out)
            if pos >= n:
                if decoder.needs_input:
                    return out, f"the {compression} stream is cut short after {len(out)} bytes of tar"
                chunk = data[pos:pos]  # lzma/bz2 still hold decoded output: ask for it
            else:
                chunk = data[pos : pos + chunk_size]
            try:
                got = decoder.feed(chunk, room)
            except (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError) as e:
                return out, f"the {compression} stream is damaged ({e}) after {len(out)} bytes of tar"
            except Exception as e:
                if type(e).__name__ != "ZstdError":
                    raise
                return out, f"the {compression} stream is damaged ({e}) after {len(out)} bytes of tar"
            out += got
            if len(out) > MAX_BYTES:
                raise ConfigError(
                    f"{source.url}: decompresses to more than {MAX_BYTES >> 30} GiB; decompress it on disk "
                    f"('{UNDO[compression]}') and read the .tar"
                )
            used = decoder.consumed(len(chunk))
            if not used and not got and (pos >= n or decoder.needs_input):
                return out, f"the {compression} stream is damaged after {len(out)} bytes of tar"
            pos += used
        if compression == "xz":
            while pos + 4 <= n and bytes(data[pos : pos + 4]) == b"\0\0\0\0":
                pos += 4  # stream padding, which xz allows between streams
    return out, None


__all__ = [
    "MAGIC",
    "MAX_BYTES",
    "RESIDENT_BYTES",
    "UNDO",
    "CompressedShard",
    "Compression",
    "GzipShard",
    "compression_of",
    "is_gzip",
    "refusal",
]
