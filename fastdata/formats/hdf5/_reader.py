"""HDF5 files as a sample format: the layout check, opening a file read-only with a chunk cache, and
decoding a sample's variable-length byte fields (:class:`FieldDecoder`).

A file holds samples when each *field* is an HDF5 dataset whose first axis runs over the samples and
all fields have the same length: ``image`` of shape ``(N, H, W, 3)`` and ``label`` of shape ``(N,)``,
or ``jpeg`` holding variable-length ``uint8`` rows (encoded images). :func:`describe` checks this once,
when a dataset is built, and records what the readers of :mod:`fastdata.formats.hdf5` need: each
field's kind, row shape, chunking and whether its rows can be read straight from the file.

What each field's rows come back as is judged by its datatype (:mod:`fastdata.formats.hdf5`);
fields reached through links are followed as h5py follows them (:mod:`fastdata.formats.hdf5`).

Errors name the file and the field and say what to do: a missing file or field (or a broken link to it)
is :class:`~fastdata.core.errors.SourceNotFound`; a file HDF5 cannot open (truncated, not HDF5) is
:class:`CorruptHDF5`; fields that do not form samples (unequal lengths, a group, a scalar, a null
dataspace) are :class:`BadLayout`; a datatype fastdata does not read, or a compression filter this process
lacks, is ``UnsupportedField``; a file replaced or rewritten after the
dataset was built is :class:`FileChanged`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py  # imported here so that a missing h5py fails on first use with the install hint
import numpy as np
from h5py import h5d

from fastdata.core.errors import (
    BadSample,
    ConfigError,
    CorruptShard,
    DecodeFailed,
    FastdataError,
    SourceNotFound,
    SourceUnreadable,
    check_positive,
)
from fastdata.formats._decode import IMAGE_EXTS, INT_EXTS, TEXT_EXTS, Decoder
from fastdata.formats.hdf5._links import broken_link, linked_file
from fastdata.formats.hdf5._types import FieldKind, UnsupportedField, field_type, filters, missing_filter

_KNOWN_EXTS = IMAGE_EXTS | INT_EXTS | TEXT_EXTS | {"json", "npy"}

DEFAULT_RDCC_NBYTES = 16 << 20
"""Chunk cache per open file and process, in bytes: 16 MiB. HDF5's own default (1 MiB) is smaller than
one chunk of most image datasets, and a chunk that does not fit is decompressed again for every row
read from it. Memory bound: ``rdcc_nbytes x open files x workers``; the cache fills only with chunks
read through HDF5 (compressed or variable-length fields; uncompressed fixed-size rows bypass it)."""

DEFAULT_RDCC_NSLOTS = 10_007
"""Hash slots of the chunk cache: a prime, as HDF5 advises, about 100 times the number of chunks that
fit in the cache for chunks of 160 KiB and up (16 MiB / 160 KiB = 100). Smaller chunks share slots,
which only evicts them sooner; each slot costs 8 bytes."""

DEFAULT_RDCC_W0 = 0.75
"""HDF5's default preemption policy: how readily fully read chunks are evicted first (0 to 1)."""

# Bytes of one block that the chunk-aware sampler keeps together in a file without chunks.
CONTIGUOUS_BLOCK_BYTES = 1 << 20

VLEN_BLOCK_ROWS = 64
"""Rows per block of the chunk-aware sampler when a field has variable-length rows. Their bytes lie in
HDF5's heap in the order they were written, whatever the chunking of their references, so small blocks
keep a batch in a few runs of neighbouring rows: measured on 14 KiB rows, blocks of 64 or 256 rows read as
fast as sequential order, blocks of 1024 about 0.7 of it, random order about 0.5."""


class CorruptHDF5(CorruptShard):
    """An HDF5 file is truncated or damaged (a :class:`~fastdata.core.errors.CorruptShard`, so one ``except``
    catches damaged files of every format)."""


class BadLayout(BadSample):
    """A file's fields do not form samples: unequal lengths, a group or a scalar where a dataset of rows
    is expected."""


class FileChanged(BadSample):
    """A file was replaced or modified after the dataset was built (a conversion rerun mid-training)."""


