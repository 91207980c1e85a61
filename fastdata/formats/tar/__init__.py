"""Tar shards (the WebDataset layout): the reader (``_reader``: one pass over the 512-byte headers into a
:class:`ShardIndex`, and reads of its samples), the headers it parses (``_headers``), the index and its
``.idx`` sidecar (``_index``), the checks of a sidecar against its shard (``_checks``, ``_checked_reads``),
compressed shards (``_compressed``: gzip, xz, bzip2, zstd), and the writer (``_writer``, with the headers
it writes in ``_writer_headers``).
The bytes on disk: ``README.md`` beside this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.formats.tar._index import ShardIndex, SidecarMismatch
    from fastdata.formats.tar._reader import index_url, read_samples, scan, split_key
    from fastdata.formats.tar._writer import FileMember, ShardResult, TarShardWriter, write_atomic

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ShardIndex": "._index",
        "SidecarMismatch": "._index",
        "index_url": "._reader",
        "read_samples": "._reader",
        "scan": "._reader",
        "split_key": "._reader",
        "FileMember": "._writer",
        "ShardResult": "._writer",
        "TarShardWriter": "._writer",
        "write_atomic": "._writer",
    },
)

__all__ = [
    "FileMember",
    "ShardIndex",
    "ShardResult",
    "SidecarMismatch",
    "TarShardWriter",
    "index_url",
    "read_samples",
    "scan",
    "split_key",
    "write_atomic",
]
