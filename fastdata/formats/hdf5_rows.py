"""Reading rows of an HDF5 file in one process: the open file (:class:`H5Handle`) and batched reads.

Measured here (h5py 3.16, HDF5 2.0, page cache hot): an h5py read call costs about 25-100 us whatever
it reads; reading one row from a chunk of many loads the whole chunk into the chunk cache first; and
indexing with a list of rows (``ds[[3, 9, 14]]``) costs milliseconds *per row*, because HDF5 builds a
union of hyperslabs. A plain copy of one 12 KiB row costs about 2 us. So:

* fixed-size, uncompressed rows (:attr:`FieldInfo.direct`) are read straight into the batch buffer with
  ``os.preadv``, at the offsets HDF5 itself reports for each chunk (``chunk_iter``) or for the contiguous
  storage: one read per run of adjacent rows. HDF5 still parses the file and places the data; only the
  read of plain bytes is ours, because h5py has no cheap way to do it;
* one-dimensional fields read through HDF5 (variable-length bytes, strings, compressed labels) take one
  HDF5 call per batch, through a point selection;
* every other field goes through HDF5 one run of consecutive rows at a time, using the chunk cache.

A read that fails is retried row by row, so that one damaged chunk costs only its own rows.
"""

from __future__ import annotations

import itertools
import os
import warnings
import weakref
from typing import Any

import numpy as np

from fastdata.core import process
from fastdata.core.errors import FastdataError
from fastdata.formats.hdf5 import ChunkCache, CorruptHDF5, FieldInfo, FileChanged, FileInfo, linked_file, open_file
from fastdata.formats.hdf5_types import missing_filter

# Small rows (up to SMALL_ROW_BYTES) closer than MERGE_GAP_BYTES in the file are taken from one span of
# it with a single copy: for labels, one copy of a few KiB beats a Python-level copy per row.
SMALL_ROW_BYTES = 512
MERGE_GAP_BYTES = 8192

# Every open handle of this process, and (in a forked child) of its parent.
_live: weakref.WeakSet[H5Handle] = weakref.WeakSet()


def _close_inherited() -> None:
    """Close, in a forked child, every handle its parent opened (of any dataset): the child must not read
    through them, and while they are open HDF5 would give the child's own opens the parent's file."""
    pid = process.pid()
    for handle in list(_live):
        if handle.pid != pid:
            handle.close()


