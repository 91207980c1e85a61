"""``HDF5Dataset``: map-style access to samples stored as HDF5 datasets of rows, safe in any worker."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from fastdata.core import SamplePipeline, process, stages, tracked
from fastdata.core.epoch import Remainder, data_digest
from fastdata.core.errors import BadSample, ConfigError, OnError, SourceNotFound, SourceUnreadable
from fastdata.core.process import BufferPool, HandleCache
from fastdata.datasets._base import MapDatasetBase
from fastdata.datasets.hdf5._batch import Sample, SampleBatch, build_samples, collate
from fastdata.formats import DecodeMode, Decoder, resolve_sources
from fastdata.formats.hdf5 import (
    DEFAULT_RDCC_NBYTES,
    DEFAULT_RDCC_NSLOTS,
    DEFAULT_RDCC_W0,
    ChunkCache,
    FieldDecoder,
    FieldInfo,
    FileInfo,
    H5Handle,
    check_same_rows,
    describe,
    read_field,
    row_error,
)
from fastdata.loading import ChunkBatchSampler
from fastdata.storage import expand_urls, scheme


def _remote(paths: Any) -> bool:
    """Whether any of ``paths`` is a URL (refused below, with the fix, before any folder is resolved)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return any(scheme(os.fspath(p)) for p in items)


