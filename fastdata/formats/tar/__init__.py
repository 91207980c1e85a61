"""Tar shards (the WebDataset layout): the reader (``_reader``: one pass over the 512-byte headers into a
:class:`ShardIndex`, and reads of its samples), the headers it parses (``_headers``), the index and its
``.idx`` sidecar (``_index``), the checks of a sidecar against its shard (``_checks``, ``_checked_reads``),
compressed shards (``_compressed``: gzip, xz, bzip2, zstd), and the writer (``_writer``, with the headers
it writes in ``_ustar``).
The bytes on disk: ``README.md`` beside this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.formats._source_files import write_atomic
    from fastdata.formats.tar._checks import check_index, check_on_read, check_once
    from fastdata.formats.tar._compressed import UNDO, CompressedShard, Compression, compression_of, refusal
    from fastdata.formats.tar._group import SPLIT_KEYS_FIX
    from fastdata.formats.tar._headers import BLOCK
    from fastdata.formats.tar._index import ShardIndex, SidecarMismatch
    from fastdata.formats.tar._reader import index_url, read_samples, scan, split_key
    from fastdata.formats.tar._writer import RECORD, FileMember, ShardResult, TarShardWriter

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "BLOCK",
    "RECORD",
    "SPLIT_KEYS_FIX",
    "UNDO",
    "CompressedShard",
    "Compression",
    "FileMember",
    "ShardIndex",
    "ShardResult",
    "SidecarMismatch",
    "TarShardWriter",
    "check_index",
    "check_on_read",
    "check_once",
    "compression_of",
    "index_url",
    "read_samples",
    "refusal",
    "scan",
    "split_key",
    "write_atomic",
]