class H5Handle:
    """One HDF5 file opened in this process: the h5py file, its field datasets, a descriptor for direct
    reads, and bookkeeping that shows which process opened it.

    Opening checks that the file is the one the dataset was built on (:class:`FileChanged` otherwise).
    In a process forked from one that still holds the same file open through some other h5py handle
    (the user's own, or another dataset's), HDF5 would hand this process the *parent's* open file,
    descriptor and caches included; the file is then opened through HDF5's ``stdio`` driver, which HDF5
    never shares with another driver's handle, and a warning says so.

    Attributes:
        pid (int): the process that opened it.
        fileno (tuple[int, int]): HDF5's serial number of the open file; a worker whose handle has its
            parent's number would be reading through the parent's file.
        driver (str): the HDF5 driver in use (``"sec2"``, or ``"stdio"`` after the fallback above).
    """

    def __init__(self, info: FileInfo, cache: ChunkCache) -> None:
        self.info = info
        self.pid = process.pid()
        changed = info.changed()
        if changed is not None:
            raise changed
        self._key = info.identity[:2]
        self.datasets: dict[str, Any] = {}
        if process.forked():
            _close_inherited()
        self.file = open_file(info.path, cache)
        self.driver = "sec2"
        if process.forked() and self._shared_with_others():
            self.file.close()
            self.file = open_file(info.path, cache, driver="stdio")
            self.driver = "stdio"
            warnings.warn(
                f"fastdata: {info.path} is also open through an h5py object this worker inherited from the "
                "parent process (or opened itself); HDF5 would share that open file with the worker, so the "
                "worker opened the file through HDF5's stdio driver instead. Close your own h5py objects "
                "before the DataLoader starts its workers (or use multiprocessing_context='spawn')",
                RuntimeWarning,
                stacklevel=2,
            )
        _live.add(self)
        self.fileno: tuple[int, int] = tuple(self.file.id.fileno)  # type: ignore[assignment]
        try:
            self.datasets = {f.name: self.file[f.name] for f in info.fields}
        except (KeyError, OSError) as e:
            self.close()
            raise FileChanged(
                f"{info.path}: a field cannot be opened any more ({type(e).__name__}: {e}) although the file "
                "looks unchanged; was it rewritten in place? Build the dataset again",
                info.path,
            ) from None
        for field in info.fields:
            ds = self.datasets[field.name]
            moved = linked_file(ds, info.path) != field.source
            if ds.shape is None or ds.shape[0] != info.length or moved:
                self.close()
                found = f"its data in {linked_file(ds, info.path) or info.path}" if moved else f"{ds.shape} rows"
                raise FileChanged(
                    f"{info.path}: field {field.name!r} now has {found}; when the dataset was built: "
                    f"{info.length} rows in {field.source or info.path}; build the dataset again",
                    info.path,
                )
        self._readers: dict[str | None, RowReader] = {}
        self._offsets: dict[str, tuple[np.ndarray, int] | None] = {}
        self._mtypes: dict[str, Any] = {}

    def _shared_with_others(self) -> bool:
        """Whether HDF5 objects (files, datasets ...) other than this process's handles are open on the
        file just opened: then HDF5 shares its open file with theirs."""
        from h5py import h5f

        pid = process.pid()
        ours = sum(
            1 + len(h.datasets)
            for h in list(_live)
            if h is not self and h.pid == pid and h.file is not None and h._key == self._key
        )
        return int(h5f.get_obj_count(self.file.id, h5f.OBJ_ALL)) > ours + 1

    # -- direct reads ------------------------------------------------------------------------------
    def reader(self, field: FieldInfo) -> RowReader:
        """The bytes of the file that holds ``field``'s data, for direct reads (a descriptor of its own,
        opened on first use): this file, or the one an external link leads to."""
        reader = self._readers.get(field.source)
        if reader is None:
            if field.source is None:
                reader = RowReader(self.info.path, self.info.identity)
            else:
                assert field.source_identity is not None
                reader = RowReader(field.source, field.source_identity)
            self._readers[field.source] = reader
        return reader

    def chunk_offsets(self, field: FieldInfo) -> tuple[np.ndarray, int] | None:
        """``(byte offset of each chunk, rows per chunk)`` of a direct field; a contiguous field is one
        chunk of every row. None when HDF5 has not stored every chunk (fill values): read via HDF5."""
        if field.name not in self._offsets:
            self._offsets[field.name] = _chunk_offsets(self.datasets[field.name], field, self.info.length)
        return self._offsets[field.name]

    def mtype(self, field: FieldInfo) -> Any:
        """The HDF5 memory type to read ``field`` through HDF5 with; None where h5py derives it from the
        batch column's dtype (everything but HDF5 array datatypes, whose elements become dimensions)."""
        if field.read_dtype is None or field.read_dtype == field.dtype:
            return None
        mtype = self._mtypes.get(field.name)
        if mtype is None:
            from h5py import h5t

            mtype = self._mtypes[field.name] = h5t.py_create(field.read_dtype)
        return mtype

    def close(self) -> None:
        """Close the file and the descriptors for direct reads. Idempotent."""
        readers, self._readers = getattr(self, "_readers", {}), {}
        for reader in readers.values():
            reader.close()
        file, self.file = self.file, None
        if file is not None:
            self.datasets = {}
            file.close()

    def __repr__(self) -> str:
        return f"H5Handle({self.info.path!r}, pid={self.pid}, fileno={self.fileno})"