@dataclass(frozen=True)
class ChunkCache:
    """HDF5's chunk cache for each open file (see h5py's ``File(rdcc_nbytes=, rdcc_nslots=, rdcc_w0=)``).

    Attributes:
        nbytes (int): cache size per open file and process, in bytes; 0 turns it off. Defaults to
            :data:`DEFAULT_RDCC_NBYTES` (16 MiB).
        nslots (int): hash slots; a prime about 100 times the number of chunks that fit. Defaults to
            :data:`DEFAULT_RDCC_NSLOTS` (10_007).
        w0 (float): preemption policy, 0 to 1. Defaults to :data:`DEFAULT_RDCC_W0` (0.75).
    """

    nbytes: int = DEFAULT_RDCC_NBYTES
    nslots: int = DEFAULT_RDCC_NSLOTS
    w0: float = DEFAULT_RDCC_W0

    def __post_init__(self) -> None:
        check_positive("rdcc_nbytes", self.nbytes, allow_zero=True)
        check_positive("rdcc_nslots", self.nslots)
        if not 0.0 <= self.w0 <= 1.0:
            raise ConfigError(f"rdcc_w0={self.w0!r} must lie in [0, 1]")


@dataclass(frozen=True)
class FieldInfo:
    """One field of a file, as :func:`describe` found it.

    Attributes:
        name (str): the HDF5 path of the dataset inside the file (``"image"``, ``"data/label"``).
        kind (FieldKind): how its rows come back (see ``FieldKind``).
        dtype (np.dtype): numpy type of one element of a batch column, native byte order (h5py's, with
            its vlen metadata, for variable-length rows).
        row_shape (tuple[int, ...]): shape of one row as it comes back (an HDF5 array datatype's shape
            included; ``()`` for scalars and one-dimensional variable-length fields).
        row_bytes (int): bytes of one fixed-size row; 0 for variable-length rows.
        chunk_rows (int | None): rows per chunk along the first axis; None without chunking.
        direct (bool): rows can be read straight from the file's bytes, bypassing HDF5: fixed-size
            native numeric rows, no filter (compression), stored contiguously or in chunks of whole rows.
        read_dtype (np.dtype): numpy type of one element of the HDF5 dataset when read through HDF5
            (a subarray type for an HDF5 array datatype), native byte order. Defaults to ``dtype``.
        file_ndim (int): dimensions of the HDF5 dataset (rows included). Defaults to 1.
        filters (tuple[tuple[int, str], ...]): ``(id, name)`` of each HDF5 filter of the field.
        source (str | None): the file that holds the field's data when it is not this file (an HDF5
            external link, as "master files" of detector data use); direct reads go to that file.
        source_identity (tuple[int, int, int, int] | None): :func:`file_identity` of ``source``.
    """

    name: str
    kind: FieldKind
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    row_bytes: int
    chunk_rows: int | None
    direct: bool
    read_dtype: np.dtype[Any] | None = None
    file_ndim: int = 1
    filters: tuple[tuple[int, str], ...] = ()
    source: str | None = None
    source_identity: tuple[int, int, int, int] | None = None

    @property
    def fixed(self) -> bool:
        """Rows of one size, read into one array per batch (``"array"`` and ``"compound"`` fields)."""
        return self.kind in ("array", "compound")


