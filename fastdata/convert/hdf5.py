"""A small-file corpus -> one HDF5 file (``fastdata convert SRC OUT --format hdf5``).

The file holds three fields of one row per sample, in a fixed shuffled order (see below):

* ``image``: the JPEG (or PNG ...) bytes as variable-length ``uint8`` rows; or, with ``decode=True``,
  decoded RGB images as a fixed-shape ``(N, H, W, 3)`` ``uint8`` array (every image resized to ``size``,
  or all of one size already);
* ``label``: ``int64`` class numbers (``-1`` for a flat folder without classes);
* ``key``: each sample's path below the corpus root (a string), so every row traces back to its file.

Class names and counts go into the file's attributes and into ``manifest.json`` beside it (the layout
of :mod:`fastdata.formats.manifest`, with ``"format": "hdf5"``). Samples are written in an order shuffled with
the fixed seed :data:`WRITE_ORDER_SEED`, because a corpus is sorted by class folder and readers that keep
neighbouring rows together (:class:`~fastdata.loading.chunk_sampler.ChunkBatchSampler`, sequential reads)
would otherwise get batches of a single class.

The file is written as ``NAME.partial`` and renamed when complete, then the manifest is written the
same way: nothing half-written ever carries the final name. A run killed part way leaves only the
``.partial`` file, which the next run deletes before starting again (an HDF5 file cut off mid-write
cannot be trusted, so there is no resuming inside one file).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from PIL import Image
from tqdm import tqdm

from fastdata.convert.corpus import Corpus, Item
from fastdata.core.errors import ConfigError, DecodeFailed, SourceNotFound, SourceUnreadable
from fastdata.formats.manifest import MANIFEST

H5_NAME = "data.h5"
"""The file written into an output folder (``OUT/data.h5``)."""

WRITE_ORDER_SEED = 0
"""Seed of the order in which samples are written."""

CHUNK_BYTES = 1 << 20
"""Target size of one chunk of decoded images: 1 MiB, the top of HDF5's advised 10 KiB - 1 MiB range, so
that a chunk-aware batch reads few, large chunks."""

VLEN_CHUNK_ROWS = 1024
"""Rows per chunk of the variable-length and string fields (16 bytes of heap reference per row)."""

LABEL_CHUNK_ROWS = 4096

WRITE_BATCH = 256
"""Samples read (and decoded) before each write."""


def output_paths(out: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``(HDF5 file, manifest)`` for ``out``: a folder gets ``OUT/data.h5``; a path ending in ``.h5`` or
    ``.hdf5`` is the file itself, with the manifest beside it."""
    target = Path(out)
    if target.suffix.lower() not in (".h5", ".hdf5"):
        target = target / H5_NAME
    return target, target.parent / MANIFEST


def convert_hdf5(
    corpus: Corpus, out: str, *, decode: bool, size: tuple[int, int] | None, progress: bool
) -> dict[str, Any]:
    """Write ``corpus`` into one HDF5 file and its ``manifest.json``; return the manifest.

    Args:
        corpus (Corpus): the files, from :func:`fastdata.convert.corpus.scan_corpus`.
        out (str): output folder (the file is ``OUT/data.h5``), or the ``.h5``/``.hdf5`` file to write.
        decode (bool): store decoded RGB images as a fixed-shape ``uint8`` array instead of their bytes.
        size (tuple[int, int] | None): ``(height, width)`` to resize every decoded image to; None keeps
            the images' own size, which must then be the same for all. Needs ``decode``.
        progress (bool): show a progress bar (tqdm).

    Raises:
        ConfigError: ``size`` without ``decode``, a bad ``size``, or images of different sizes without one.
        DecodeFailed: with ``decode``, a file that is not a readable image (named in the message).
        SourceNotFound: a corpus file vanished after the corpus was scanned.
    """
    if size is not None:
        if not decode:
            raise ConfigError("size=(H, W) resizes decoded images: pass decode=True (--decode) with it")
        if len(size) != 2 or min(size) < 1:
            raise ConfigError(f"size={size!r} must be (height, width) of at least 1 pixel")
    target, manifest_path = output_paths(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)  # left by a killed run: restart from scratch
    if corpus.problems:
        warnings.warn(
            f"fastdata convert: {len(corpus.problems)} file(s) of the corpus cannot be used and are "
            f"left out (listed in the manifest's 'problems'); first: {corpus.problems[0]}",
            stacklevel=2,
        )
    order = np.random.default_rng(WRITE_ORDER_SEED).permutation(len(corpus.items))
    items = [corpus.items[i] for i in order]
    try:
        shape = _write(partial, corpus, items, decode=decode, size=size, progress=progress)
        digest, nbytes = _sha256(partial)
        _fsync(partial)
        os.replace(partial, target)
        _fsync(target.parent)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    manifest = _manifest(corpus, target, digest, nbytes, decode=decode, shape=shape)
    _write_json(manifest_path, manifest)
    return manifest