class RowReader:
    """Plain reads of a file's bytes with ``os.preadv`` straight into the batch buffer: one system call per
    run of rows and one copy, with no page faults on a first pass (a memory map costs a fault for every
    page it touches first: about 12% of a sequential pass here) and the GIL released while it copies.

    Raises:
        FileChanged: the path now names another file than the one the dataset was built on.
    """

    def __init__(self, path: str, identity: tuple[int, int, int, int]) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        if (st.st_dev, st.st_ino) != identity[:2]:
            os.close(self.fd)
            raise FileChanged(
                f"{path}: the file was replaced after the dataset was built; build the dataset again", path
            )
        self.size = st.st_size

    def into(self, dest: np.ndarray, offset: int) -> bool:
        """Fill C-contiguous ``dest`` with the bytes at ``offset``; False if the file ends first."""
        want = dest.nbytes
        return os.preadv(self.fd, [dest.data.cast("B")], offset) == want if want else True

    def span(self, lo: int, hi: int) -> np.ndarray | None:
        """Bytes ``lo .. hi-1`` as a new uint8 array; None if the file ends first."""
        buf = np.empty(hi - lo, dtype=np.uint8)
        return buf if self.into(buf, lo) else None

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _chunk_offsets(ds: Any, field: FieldInfo, length: int) -> tuple[np.ndarray, int] | None:
    if field.chunk_rows is None:
        base = ds.id.get_offset()
        return None if base is None else (np.array([base], dtype=np.int64), max(1, length))
    rows = field.chunk_rows
    chunks = -(-length // rows)
    if ds.id.get_num_chunks() < chunks:  # some never written (fill values): known before allocating
        return None
    addr = np.full(chunks, -1, dtype=np.int64)
    chunk_bytes = rows * field.row_bytes

    def visit(info: Any) -> None:
        if info.filter_mask == 0 and info.size == chunk_bytes and info.byte_offset is not None:
            addr[info.chunk_offset[0] // rows] = info.byte_offset

    ds.id.chunk_iter(visit)
    return None if (addr < 0).any() else (addr, rows)


def read_field(
    handle: H5Handle,
    field: FieldInfo,
    rows: np.ndarray,
    out: np.ndarray | None = None,
) -> tuple[Any, dict[int, str]]:
    """Rows ``rows`` (in that order, repeats allowed) of one field.

    Args:
        handle: the open file.
        field: the field.
        rows: row numbers in the file.
        out: for fixed-size fields (``"array"``, ``"compound"``), a C-contiguous array of shape
            ``(len(rows), *row_shape)`` and type ``field.dtype`` to fill; allocated when None.

    Returns:
        ``(values, errors)``: an array (fixed-size fields) or a list, in the order of ``rows``; and
        ``{row: reason}`` for rows that could not be read (their values are left unspecified).

    Raises:
        OSError, KeyError, ValueError, RuntimeError: h5py failed outside a row read (its chunk index,
        for instance): the caller names the file and field.
    """
    if field.kind in ("array", "compound"):
        if out is None:
            out = np.empty((len(rows), *field.row_shape), dtype=field.dtype)
        if field.direct:
            placed = handle.chunk_offsets(field)
            if placed is not None:
                return out, _read_direct(handle, field, rows, placed, out)
        return out, _read_hdf5_array(handle.datasets[field.name], field, rows, out, handle.mtype(field))
    return _read_hdf5_objects(handle.datasets[field.name], field, rows)


def _read_direct(
    handle: H5Handle, field: FieldInfo, rows: np.ndarray, placed: tuple[np.ndarray, int], out: np.ndarray
) -> dict[int, str]:
    reader = handle.reader(field)
    addr, per_chunk = placed
    size = field.row_bytes
    if not len(rows):
        return {}
    dest = out.reshape(len(rows), -1).view(np.uint8)  # (rows, size): one row of bytes per row
    first, m = int(rows[0]), len(rows)
    consecutive = m > 1 and int(rows[-1]) - first == m - 1 and bool((rows[1:] > rows[:-1]).all())
    if consecutive and _read_direct_run(reader, addr, per_chunk, size, first, m, dest):
        return {}
    offsets = addr[rows // per_chunk] + (rows % per_chunk) * size
    positions = np.arange(m)
    errors: dict[int, str] = {}
    past_end = offsets + size > reader.size
    if past_end.any():
        for r in np.unique(rows[past_end]).tolist():
            errors[r] = f"its bytes lie past the end of the file ({reader.size} bytes)"
        offsets, positions = offsets[~past_end], positions[~past_end]
    if not len(offsets):
        return errors
    order = np.argsort(offsets, kind="stable")  # in file order: the page cache and read-ahead like it
    offsets, positions = offsets[order], positions[order]
    if size <= SMALL_ROW_BYTES:
        short = _gather_small(reader, offsets, positions, size, dest)
    else:
        # runs of rows adjacent both in the file and in the batch: one read each
        joined = (np.diff(offsets) == size) & (np.diff(positions) == 1)
        bounds = [0, *(np.flatnonzero(~joined) + 1).tolist(), len(offsets)]
        offs, pos = offsets.tolist(), positions.tolist()
        short = [
            (a, b) for a, b in itertools.pairwise(bounds) if not reader.into(dest[pos[a] : pos[a] + b - a], offs[a])
        ]
    for a, b in short:  # the file shrank since it was opened
        for k in positions[a:b].tolist():
            errors[int(rows[k])] = "the file ended before its bytes (cut while being read?)"
    return errors


def _gather_small(
    reader: RowReader, offsets: np.ndarray, positions: np.ndarray, size: int, dest: np.ndarray
) -> list[tuple[int, int]]:
    """Small rows (labels ...), sorted by ``offsets``: rows less than :data:`MERGE_GAP_BYTES` apart are
    read as one span of the file and picked from it with one fancy-index copy. Returns the ranges of
    ``offsets`` whose span could not be read whole."""
    short = []
    breaks = (np.flatnonzero(np.diff(offsets) - size > MERGE_GAP_BYTES) + 1).tolist()
    for a, b in zip([0, *breaks], [*breaks, len(offsets)]):
        lo = int(offsets[a])
        span = reader.span(lo, int(offsets[b - 1]) + size)
        if span is None:
            short.append((a, b))
            continue
        rel = offsets[a:b] - lo
        if not (rel % size).any():
            dest[positions[a:b]] = span.reshape(-1, size)[rel // size]
        else:  # rows of one span that are not aligned to each other (chunks apart): one by one
            for k, r in zip(positions[a:b].tolist(), rel.tolist()):
                dest[k] = span[r : r + size]
    return short


def _read_direct_run(
    reader: RowReader, addr: np.ndarray, per_chunk: int, size: int, first: int, m: int, dest: np.ndarray
) -> bool:
    """Rows ``first .. first+m-1`` into ``dest``: one read per stretch of chunks adjacent in the file (a
    sequential batch; checked by the caller), without the per-row bookkeeping of the general case.
    False when the file ends before the bytes (the general case then finds which rows)."""
    row, k = first, 0
    while k < m:
        chunk = row // per_chunk
        lo = int(addr[chunk]) + (row % per_chunk) * size
        n = min(m - k, (chunk + 1) * per_chunk - row)
        # extend over following chunks stored right after this one
        while k + n < m and int(addr[chunk + 1]) == int(addr[chunk]) + per_chunk * size:
            chunk += 1
            n = min(m - k, (chunk + 1) * per_chunk - row)
        if lo + n * size > reader.size or not reader.into(dest[k : k + n], lo):
            return False
        row, k = row + n, k + n
    return True


def _runs(sorted_rows: np.ndarray) -> list[tuple[int, int, int]]:
    """``(position, first row, count)`` of each run of consecutive rows in sorted unique ``sorted_rows``."""
    if not len(sorted_rows):
        return []
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sorted_rows) != 1) + 1])
    ends = np.concatenate([starts[1:], [len(sorted_rows)]])
    return [(int(s), int(sorted_rows[s]), int(e - s)) for s, e in zip(starts, ends)]