class HDF5Dataset(MapDatasetBase, Dataset[Any]):
    """Samples of one or many HDF5 files; each field is an HDF5 dataset with one row per sample.

    Index ``i`` runs across the files in the order given. Each sample is a dict ``{field: value, ...,
    "__index__": i}``: what h5py's ``ds[i]`` gives, in native byte order (fixed-size rows as numpy arrays
    or scalars), except variable-length ``uint8`` rows as ``bytes`` (decoded with ``decode``),
    variable-length strings as ``str`` and compound rows as dicts of their members (see
    :mod:`fastdata.formats.hdf5`). Fields reached through external links are read from the file
    that holds them.

    Files are described once at construction (fields checked, lengths read) and closed again. Each process
    then opens a file on first use, read-only, with the chunk cache below; a forked worker never reads
    through its parent's handle (it closes what it inherited and opens its own); pickling drops the
    handles, so the dataset crosses into ``spawn`` workers without them. Rows of uncompressed fixed-size
    fields are read straight from the file with ``os.preadv`` (see :mod:`fastdata.formats.hdf5`).

    Use :meth:`sampler` (indices) or :meth:`chunk_sampler` (batches that stay within chunks: much faster
    for compressed or variable-length fields) and ``collate_fn=ds.collate`` (no second copy of batches).

    Args:
        paths (str | list[str]): HDF5 files; globs and brace ranges expand; a folder is read through the
            ``manifest.json`` that ``fastdata convert --format hdf5`` wrote in it (one without: its ``.h5``
            files).
        fields (tuple[str, ...]): HDF5 paths of the datasets that form a sample, of equal length in every
            file. Defaults to ``("image", "label")``.
        transform (Callable | None): applied to each (decoded) sample dict.
        decode ("raw" | "pil" | "numpy" | "torch" | Decoder | Callable): with a mode or a
            :class:`~fastdata.Decoder`, variable-length byte fields are decoded: by extension when the
            field's name ends in one (``meta.json``, ``caption.txt``), else as images. A callable is applied
            to the whole sample dict instead. Defaults to ``"raw"`` (bytes).
        on_error ("raise" | "skip"): bad-input policy, see :mod:`fastdata.core.errors`. Defaults to "raise".
        seed (int): seed of the samplers' shuffles and of ``worker_init_fn``. Defaults to 0.
        rank, world_size (int | None): Default to the detected ones.
        rdcc_nbytes (int): chunk cache per open file and process, in bytes. Defaults to 16 MiB
            (:data:`~fastdata.formats.hdf5.DEFAULT_RDCC_NBYTES`).
        rdcc_nslots (int): chunk cache hash slots. Defaults to 10_007.
        rdcc_w0 (float): chunk cache preemption policy. Defaults to 0.75.
        max_open (int | None): files open at once per process. Defaults to
            ``default_max_open``.

    Under ``on_error="skip"`` a bad row is left out of its batch and counted in :attr:`skipped`; a batch of
    only bad rows becomes a batch of one substitute, and ``ds[i]`` of a bad row returns it (never None):
    the next good sample after the batch's last index (after ``i``) in index order, wrapping to 0,
    counted in :attr:`substituted` (see :mod:`fastdata.datasets`).

    Raises:
        SourceNotFound: a file or field does not exist. BadLayout: fields of unequal length, a group or a
            scalar. CorruptHDF5: a file HDF5 cannot open. (Under ``on_error="skip"``, such a file is left
            out with a warning and counted once in :attr:`skipped`.) UnsupportedField: a datatype fastdata
            does not read, or a compression filter this process lacks (raised under any ``on_error``).
        FileChanged (when reading): a file rewritten or replaced since (checked when a file is opened and
            when an epoch starts), or a read that fails on a file that changed since.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        fields: str | Sequence[str] = ("image", "label"),
        *,
        transform: Callable[[Sample], Any] | None = None,
        decode: DecodeMode | Decoder | Callable[[Sample], Sample] = "raw",
        on_error: OnError = "raise",
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        rdcc_nbytes: int = DEFAULT_RDCC_NBYTES,
        rdcc_nslots: int = DEFAULT_RDCC_NSLOTS,
        rdcc_w0: float = DEFAULT_RDCC_W0,
        max_open: int | None = None,
    ) -> None:
        self._init_base(seed=seed, on_error=on_error, rank=rank, world_size=world_size)
        self.fields = _check_fields(fields)
        self.cache = ChunkCache(rdcc_nbytes, rdcc_nslots, rdcc_w0)
        field_decoder, sample_decoder = _decoders(decode)  # a bad ``decode`` fails before any file is read
        self.paths = resolve_sources(paths, "hdf5") if not _remote(paths) else expand_urls(paths)
        for path in self.paths:
            if scheme(path):
                raise ConfigError(
                    f"{path}: HDF5Dataset reads local files only; copy the file to local disk "
                    "(or convert the data to tar shards, which fastdata streams from s3://)"
                )
        self.infos: list[FileInfo | None] = []
        first: FileInfo | None = None
        for path in tracked(self.paths, "fastdata: checking HDF5 files", unit="files", enabled=len(self.paths) >= 50):
            self.infos.append(self._describe(path, first))
            first = first or self.infos[-1]
        self._fields: tuple[FieldInfo, ...] = next((i.fields for i in self.infos if i is not None), ())
        self._dicts = tuple(f.name for f in self._fields if f.kind == "compound")  # rows built as dicts
        # variable-length rows (numbers, strings): collated as lists where they do not stack
        self._ragged = tuple(f.name for f in self._fields if f.kind in ("object", "str"))
        self._starts = np.concatenate([[0], np.cumsum([i.length if i else 0 for i in self.infos])]).astype(np.int64)
        if field_decoder is not None:
            byte_fields = tuple(f.name for f in self._fields if f.kind == "bytes")
            sample_decoder = FieldDecoder(field_decoder, byte_fields, self.paths, self._starts) if byte_fields else None
        self.pipeline = SamplePipeline(sample_decoder, transform, self._policy, describe=self._where)
        self._handles: HandleCache[int, H5Handle] = HandleCache(self._open, max_open=max_open, close_inherited=True)
        self._pool = BufferPool()

    @property
    def transform(self) -> Callable[[Sample], Any] | None:
        """The user's function applied to each (decoded) sample (may be replaced)."""
        return self.pipeline.transform

    @transform.setter
    def transform(self, transform: Callable[[Sample], Any] | None) -> None:
        self.pipeline.transform = transform

    def _describe(self, path: str, first: FileInfo | None) -> FileInfo | None:
        try:
            info = describe(path, self.fields, self.cache)
            if first is not None:
                check_same_rows(first, info)
            return info
        except (SourceNotFound, SourceUnreadable, BadSample) as e:
            self._policy.handle(e)  # raises, or warns and counts the file once
            return None

    def _open(self, k: int) -> H5Handle:
        info = self.infos[k]
        assert info is not None  # indices never land in a file left out at construction
        return H5Handle(info, self.cache)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def resume_plan(self) -> dict[str, int]:
        """The data a resume state's indices name (its files' names, order and row counts), checked on loading
        (see :class:`fastdata.core.ResumeState`)."""
        return {"files": data_digest(self.paths, np.diff(self._starts))}

    def handle(self, file: int) -> H5Handle:
        """The open file number ``file`` in this process (opened now if it is not yet)."""
        return self._handles.get(file)

    def locate(self, i: int) -> tuple[int, int]:
        """``(file number, row in that file)`` of dataset index ``i``."""
        files, rows = self._locate(np.array([i], dtype=np.int64))
        return int(files[0]), int(rows[0])

    def _where(self, sample: Any) -> tuple[str, str]:
        """``(file, where)`` of a sample, for an error message: its file, row and dataset index."""
        i = int(sample["__index__"])
        files, rows = self._locate(np.array([i], dtype=np.int64))
        path = self.paths[int(files[0])]
        return path, f"{path}: row {int(rows[0])} (dataset index {i})"

    def _locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        out_of_range = (idx < -n) | (idx >= n)
        if out_of_range.any():
            bad = int(idx[out_of_range][0])
            raise IndexError(
                f"index {bad} is out of range for {n} samples in {len(self.paths)} file(s) "
                f"({self.paths[0]}{', ...' if len(self.paths) > 1 else ''})"
            )
        idx = idx % n if n else idx
        files = np.searchsorted(self._starts, idx, side="right") - 1
        return files, idx - self._starts[files]

    def follow_epoch(self) -> None:
        """As :meth:`DatasetBase.follow_epoch`; and when an epoch starts in this process, close the files
        that changed since the dataset was built (rewritten in place, replaced), so that reading them
        again raises :class:`~fastdata.formats.hdf5.FileChanged` instead of returning stale or garbled rows
        (an open HDF5 file keeps the old layout's metadata). Costs a compare per read, a ``stat`` per open
        file per epoch."""
        before = self._seen_epoch
        super().follow_epoch()
        if self._seen_epoch != before and before is not None and before[0] == process.pid():
            self._close_changed()

    def _close_changed(self) -> None:
        for k in self._handles.open_keys():
            info = self.infos[k]
            try:
                changed = info is None or info.changed() is not None
            except (SourceNotFound, SourceUnreadable):
                changed = True
            if changed:
                self._handles.discard(k)  # reopening checks the file again and raises FileChanged

    def __getitem__(self, i: int) -> Any:
        self.follow_epoch()
        got = self._read(np.array([i], dtype=np.int64))
        return got[0] if got else self._substitute(np.array([i], dtype=np.int64))[1]

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """A batch's samples in the order asked; skipped bad ones are left out (the DataLoader calls
        this to batch). Rows are read file by file, in file order, each field in as few reads as it takes."""
        self.follow_epoch()
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        out = self._read(idx)
        if not out and len(idx):  # all bad: a batch of one substitute, so that the rank keeps its batch count
            j, sample = self._substitute(idx)
            return SampleBatch(
                (*self.fields, "__index__"), np.array([j], dtype=np.int64), None, [sample], ragged=self._ragged
            )
        return out

    def _substitute(self, idx: np.ndarray) -> tuple[int, Any]:
        """The substitute for the bad samples ``idx`` (see :meth:`DatasetBase._stand_in`)."""
        files, rows = self._locate(idx)
        bad = (self._starts[files] + rows).tolist()  # negative indices made positive
        sources = [self.paths[k] for k in dict.fromkeys(files.tolist())]

        def good(indices: list[int]) -> list[tuple[int, Any]]:
            batch = self._read(np.asarray(indices, dtype=np.int64))
            return list(zip(batch.indices.tolist(), batch))

        return self._stand_in(bad, good, sources)

    def _read(self, idx: np.ndarray) -> SampleBatch:
        t = stages.clock()  # 0.0 unless `fastdata bench` probes this process
        files, rows = self._locate(idx)
        if len(self.paths) > 1 or (idx < 0).any():
            idx = self._starts[files] + rows  # negative indices made positive
        m = len(idx)
        columns = {f.name: self._pool.empty((m, *f.row_shape), f.dtype) for f in self._fields if f.fixed}
        objects: dict[str, list[Any]] = {f.name: [None] * m for f in self._fields if not f.fixed}
        bad = np.zeros(m, dtype=bool)
        if m and (len(self.paths) == 1 or bool((files == files[0]).all())):
            self._read_file(int(files[0]), np.arange(m), rows, idx, columns, objects, bad)
        elif m:
            for k in np.unique(files).tolist():
                pos = np.flatnonzero(files == k)
                self._read_file(k, pos, rows[pos], idx, columns, objects, bad)
        keys = (*self.fields, "__index__")
        read: dict[str, Any] = {**columns, **objects}
        pipeline = self.pipeline
        if pipeline.passthrough:
            stages.lap("fetch", t, m)
            if bad.any():
                keep = np.flatnonzero(~bad)
                kept = {
                    name: v[keep] if isinstance(v, np.ndarray) else [v[k] for k in keep.tolist()]
                    for name, v in read.items()
                }
                return SampleBatch(keys, idx[keep], None, rows=kept, dicts=self._dicts, ragged=self._ragged)
            return SampleBatch(keys, idx, columns, rows=read, dicts=self._dicts, ragged=self._ragged)
        good = np.flatnonzero(~bad)
        raw = build_samples(keys, idx, read, self._dicts, good.tolist())
        samples, kept_at = pipeline.batch_kept(raw, stages.lap("fetch", t, m))
        if len(kept_at) < len(good):
            dropped = np.ones(len(good), dtype=bool)
            dropped[kept_at] = False
            bad[good[dropped]] = True
        # the whole-batch columns stand for the samples only when nothing but byte fields changed
        same = pipeline.transform is None and isinstance(pipeline.decoder, FieldDecoder) and not bad.any()
        return SampleBatch(keys, idx[~bad], columns if same else None, samples, ragged=self._ragged)

    def _read_file(
        self,
        k: int,
        pos: np.ndarray,
        rows: np.ndarray,
        idx: np.ndarray,
        columns: dict[str, np.ndarray],
        objects: dict[str, list[Any]],
        bad: np.ndarray,
    ) -> None:
        try:
            handle = self._handles.get(k)
        except (SourceNotFound, SourceUnreadable, BadSample) as e:
            for p in pos.tolist():
                self._policy.handle(e)
                bad[p] = True
            return
        whole = pos[-1] - pos[0] == len(pos) - 1  # consecutive positions: read straight into the column
        for field in handle.info.fields:
            try:
                if field.fixed:
                    col = columns[field.name]
                    target = col[pos[0] : pos[-1] + 1] if whole else None
                    values, errors = read_field(handle, field, rows, out=target)
                    if not whole:
                        col[pos] = values
                else:
                    values, errors = read_field(handle, field, rows)
                    dest = objects[field.name]
                    for p, v in zip(pos.tolist(), values):
                        dest[p] = v
            except (OSError, KeyError, ValueError, RuntimeError, TypeError) as e:  # h5py, outside a row's read
                reason = f"h5py failed while reading {len(rows)} row(s) of it ({type(e).__name__}: {e})"
                self._handles.discard(k)  # its state is unknown now: reopen (and recheck the file) next time
                errors = {row: reason for row in rows.tolist()}
            if errors:
                for p, row in zip(pos.tolist(), rows.tolist()):
                    if row in errors and not bad[p]:
                        bad[p] = True
                        self._policy.handle(row_error(handle, field, row, int(idx[p]), errors[row]))
            if handle.file is None:  # discarded above: the other fields cannot be read through it
                break

    @staticmethod
    def collate(samples: Sequence[Sample]) -> Any:
        """See :func:`collate`: ``default_collate`` without a second copy of whole-batch fields."""
        return collate(samples)

    def block_starts(self) -> np.ndarray:
        """First dataset index of each block of rows that are cheap to read together (each file's chunks
        of its widest field; see :attr:`FileInfo.block_rows`)."""
        parts = []
        for info, start in zip(self.infos, self._starts[:-1].tolist()):
            if info is not None and info.length:
                parts.append(start + np.arange(0, info.length, info.block_rows, dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def chunk_sampler(
        self,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        remainder: Remainder = "drop",
        mix: int = 1,
    ) -> ChunkBatchSampler:
        """A rank-aware :class:`~fastdata.loading.ChunkBatchSampler` over this dataset's chunks,
        following its ``set_epoch``: pass it as ``DataLoader(ds, batch_sampler=...)``."""
        return ChunkBatchSampler(
            self.block_starts(),
            len(self),
            batch_size,
            shuffle=shuffle,
            seed=self.seed,
            drop_last=drop_last,
            remainder=remainder,
            mix=mix,
            rank=self.rank,
            world_size=self.world_size,
            shared=self._shared,
        )

    def warm(self) -> None:
        """Open this worker's first file before the first batch is asked for."""
        for k, info in enumerate(self.infos):
            if info is not None and info.length:
                try:
                    self._handles.get(k)
                except (SourceNotFound, SourceUnreadable, BadSample):
                    pass  # reported, under the policy, when a batch reads from it
                return

    def close(self) -> None:
        """Close every file this process opened. Idempotent; the dataset reopens on next use."""
        self._handles.close()

    def __repr__(self) -> str:
        return f"HDF5Dataset({len(self.paths)} file(s), {len(self)} samples, fields={self.fields})"


def _check_fields(fields: str | Sequence[str]) -> tuple[str, ...]:
    names = (fields,) if isinstance(fields, str) else tuple(fields)
    if not names:
        raise ConfigError("fields=() names no field; name the HDF5 datasets that form a sample")
    for name in names:
        if not isinstance(name, str) or not name.strip("/"):
            raise ConfigError(f"fields={names!r}: every field must be a non-empty HDF5 path like 'image'")
    if len(set(names)) != len(names):
        raise ConfigError(f"fields={names!r} names a field twice")
    if "__index__" in names:
        raise ConfigError("'__index__' is the key fastdata adds to every sample; it cannot be a field")
    return names


def _decoders(decode: Any) -> tuple[Decoder | None, Callable[[Sample], Sample] | None]:
    """(per-field decoder, whole-sample callable) from the ``decode`` argument."""
    if decode is None or decode == "raw":
        return None, None
    if isinstance(decode, str):
        return Decoder(decode), None  # type: ignore[arg-type]  # Decoder checks the mode
    if isinstance(decode, Decoder):
        return (decode if decode.mode != "raw" else None), None
    if callable(decode):
        return None, decode
    raise ConfigError(f"decode={decode!r} is not one of 'raw', 'pil', 'numpy', 'torch', a Decoder or a callable")
