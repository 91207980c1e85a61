"""Writing one planned HDF5 part (``PREFIX-000000.h5`` ...): the unit of work of an HDF5 conversion.

A part holds its rows in three fields (``image``, ``label``, ``key``; see :mod:`fastdata.convert._hdf5`).
It is written under a temporary name (``.NAME.PID.tmp``), read back for its SHA-256, fsynced and renamed,
then recorded: a part exists under its final name only when complete, and a killed run's temporary
file is deleted by the next run. HDF5 can crash (a segfault) when the disk fills under it, so the free
space is checked before each batch of rows is written.

With ``decode``, an image that does not decode is named in a :class:`~fastdata.core.errors.DecodeFailed`,
or under ``skip_bad`` left out (listed in the record) while every other row is written: the image
dataset is resizable and cut to the rows kept.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from PIL import Image

from fastdata.convert._plan import Entry
from fastdata.convert._resume import ConversionState
from fastdata.convert._space import MARGIN, check_space
from fastdata.core.errors import ConfigError, DecodeFailed, SourceNotFound, SourceUnreadable

Progress = Callable[[int, int], None]

CHUNK_BYTES = 1 << 20
"""Target size of one chunk of decoded images: 1 MiB, the top of HDF5's advised 10 KiB - 1 MiB range, so
that a chunk-aware batch reads few, large chunks."""

VLEN_CHUNK_ROWS = 1024
"""Rows per chunk of the variable-length and string fields (16 bytes of heap reference per row)."""

LABEL_CHUNK_ROWS = 4096

WRITE_BATCH = 256
"""Samples read (and decoded) before each write."""

ROW_OVERHEAD = 64
"""Bytes an HDF5 part takes per row beyond the image bytes (heap references, keys, labels): an estimate."""


@dataclass(frozen=True)
class Hdf5Task:
    """How to write the parts of one HDF5 conversion (picklable, like :class:`~fastdata.convert._tar_task.TarTask`).

    Attributes:
        out (str): the output folder.
        classes (list[str]): the corpus's class names (stored in every part's attributes).
        decode (bool): store decoded RGB ``uint8`` images of one shape instead of the files' bytes.
        size (tuple[int, int] | None): with ``decode``, resize every image to (height, width).
        shape (tuple[int, int, int] | None): with ``decode``, the shape every image must have (from the
            plan: ``size``, or the first image's own).
        skip_bad (bool): leave out files that cannot be read or decoded, listing them in the record.
        fsync (bool): flush each part to disk before it is recorded.
        seed (int): the seed of the row order (stored in the attributes).
    """

    out: str
    classes: list[str]
    decode: bool
    size: tuple[int, int] | None
    shape: tuple[int, int, int] | None
    skip_bad: bool
    fsync: bool
    seed: int

    def write(
        self, name: str, entries: list[Entry], progress: Progress | None = None, finisher: Executor | None = None
    ) -> Future[dict[str, Any]]:
        """Write part ``name``; the future holds its record once it is published and saved."""
        path = Path(self.out) / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        try:
            labels, skipped = self._write(tmp, entries, progress)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

        def publish() -> dict[str, Any]:
            try:
                digest, nbytes = _sha256(tmp)
                if self.fsync:
                    _fsync(tmp)
                record = {
                    "name": name,
                    "samples": sum(labels.values()),
                    "bytes": nbytes,
                    "sha256": digest,
                    "labels": {str(k): v for k, v in sorted(labels.items())},
                    "skipped": skipped,
                }
                # the record first, then the part under its final name: a worker killed in between (its
                # parent died) leaves a record of a part that is not there (redone), never a finished
                # part without a record (which a rerun would write again)
                ConversionState(self.out, self.fsync).save_record(record)
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return record

        if finisher is None:
            done: Future[dict[str, Any]] = Future()
            done.set_result(publish())
            return done
        return finisher.submit(publish)

    # -- internals ---------------------------------------------------------------------------------
    def _write(self, path: Path, entries: list[Entry], progress: Progress | None) -> tuple[Counter[int], list[str]]:
        n = len(entries)
        kept: list[Entry] = []
        skipped: list[str] = []
        with h5py.File(path, "w") as f:
            if self.decode:
                assert self.shape is not None
                per_chunk = max(1, min(n, CHUNK_BYTES // int(np.prod(self.shape))))
                image = f.create_dataset(
                    "image",
                    (n, *self.shape),
                    dtype=np.uint8,
                    chunks=(per_chunk, *self.shape),
                    maxshape=(None, *self.shape),
                )
            else:
                image = f.create_dataset(
                    "image", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(min(n, VLEN_CHUNK_ROWS),), maxshape=(None,)
                )
            for lo in range(0, n, WRITE_BATCH):
                batch = entries[lo : lo + WRITE_BATCH]
                rows: list[Any] = []
                for e in batch:
                    try:
                        blob = _read(e)
                        rows.append(self._decode(e, blob) if self.decode else blob)
                    except (SourceNotFound, SourceUnreadable, DecodeFailed) as error:
                        if not self.skip_bad:
                            raise
                        skipped.append(str(error))
                        continue
                    kept.append(e)
                if rows:
                    at = len(kept) - len(rows)
                    nbytes = sum(r.nbytes if self.decode else len(r) for r in rows)
                    # HDF5 may crash when the disk fills under it: stop before that, with a clear error
                    check_space(self.out, 2 * nbytes + MARGIN, what=f"writing {path.name}")
                    if self.decode:
                        image[at : at + len(rows)] = np.stack(rows)
                    else:
                        _write_vlen(image, at, rows)
                if progress is not None:
                    progress(len(batch), sum(e.size for e in batch))
            if len(kept) < n:
                image.resize(len(kept), axis=0)
            k = len(kept)
            f.create_dataset(
                "label",
                data=np.array([e.label for e in kept], dtype=np.int64),
                chunks=(max(1, min(k, LABEL_CHUNK_ROWS)),),
            )
            f.create_dataset(
                "key",
                data=np.array([e.relpath for e in kept], dtype=object),
                dtype=h5py.string_dtype(),
                chunks=(max(1, min(k, VLEN_CHUNK_ROWS)),),
            )
            labels = Counter(e.label for e in kept)
            f.attrs["fastdata_version"] = 1
            f.attrs["classes"] = np.array(self.classes, dtype=h5py.string_dtype())
            f.attrs["class_counts"] = np.array([labels.get(i, 0) for i in range(len(self.classes))], dtype=np.int64)
            f.attrs["decoded"] = self.decode
            f.attrs["write_order_seed"] = self.seed
        if not self.classes:  # a flat corpus: every label is -1, counted under it
            labels = Counter({-1: len(kept)})
        return labels, skipped

    def _decode(self, e: Entry, blob: bytes) -> np.ndarray:
        arr = decode_image(e.path, blob, self.size)
        if arr.shape != self.shape:
            assert self.shape is not None
            raise ConfigError(
                f"{e.path}: image is {arr.shape[0]}x{arr.shape[1]}, the first is {self.shape[0]}x"
                f"{self.shape[1]}; decoded images need one size: pass size=(H, W) (--size HxW) to "
                "resize them all"
            )
        return arr


def decode_image(path: str, blob: bytes, size: tuple[int, int] | None) -> np.ndarray:
    """RGB ``uint8`` pixels of an image file's bytes, resized to ``size`` (height, width) if given.

    Raises:
        DecodeFailed: the bytes are not an image PIL reads (named in the message).
    """
    try:
        with Image.open(io.BytesIO(blob)) as img:
            rgb = img.convert("RGB")
    except Exception as e:
        raise DecodeFailed(
            f"{path}: cannot decode as an image ({type(e).__name__}: {e}); remove or replace the file, "
            "skip it with --skip-bad, or convert without --decode to keep the bytes",
            path,
        ) from e
    if size is not None and (rgb.height, rgb.width) != tuple(size):
        rgb = rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def _write_vlen(ds: Any, lo: int, blobs: list[bytes]) -> None:
    """Rows ``lo ..`` of a variable-length uint8 dataset. Through h5py's low-level write: its ``ds[a:b] = rows``
    turns rows that happen to be of equal length into a 2-D array and refuses them."""
    from h5py import h5s

    rows = np.empty(len(blobs), dtype=ds.dtype)
    for k, blob in enumerate(blobs):  # one by one: numpy would also stack equal-length arrays
        rows[k] = np.frombuffer(blob, dtype=np.uint8)
    space = ds.id.get_space()
    space.select_hyperslab((lo,), (len(blobs),))
    ds.id.write(h5s.create_simple((len(blobs),)), space, rows)


def _read(e: Entry) -> bytes:
    try:
        with open(e.path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise SourceNotFound(f"{e.path}: vanished after the corpus was listed; rerun the conversion") from None
    except OSError as error:
        raise SourceUnreadable(
            f"{e.path}: cannot be read ({error.strerror}); fix its mode or remove it, or skip it with --skip-bad"
        ) from None


def _sha256(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["Hdf5Task", "decode_image"]
