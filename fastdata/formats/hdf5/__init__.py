"""HDF5 files read by rows: fields and their layouts (``_reader``: :class:`FileInfo`, :class:`FieldInfo`,
the field decoders), the per-process file handles (``_handle``), external links (``_links``), rows read in
runs of chunks (``_rows``) and the HDF5 types fastdata reads or refuses (``_types``). The bytes on disk:
``README.md`` beside this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.formats.hdf5._reader import (
        BadLayout,
        ChunkCache,
        CorruptHDF5,
        FieldInfo,
        FileChanged,
        FileInfo,
        describe,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BadLayout": "._reader",
        "ChunkCache": "._reader",
        "CorruptHDF5": "._reader",
        "FieldInfo": "._reader",
        "FileChanged": "._reader",
        "FileInfo": "._reader",
        "describe": "._reader",
    },
)

__all__ = ["BadLayout", "ChunkCache", "CorruptHDF5", "FieldInfo", "FileChanged", "FileInfo", "describe"]
