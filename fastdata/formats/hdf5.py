"""HDF5 files as a sample format: the layout check, opening a file read-only with a chunk cache, and
decoding a sample's variable-length byte fields (:class:`FieldDecoder`).

A file holds samples when each *field* is an HDF5 dataset whose first axis runs over the samples and
all fields have the same length: ``image`` of shape ``(N, H, W, 3)`` and ``label`` of shape ``(N,)``,
or ``jpeg`` holding variable-length ``uint8`` rows (encoded images). :func:`describe` checks this once,
when a dataset is built, and records what the readers of :mod:`fastdata.formats.hdf5_rows` need: each
field's kind, row shape, chunking and whether its rows can be read straight from the file.

Errors name the file and the field and say what to do: a missing file or field is
:class:`~fastdata.core.errors.SourceNotFound`; a file HDF5 cannot open (truncated, not HDF5) is
:class:`CorruptHDF5`; fields that do not form samples (unequal lengths, a group, a scalar) are
:class:`BadLayout`; a file replaced after the dataset was built is :class:`FileChanged`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py  # imported here so that a missing h5py fails on first use with the install hint
import numpy as np
from h5py import h5d

from fastdata.core.errors import (
    BadSample,
    ConfigError,
    CorruptShard,
    DecodeFailed,
    SourceNotFound,
    SourceUnreadable,
    check_positive,
)
from fastdata.formats.decode import IMAGE_EXTS, INT_EXTS, TEXT_EXTS, Decoder

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

FieldKind = Literal["array", "bytes", "str", "object"]
"""How a field's rows come back: ``"array"`` fixed-size rows (numpy arrays or scalars), ``"bytes"``
variable-length ``uint8`` rows (``bytes``; encoded images), ``"str"`` strings, ``"object"`` other
variable-length rows (numpy arrays of varying length)."""

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
        kind (FieldKind): how its rows come back.
        dtype (np.dtype): numpy dtype of the HDF5 dataset (h5py's, with its vlen metadata).
        row_shape (tuple[int, ...]): shape of one row (``()`` for scalars and variable-length rows).
        row_bytes (int): bytes of one fixed-size row; 0 for variable-length rows.
        chunk_rows (int | None): rows per chunk along the first axis; None without chunking.
        direct (bool): rows can be read straight from the file's bytes, bypassing HDF5: fixed-size
            native numeric rows, no filter (compression), stored contiguously or in chunks of whole rows.
    """

    name: str
    kind: FieldKind
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    row_bytes: int
    chunk_rows: int | None
    direct: bool


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

    @property
    def block_rows(self) -> int:
        """Rows that are cheap to read together: :data:`VLEN_BLOCK_ROWS` when a field has variable-length
        rows, else the chunk rows of the widest field, or about 1 MiB of rows when it has no chunks."""
        if not self.fields:
            return 1
        if any(f.kind != "array" for f in self.fields):
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


def describe(path: str, fields: tuple[str, ...], cache: ChunkCache | None = None) -> FileInfo:
    """Open ``path``, check that ``fields`` form samples, and close it again.

    Raises:
        SourceNotFound: the file, or one of the fields, does not exist (the message lists the datasets
            the file holds). BadLayout: a field is a group or a scalar, or the fields' lengths differ.
        CorruptHDF5: HDF5 cannot open the file.
    """
    identity = file_identity(path)
    with open_file(path, cache or ChunkCache()) as f:
        infos = tuple(_field(f, path, name) for name in fields)
        lengths = {info.name: int(f[info.name].shape[0]) for info in infos}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
        raise BadLayout(
            f"{path}: fields have unequal lengths ({listed}); every field needs one row per "
            "sample: fix the file, or ask only for fields of equal length",
            path,
        )
    length = next(iter(lengths.values())) if lengths else 0
    return FileInfo(path, length, infos, identity)


def _field(f: Any, path: str, name: str) -> FieldInfo:
    obj = f.get(name)
    if obj is None:
        raise SourceNotFound(
            f"{path}: no field {name!r}; the file holds {_list_datasets(f)}; pass fields=(...) naming those"
        )
    if not isinstance(obj, h5py.Dataset):
        raise BadLayout(
            f"{path}: field {name!r} is a group, not a dataset; name a dataset inside it ({_list_datasets(obj)})", path
        )
    if obj.ndim == 0:
        raise BadLayout(f"{path}: field {name!r} is a scalar, not one row per sample", path)
    return field_info(obj, name)


def field_info(ds: Any, name: str) -> FieldInfo:
    """The :class:`FieldInfo` of an open h5py dataset."""
    dtype = ds.dtype
    chunk_rows = int(ds.chunks[0]) if ds.chunks else None
    vlen = h5py.check_vlen_dtype(dtype)
    strings = h5py.check_string_dtype(dtype)
    if strings is not None and strings.length is None:
        return FieldInfo(name, "str", dtype, (), 0, chunk_rows, False)
    if vlen is not None:
        kind: FieldKind = "bytes" if vlen in (np.dtype(np.uint8), np.dtype(np.int8)) else "object"
        return FieldInfo(name, kind, dtype, (), 0, chunk_rows, False)
    row_shape = tuple(int(s) for s in ds.shape[1:])
    row_bytes = int(dtype.itemsize * np.prod(row_shape, dtype=np.int64))
    dcpl = ds.id.get_create_plist()
    layout = dcpl.get_layout()
    direct = (
        dtype.kind in "biufc"
        and dtype.names is None
        and dtype.isnative
        and ds.id.get_type().get_size() == dtype.itemsize
        and dcpl.get_nfilters() == 0
        and dcpl.get_external_count() == 0
        and (layout == h5d.CONTIGUOUS or (layout == h5d.CHUNKED and tuple(ds.chunks[1:]) == row_shape))
        and row_bytes > 0
    )
    return FieldInfo(name, "array", dtype, row_shape, row_bytes, chunk_rows, bool(direct))


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
    for :class:`~fastdata.core.pipeline.SamplePipeline`; fixed-size fields are left as they are.

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
