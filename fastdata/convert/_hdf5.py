"""A small-file corpus -> HDF5 parts (``fastdata convert SRC OUT --format hdf5``).

The output folder gets several HDF5 files, ``PREFIX-000000.h5`` ... (``shard_size`` bytes or
``shard_count`` parts, like tar shards), each holding three fields of one row per sample:

* ``image``: the JPEG (or PNG ...) bytes as variable-length ``uint8`` rows; or, with ``decode=True``,
  decoded RGB images as a fixed-shape ``(N, H, W, 3)`` ``uint8`` array (every image resized to ``size``,
  or all of one size already);
* ``label``: ``int64`` class numbers (``-1`` for a flat folder without classes);
* ``key``: each sample's path below the corpus root (a string), so every row traces back to its file.

``fd.HDF5Dataset("OUT/PREFIX-{000000..000003}.h5")`` (the manifest's ``"pattern"``) reads them as one
dataset; ``fastdata bench OUT`` finds them. Class names go into each file's attributes and into
``manifest.json`` (``"format": "hdf5"``). Rows are written in an order shuffled with ``seed`` (default
0), because a corpus is sorted by class folder and readers that keep neighbouring rows together
(``ChunkBatchSampler``, sequential reads) would otherwise get batches of a single class.

Resumable by parts: each part is written under a temporary name and renamed only when complete, then
recorded (``OUT/.fastdata-convert/``, as for tar). A run killed part way loses only the parts being
written; the rerun keeps the finished ones and writes the rest, with the same bytes (an HDF5 file cut off
mid-write cannot be trusted, so there is no resuming inside one part). Parts are written in parallel
with ``workers``. The manifest comes last.

A part is written under a temporary name (``.NAME.PID.tmp``), read back for its digest, fsynced and renamed,
then recorded. HDF5 can crash (a segfault) when the disk fills under it, so the free space is checked before
each batch of rows is written. With ``decode``, an image that does not decode is named in a
:class:`~fastdata.core.errors.DecodeFailed`, or under ``skip_bad`` left out (listed in the record) while every
other row is written: the image dataset is resizable and cut to the rows kept.
"""

from __future__ import annotations

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

from fastdata.convert._corpus import Corpus
from fastdata.convert._options import ConversionPlan
from fastdata.convert._plan import Entry, Plan, cut, shard_names, split_ext
from fastdata.convert._resume import ConversionState
from fastdata.convert._space import MARGIN, check_space
from fastdata.core import FAST, digest_of
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


WRITE_ORDER_SEED = 0
"""The default seed of the order in which samples are written."""


def plan_parts(corpus: Corpus, plan: ConversionPlan) -> tuple[Plan, tuple[int, int, int] | None]:
    """Rows in their shuffled order, cut into parts; and the decoded image shape (None without decode)."""
    decode, size, shard_size, shard_count = plan.decode, plan.size, plan.shard_size, plan.shard_count
    seed, prefix, skip_bad = plan.seed, plan.prefix, plan.skip_bad
    order = np.random.default_rng(seed).permutation(len(corpus.items))
    entries = []
    for i in order:
        item = corpus.items[i]
        ext = split_ext(item.relpath)[1]
        entries.append(Entry(item.path, item.relpath, item.relpath, ext, item.label, item.size, item.mtime, ext))
    shape: tuple[int, int, int] | None = None
    if decode:
        shape = (size[0], size[1], 3) if size is not None else _first_shape(entries, skip_bad)
        cost = [int(np.prod(shape)) + ROW_OVERHEAD] * len(entries)
    else:
        cost = [e.size + ROW_OVERHEAD for e in entries]
    parts = cut(entries, cost if shard_size is not None else [], shard_size=shard_size, shard_count=shard_count)  # type: ignore[arg-type]
    options: dict[str, object] = {
        "format": "hdf5",
        "decode": decode,
        "size": list(size) if size is not None else None,
        "shard_size": shard_size,
        "shard_count": shard_count,
        "seed": seed,
        "prefix": prefix,
        "skip_bad": skip_bad,
    }
    return Plan(shard_names(prefix, len(parts), "h5"), parts, options), shape


def _first_shape(entries: list[Entry], skip_bad: bool) -> tuple[int, int, int]:
    """The shape of the first image that decodes: what every decoded image must have without ``size``."""
    for e in entries:
        try:
            return tuple(decode_image(e.path, _read(e), None).shape)  # type: ignore[return-value]
        except (DecodeFailed, SourceNotFound, SourceUnreadable):
            if not skip_bad:
                raise
    raise ConfigError("no file of the corpus decodes as an image; convert without --decode to keep the bytes")


@dataclass(frozen=True)
class Hdf5Task:
    """How to write the parts of one HDF5 conversion (picklable, like ``TarTask``).

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

    @classmethod
    def of(cls, plan: ConversionPlan, classes: list[str], shape: tuple[int, int, int] | None) -> Hdf5Task:
        return cls(plan.out, classes, plan.decode, plan.size, shape, plan.skip_bad, plan.fsync, plan.seed)

    def need(self, plan: Plan, i: int) -> int:
        """Bytes part ``i`` takes on disk (an estimate, with a margin)."""
        n = len(plan.shards[i])
        data = int(np.prod(self.shape)) * n if self.shape is not None else plan.shard_bytes(i)
        return int((data + 64 * n) * 1.05) + (1 << 20)

    def manifest(
        self, plan: Plan, records: list[dict[str, Any]], corpus: Corpus, problems: list[str], base: dict[str, Any]
    ) -> dict[str, Any]:
        """``base`` with what an HDF5 manifest adds: its fields, and how its rows were ordered."""
        image = {"kind": "array", "dtype": "uint8", "shape": list(self.shape)} if self.shape else {"kind": "bytes"}
        label = {"kind": "array", "dtype": "int64", "shape": []}
        base.update(fields={"image": image, "label": label, "key": {"kind": "str"}}, decoded=self.decode)
        base["write_order_seed"] = plan.options["seed"]
        return base

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
                # HDF5 writes through its own buffers: read the part back (from the page cache) for its digest
                with tmp.open("rb") as f:
                    digest = digest_of(iter(lambda: f.read(1 << 20), b""), FAST)
                if self.fsync:
                    _fsync(tmp)
                record = {
                    "name": name,
                    "samples": sum(labels.values()),
                    "bytes": tmp.stat().st_size,
                    FAST: digest,
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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["Hdf5Task", "decode_image", "plan_parts"]