@dataclass(frozen=True)
class FileInfo:
    """What a dataset knows about one file without keeping it open.

    Attributes:
        path (str): the file.
        length (int): samples (rows of every field).
        fields (tuple[FieldInfo, ...]): the fields, in the order asked for.
        identity (tuple[int, int, int, int]): device, inode, size and mtime (ns) when it was described:
            a worker that finds different ones raises :class:`FileChanged` instead of misreading.
    """

    path: str
    length: int
    fields: tuple[FieldInfo, ...]
    identity: tuple[int, int, int, int]

    def changed(self) -> FileChanged | None:
        """The error to raise if the file, or a file its fields link to, is not the one described (another
        size, modification time or inode: rewritten or replaced since); None when all are the same.

        Raises:
            SourceNotFound: one of the files is gone. SourceUnreadable: one cannot be read any more.
        """
        why = self.change()
        return FileChanged(f"{self.path}: {why}", self.path) if why else None

    def change(self) -> str:
        """What :meth:`changed` says, without the path in front; "" when nothing changed."""
        for path, identity in self.identities():
            if file_identity(path) != identity:
                linked = "" if path == self.path else f" (the file its fields link to, {path})"
                return (
                    f"the file{linked} changed after the dataset was built (size, time or inode differ: "
                    "rewritten while a job reads it?); build the dataset again once it is complete"
                )
        return ""

    def identities(self) -> list[tuple[str, tuple[int, int, int, int]]]:
        """``(path, identity)`` of the file and of every other file its fields' data lie in."""
        out = [(self.path, self.identity)]
        for f in self.fields:
            if f.source is not None and f.source_identity is not None and (f.source, f.source_identity) not in out:
                out.append((f.source, f.source_identity))
        return out

    @property
    def block_rows(self) -> int:
        """Rows that are cheap to read together: :data:`VLEN_BLOCK_ROWS` when a field has variable-length
        rows, else the chunk rows of the widest field, or about 1 MiB of rows when it has no chunks."""
        if not self.fields:
            return 1
        if not all(f.fixed for f in self.fields):
            return VLEN_BLOCK_ROWS
        widest = max(self.fields, key=lambda f: f.row_bytes)
        if widest.chunk_rows:
            return widest.chunk_rows
        return max(1, CONTIGUOUS_BLOCK_BYTES // widest.row_bytes)


def file_identity(path: str) -> tuple[int, int, int, int]:
    """``(st_dev, st_ino, st_size, st_mtime_ns)`` of ``path``; raises SourceNotFound when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SourceNotFound(f"{path}: no such file; check the path (and the glob, if any)") from None
    except PermissionError:
        raise SourceUnreadable(f"{path}: permission denied; check the file's mode and owner") from None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def open_file(path: str, cache: ChunkCache, *, driver: str | None = None) -> Any:
    """Open ``path`` read-only with ``cache``, turning h5py's errors into fastdata's.

    Raises:
        SourceNotFound: no such file. SourceUnreadable: permission denied or a folder.
        CorruptHDF5: not an HDF5 file, or truncated.
    """
    if os.path.isdir(path):
        raise SourceUnreadable(f"{path}: is a folder, not an HDF5 file")
    try:
        return h5py.File(path, "r", driver=driver, rdcc_nbytes=cache.nbytes, rdcc_nslots=cache.nslots, rdcc_w0=cache.w0)
    except FileNotFoundError:
        raise SourceNotFound(f"{path}: no such file; check the path (and the glob, if any)") from None
    except PermissionError:
        raise SourceUnreadable(f"{path}: permission denied; check the file's mode and owner") from None
    except OSError as e:
        if not Path(path).exists():
            raise SourceNotFound(f"{path}: no such file; check the path (and the glob, if any)") from None
        raise CorruptHDF5(
            f"{path}: HDF5 cannot open it ({e}); the file is truncated or not HDF5: re-create it "
            "(an interrupted copy or conversion?), or pass on_error='skip' to leave it out",
            path,
        ) from None


def damaged_metadata(path: str, e: BaseException) -> CorruptHDF5:
    """The error for a file whose metadata HDF5 cannot read (``e``: h5py's error)."""
    return CorruptHDF5(
        f"{path}: HDF5 cannot read the file's metadata ({type(e).__name__}: {e}); the file is damaged: "
        "re-create it (an interrupted copy or conversion?), or pass on_error='skip' to leave it out",
        path,
    )


def describe(path: str, fields: tuple[str, ...], cache: ChunkCache | None = None) -> FileInfo:
    """Open ``path``, check that ``fields`` form samples, and close it again.

    Raises:
        SourceNotFound: the file, or one of the fields, does not exist (the message lists the datasets
            the file holds), or an external link points to a file that does not exist.
        BadLayout: a field is a group or a scalar, or the fields' lengths differ.
        UnsupportedField: a field's datatype cannot be read, or its compression filter is missing.
        CorruptHDF5: HDF5 cannot open the file.
    """
    identity = file_identity(path)
    with open_file(path, cache or ChunkCache()) as f:
        try:
            infos = tuple(_field(f, path, name) for name in fields)
            lengths = {info.name: int(f[info.name].shape[0]) for info in infos}
        except FastdataError:
            raise
        except (RuntimeError, KeyError, OSError, ValueError) as e:
            # HDF5 opened the file but cannot read its metadata on the way to a field: a damaged object
            # header, link or heap (one flipped bit is enough). h5py says so as a bare KeyError or
            # RuntimeError ("bad object header version number") that names no file.
            raise damaged_metadata(path, e) from None
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        raise BadLayout(
            f"{path}: fields have unequal lengths ({listed}); every field needs one row per "
            "sample: fix the file, or ask only for fields of equal length",
            path,
        )
    length = next(iter(lengths.values())) if lengths else 0
    return FileInfo(path, length, infos, identity)


def check_same_rows(first: FileInfo, info: FileInfo) -> None:
    """Samples of every file must collate together: the same kind, row shape and type per field.

    Raises:
        BadLayout: naming both files, the field and its rows in each.
    """
    for a, b in zip(first.fields, info.fields):
        if (a.kind, a.row_shape) != (b.kind, b.row_shape) or (a.fixed and a.dtype != b.dtype):

            def rows(f: FieldInfo) -> str:
                return f"{f.kind} rows {f.row_shape} {f.dtype}" if f.fixed else f"{f.kind} rows"

            raise BadLayout(
                f"{info.path}: field {b.name!r} has {rows(b)}, but {first.path} has {rows(a)}; "
                "a field must have the same row shape and type in every file",
                info.path,
            )


def _field(f: Any, path: str, name: str) -> FieldInfo:
    try:
        obj = f.get(name)
    except (KeyError, OSError):  # a link on the way cannot be followed
        obj = None
    if obj is None:
        broken = broken_link(f, name)
        if broken:
            raise SourceNotFound(f"{path}: field {name!r} {broken}")
        raise SourceNotFound(
            f"{path}: no field {name!r}; the file holds {_list_datasets(f)}; pass fields=(...) naming those"
        )
    if not isinstance(obj, h5py.Dataset):
        raise BadLayout(
            f"{path}: field {name!r} is a group, not a dataset; name a dataset inside it ({_list_datasets(obj)})", path
        )
    if obj.shape is None:
        raise BadLayout(f"{path}: field {name!r} has a null dataspace (no data at all), not one row per sample", path)
    if obj.ndim == 0:
        raise BadLayout(f"{path}: field {name!r} is a scalar, not one row per sample", path)
    return field_info(obj, name, path)


def field_info(ds: Any, name: str, path: str = "") -> FieldInfo:
    """The :class:`FieldInfo` of an open h5py dataset (field ``name`` of the file ``path``).

    Raises:
        UnsupportedField: its datatype cannot be read, or a filter it is compressed with is missing.
    """
    where = path or ds.file.filename
    ftype = field_type(ds, where, name)
    chunk_rows = int(ds.chunks[0]) if ds.chunks else None
    dcpl = ds.id.get_create_plist()
    pipeline = filters(dcpl)
    missing = missing_filter(pipeline)
    if missing:
        raise UnsupportedField(f"{where}: field {name!r} ({ds.dtype}) cannot be read: {missing}")
    source = linked_file(ds, path)
    extra: dict[str, Any] = {
        "read_dtype": ftype.read_dtype,
        "file_ndim": int(ds.ndim),
        "filters": pipeline,
        "source": source,
        "source_identity": file_identity(source) if source is not None else None,
    }
    if ftype.kind not in ("array", "compound"):
        return FieldInfo(name, ftype.kind, ftype.dtype, ftype.row_shape, 0, chunk_rows, False, **extra)
    row_bytes = int(ftype.dtype.itemsize * np.prod(ftype.row_shape, dtype=np.int64))
    layout = dcpl.get_layout()
    direct = (
        ftype.plain
        and ds.id.get_type().get_size() == ftype.read_dtype.itemsize
        and not pipeline
        and dcpl.get_external_count() == 0
        and (layout == h5d.CONTIGUOUS or (layout == h5d.CHUNKED and tuple(ds.chunks[1:]) == tuple(ds.shape[1:])))
        and row_bytes > 0
    )
    return FieldInfo(name, ftype.kind, ftype.dtype, ftype.row_shape, row_bytes, chunk_rows, bool(direct), **extra)


def _list_datasets(group: Any, limit: int = 12) -> str:
    names: list[str] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            names.append(repr(name))

    group.visititems(visit)
    if not names:
        return "no datasets"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


class FieldDecoder:
    """Decodes the variable-length byte fields of an HDF5 sample by extension: a field named ``meta.json``
    as JSON, ``caption.txt`` as text, and one without a known extension as an image. A sample decoder
    for :class:`~fastdata.core.SamplePipeline`; fixed-size fields are left as they are.

    Args:
        decoder (Decoder): decodes one member's bytes (:meth:`Decoder.decode_member`).
        fields (tuple[str, ...]): the byte fields.
        paths (Sequence[str]): the dataset's files, and ``starts`` (np.ndarray): each one's first dataset
            index (then the total), to name the file and row of a sample that fails.
    """

    def __init__(self, decoder: Decoder, fields: tuple[str, ...], paths: Sequence[str], starts: np.ndarray) -> None:
        self.decoder, self.paths, self.starts = decoder, paths, starts
        exts = (name.rsplit("/", 1)[-1].rsplit(".", 1)[-1].lower() for name in fields)
        self.fields = tuple((name, ext if ext in _KNOWN_EXTS else "jpg") for name, ext in zip(fields, exts))

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        decode = self.decoder.decode_member
        for name, ext in self.fields:
            try:
                sample[name] = decode(ext, sample[name])
            except Exception as e:
                i = sample["__index__"]
                file = int(np.searchsorted(self.starts, i, side="right")) - 1
                path, row = self.paths[file], i - int(self.starts[file])
                raise DecodeFailed(
                    f"{path}: field {name!r}, row {row} (dataset index {i}): cannot decode "
                    f"({type(e).__name__}: {e}); the bytes are damaged or not an image, or pass "
                    "decode='raw' to get the bytes",
                    path,
                ) from e
        return sample
