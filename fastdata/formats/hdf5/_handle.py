"""One HDF5 file opened in one process (:class:`H5Handle`): the h5py file and its fields' datasets,
descriptors for reading rows straight from the files that hold them (:class:`RowReader`), where each
field's chunks lie, and the error for a row that could not be read (:func:`row_error`).
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any

import numpy as np

from fastdata.core import process
from fastdata.core.errors import FastdataError
from fastdata.formats.hdf5._links import linked_file
from fastdata.formats.hdf5._reader import ChunkCache, CorruptHDF5, FieldInfo, FileChanged, FileInfo, open_file
from fastdata.formats.hdf5._types import missing_filter

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