def _hdf5_read(ds: Any, rows: np.ndarray, out: np.ndarray, mtype: Any = None) -> None:
    """Read sorted unique ``rows`` of ``ds`` into ``out`` through HDF5, in as few calls as it does well.
    ``mtype``: the HDF5 memory type when ``out``'s dtype does not say it (an HDF5 array datatype, whose
    elements ``out`` holds as trailing dimensions)."""
    from h5py import h5s

    space = ds.id.get_space()
    runs = _runs(rows)
    file_rows = tuple(ds.shape[1:])
    tail = (0,) * len(file_rows)
    if len(runs) > 1 and ds.ndim == 1:
        space.select_elements(rows.reshape(-1, 1).astype(np.uint64))
        ds.id.read(h5s.create_simple((len(rows),)), space, out, mtype)
        return
    for pos, first, count in runs:
        part = out[pos : pos + count]
        space.select_hyperslab((first, *tail), (count, *file_rows))
        ds.id.read(h5s.create_simple((count, *file_rows)), space, part, mtype)


def _read_isolating(ds: Any, uniq: np.ndarray, out: np.ndarray, mtype: Any = None) -> dict[int, str]:
    try:
        _hdf5_read(ds, uniq, out, mtype)
        return {}
    except Exception:  # noqa: BLE001 - HDF5 raises OSError, RuntimeError or ValueError: find the bad rows
        pass
    errors: dict[int, str] = {}
    for k, row in enumerate(uniq.tolist()):
        try:
            _hdf5_read(ds, uniq[k : k + 1], out[k : k + 1], mtype)
        except Exception as e:  # noqa: BLE001 - recorded per row; the caller applies on_error
            errors[row] = f"HDF5 cannot read it ({type(e).__name__}: {e})"
    return errors