def _write(
    path: Path, corpus: Corpus, items: list[Item], *, decode: bool, size: tuple[int, int] | None, progress: bool
) -> tuple[int, int, int] | None:
    n = len(items)
    with (
        h5py.File(path, "w") as f,
        tqdm(total=n, unit="img", desc=f"fastdata: writing {path.stem}", disable=not progress) as bar,
    ):
        labels = np.array([item.label for item in items], dtype=np.int64)
        f.create_dataset("label", data=labels, chunks=(min(n, LABEL_CHUNK_ROWS),))
        f.create_dataset(
            "key",
            data=np.array([item.relpath for item in items], dtype=object),
            dtype=h5py.string_dtype(),
            chunks=(min(n, VLEN_CHUNK_ROWS),),
        )
        _attrs(f, corpus, decode)
        image: Any = None
        shape: tuple[int, int, int] | None = None
        for lo in range(0, n, WRITE_BATCH):
            batch = items[lo : lo + WRITE_BATCH]
            blobs = [_read(item) for item in batch]
            if not decode:
                if image is None:
                    image = f.create_dataset(
                        "image", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(min(n, VLEN_CHUNK_ROWS),)
                    )
                _write_vlen(image, lo, blobs)
            else:
                arrays = [_decode(item, blob, size) for item, blob in zip(batch, blobs)]
                expected = shape or arrays[0].shape
                for item, arr in zip(batch, arrays):
                    if arr.shape != expected:
                        raise ConfigError(
                            f"{item.path}: image is {arr.shape[0]}x{arr.shape[1]}, the first is {expected[0]}x"
                            f"{expected[1]}; decoded images need one size: pass size=(H, W) (--size HxW) to "
                            "resize them all"
                        )
                if image is None:
                    shape = arrays[0].shape  # type: ignore[assignment]
                    per_chunk = max(1, min(n, CHUNK_BYTES // arrays[0].nbytes))
                    image = f.create_dataset(
                        "image", (n, *arrays[0].shape), dtype=np.uint8, chunks=(per_chunk, *arrays[0].shape)
                    )
                image[lo : lo + len(batch)] = np.stack(arrays)
            bar.update(len(batch))
    return shape


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


def _attrs(f: Any, corpus: Corpus, decode: bool) -> None:
    counts = corpus.class_counts()
    f.attrs["fastdata_version"] = 1
    f.attrs["classes"] = np.array(corpus.classes, dtype=h5py.string_dtype())
    f.attrs["class_counts"] = np.array([counts[c] for c in corpus.classes], dtype=np.int64)
    f.attrs["decoded"] = decode
    f.attrs["write_order_seed"] = WRITE_ORDER_SEED


def _read(item: Item) -> bytes:
    try:
        return Path(item.path).read_bytes()
    except FileNotFoundError:
        raise SourceNotFound(f"{item.path}: vanished after the corpus was scanned; run the conversion again") from None
    except PermissionError:
        raise SourceUnreadable(f"{item.path}: permission denied; fix its mode or remove it") from None


def _decode(item: Item, blob: bytes, size: tuple[int, int] | None) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(blob)) as img:
            rgb = img.convert("RGB")
    except Exception as e:
        raise DecodeFailed(
            f"{item.path}: cannot decode as an image ({type(e).__name__}: {e}); remove or replace "
            "the file, or convert without --decode to keep the bytes",
            item.path,
        ) from e
    if size is not None and (rgb.height, rgb.width) != tuple(size):
        rgb = rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


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


def _manifest(
    corpus: Corpus, target: Path, digest: str, nbytes: int, *, decode: bool, shape: tuple[int, int, int] | None
) -> dict[str, Any]:
    n = len(corpus.items)
    image: dict[str, Any] = (
        {"kind": "array", "dtype": "uint8", "shape": list(shape)} if shape is not None else {"kind": "bytes"}
    )
    return {
        "format": "hdf5",
        "version": 1,
        "samples": n,
        "bytes": nbytes,
        "classes": list(corpus.classes),
        "class_counts": corpus.class_counts(),
        "shards": [{"name": target.name, "samples": n, "bytes": nbytes, "sha256": digest}],
        "fields": {"image": image, "label": {"kind": "array", "dtype": "int64", "shape": []}, "key": {"kind": "str"}},
        "decoded": decode,
        "write_order_seed": WRITE_ORDER_SEED,
        "source": corpus.root,
        "problems": list(corpus.problems),
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    _fsync(partial)
    os.replace(partial, path)
