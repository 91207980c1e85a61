"""gzip-compressed tar shards: ``.tar.gz``, ``.tgz``, or any name (told by the magic bytes ``1f 8b``).

A gzip stream can be read only from its start, so a compressed shard has no random access. It is
decompressed whole into memory, once per process that reads it, and from then on read like an
uncompressed shard. That suits :class:`~fastdata.TarShardDataset`, which reads its part of each shard
in one pass; :class:`~fastdata.IndexedTarDataset` jumps from shard to shard, so it refuses them
(:func:`refusal` says why and what to do).

The decompressed shards a process keeps are bounded (:data:`RESIDENT_BYTES`, at least one shard):
the least recently read is dropped and decompressed again if it is read again. A stream that is cut
short or damaged keeps the tar bytes decoded before the damage; :attr:`GzipShard.damage` says what
happened, and the scanner reports it as the shard's damage.
"""

from __future__ import annotations

import weakref
import zlib
from collections import OrderedDict
from collections.abc import Sequence

from fastdata.core import _process as process
from fastdata.core.errors import ConfigError
from fastdata.formats.tar._reader import GZIP_MAGIC
from fastdata.storage import Reader

RESIDENT_BYTES = 2 << 30  # decompressed shards kept per process, in bytes (the most recent one always)
MAX_BYTES = 64 << 30  # a shard that decompresses to more is refused (a gzip bomb, or a shard to gunzip)
_CHUNK = 4 << 20  # compressed bytes fed to zlib at a time
_resident: OrderedDict[int, weakref.ref[GzipShard]] = OrderedDict()
_resident_pid = process.pid()


def is_gzip(reader: Reader) -> bool:
    """Whether the file starts with gzip's magic bytes (whatever its name)."""
    return reader.size >= 2 and reader.read(0, 2) == GZIP_MAGIC


def refusal(url: str) -> ConfigError:
    """The error for a gzip shard where random access is needed."""
    return ConfigError(
        f"{url}: is gzip-compressed, so its samples cannot be read in random order; read it with "
        "fastdata.TarShardDataset (it streams compressed shards), or decompress it once "
        f"('gunzip -k', 'zcat {url} > x.tar', or re-create the shards with 'fastdata convert')"
    )


class GzipShard:
    """The uncompressed tar inside a gzip shard, as a reader (``read``, ``read_ranges``, ``buffer``).

    Args:
        source (Reader): the compressed file; this reader owns it from now on and closes it.

    Attributes:
        url (str): the compressed file's URL.
        size (int): bytes of tar decompressed.
        damage (str | None): why the stream ended early (cut short, bad data), or None.
        identity: the compressed file's identity, for noticing it was replaced.
    """

    def __init__(self, source: Reader) -> None:
        self.url = source.url
        self.identity = getattr(source, "identity", None)
        self._source: Reader | None = source
        self._data: bytearray | None = None
        self.damage: str | None = None
        self.size = len(self._tar())

    def _tar(self) -> bytearray:
        data = self._data
        if data is None:
            if self._source is None:
                raise ValueError(f"{self.url}: read after close")
            data, self.damage = _decompress(self._source)
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
        return f"GzipShard({self.url!r})"


def _keep(shard: GzipShard) -> None:
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


def _decompress(source: Reader) -> tuple[bytearray, str | None]:
    """All the tar bytes in the gzip stream(s) of ``source`` (members of a concatenated file one after
    another; bytes after the last one ignored, as gzip does), and what went wrong, if anything."""
    data = memoryview(source.buffer() if hasattr(source, "buffer") else source.read(0, source.size))
    out = bytearray()
    pos, n = 0, len(data)
    while pos < n and data[pos : pos + 2] == GZIP_MAGIC:
        decoder = zlib.decompressobj(wbits=31)
        while not decoder.eof:
            if pos >= n:
                return out, f"the gzip stream is cut short after {len(out)} bytes of tar"
            chunk = data[pos : pos + _CHUNK]
            try:
                got = decoder.decompress(chunk, MAX_BYTES + 1 - len(out))
            except zlib.error as e:
                return out, f"the gzip stream is damaged ({e}) after {len(out)} bytes of tar"
            out += got
            if len(out) > MAX_BYTES:
                raise ConfigError(
                    f"{source.url}: decompresses to more than {MAX_BYTES >> 30} GiB; decompress it on disk "
                    "('gunzip -k') and read the .tar"
                )
            used = len(chunk) - len(decoder.unconsumed_tail) - len(decoder.unused_data)
            if not used and not got:
                return out, f"the gzip stream is damaged after {len(out)} bytes of tar"
            pos += used
    return out, None


__all__ = ["MAX_BYTES", "RESIDENT_BYTES", "GzipShard", "is_gzip", "refusal"]
