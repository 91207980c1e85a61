"""Reading rows of an HDF5 file in one process, batch by batch, through its open file
(:class:`~fastdata.formats.hdf5.H5Handle`).

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
from typing import Any

import numpy as np

from fastdata.formats.hdf5._handle import H5Handle, RowReader
from fastdata.formats.hdf5._reader import FieldInfo

# Small rows (up to SMALL_ROW_BYTES) closer than MERGE_GAP_BYTES in the file are taken from one span of
# it with a single copy: for labels, one copy of a few KiB beats a Python-level copy per row.
SMALL_ROW_BYTES = 512
MERGE_GAP_BYTES = 8192


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
    if len(runs) > 1 and not file_rows:  # (not ds.ndim: h5py computes it anew, ~12 us a call)
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
