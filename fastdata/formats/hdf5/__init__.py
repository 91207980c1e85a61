"""HDF5 files read by rows: fields and their layouts (``_reader``: :class:`FileInfo`, :class:`FieldInfo`,
the field decoders), the per-process file handles (``_handle``), external links (``_links``), rows read in
runs of chunks (``_rows``) and the HDF5 types fastdata reads or refuses (``_types``). The bytes on disk:
``README.md`` beside this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.formats.hdf5._handle import H5Handle, row_error
    from fastdata.formats.hdf5._reader import (
        DEFAULT_RDCC_NBYTES,
        DEFAULT_RDCC_NSLOTS,
        DEFAULT_RDCC_W0,
        BadLayout,
        ChunkCache,
        CorruptHDF5,
        FieldDecoder,
        FieldInfo,
        FileChanged,
        FileInfo,
        check_same_rows,
        describe,
        field_info,
    )
    from fastdata.formats.hdf5._rows import read_field
    from fastdata.formats.hdf5._types import as_dict

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "DEFAULT_RDCC_NBYTES",
    "DEFAULT_RDCC_NSLOTS",
    "DEFAULT_RDCC_W0",
    "BadLayout",
    "ChunkCache",
    "CorruptHDF5",
    "FieldDecoder",
    "FieldInfo",
    "FileChanged",
    "FileInfo",
    "H5Handle",
    "as_dict",
    "check_same_rows",
    "describe",
    "field_info",
    "read_field",
    "row_error",
]