def _read_hdf5_array(ds: Any, field: FieldInfo, rows: np.ndarray, out: np.ndarray, mtype: Any) -> dict[int, str]:
    if len(rows) < 2 or bool((np.diff(rows) > 0).all()):
        return _read_isolating(ds, rows, out, mtype)
    uniq, inverse = np.unique(rows, return_inverse=True)
    tmp = np.empty((len(uniq), *field.row_shape), dtype=field.dtype)
    errors = _read_isolating(ds, uniq, tmp, mtype)
    np.take(tmp, inverse, axis=0, out=out)
    return errors


def _as_str(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


_as_str_each = np.frompyfunc(_as_str, 1, 1)


def _read_hdf5_objects(ds: Any, field: FieldInfo, rows: np.ndarray) -> tuple[list[Any], dict[int, str]]:
    uniq, inverse = np.unique(rows, return_inverse=True)
    tmp = np.empty((len(uniq), *field.row_shape), dtype=field.dtype)
    errors = _read_isolating(ds, uniq, tmp)
    if field.row_shape:  # rows of several values: an object array per row, as h5py's ds[i] (strings decoded)
        values = list(_as_str_each(tmp) if field.kind == "str" else tmp)
    elif field.kind == "bytes":
        values = [None if v is None else v.tobytes() for v in tmp.tolist()]
    elif field.kind == "str":
        values = [_as_str(v) for v in tmp.tolist()]
    else:
        values = tmp.tolist()
    return [values[k] for k in inverse.tolist()], errors


def row_error(handle: H5Handle, field: FieldInfo, row: int, index: int, reason: str) -> CorruptHDF5 | FileChanged:
    """The error for a row that could not be read, naming the file, field, row and dataset index, and
    what to do: the file changed since the dataset was built (:class:`FileChanged`), the field's filter
    cannot be loaded in this process, or the file is damaged (:class:`CorruptHDF5`)."""
    path = handle.info.path
    where = f"{path}: field {field.name!r}, row {row} (dataset index {index})"
    try:
        change = handle.info.change()
    except FastdataError as e:  # the file is gone now
        change = str(e)
    if change:
        return FileChanged(f"{where}: {reason}; {change}", path)
    missing = missing_filter(field.filters)
    if missing:
        return CorruptHDF5(f"{where}: {reason}: {missing}", path)
    return CorruptHDF5(
        f"{where}: {reason}; the file is damaged: re-create it, or pass on_error='skip' to leave such samples out",
        path,
    )
