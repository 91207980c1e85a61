"""The HDF5 backend of ``fastdata bench``: :class:`~fastdata.HDF5Dataset` over one or many local files.

SPEC: an HDF5 file (``data/train.h5``), a glob or brace pattern of them (``data/*.h5``,
``data/part-{0..7}.hdf5``), or a folder holding ``*.h5`` / ``*.hdf5`` files (what ``fastdata convert
SRC OUT --format hdf5`` writes). Options (``-o KEY=VALUE``): ``fields`` (a list, or names separated by
commas; default ``image,label`` when the file has both, else every dataset of the most common length),
``decode`` ("raw", "pil", "numpy", "torch"; default "raw"), ``on_error``, ``seed``, ``rdcc_nbytes``,
``rdcc_nslots``, ``rdcc_w0``, ``max_open``. The sweep reads with the dataset's own sampler and
``collate_fn`` (``ds.collate``).
"""

from __future__ import annotations

import builtins
import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from braceexpand import braceexpand

from fastdata.bench.backends import require
from fastdata.core.errors import ConfigError

require("h5py", extra="hdf5")

NAME = "hdf5"
PRIORITY = 20
EXTRA = "hdf5"
# small images (CIFAR-sized) are what HDF5 files of arrays usually hold; such samples are cheap, so
# batches are larger than the tar demo's
DEMO_BATCH_SIZE = 256
DEMO_OPTIONS: dict[str, Any] = {}
DEMO_SAMPLES = 16_384
DEMO_SHAPE = (32, 32, 3)

EXTENSIONS = (".h5", ".hdf5", ".he5", ".hdf")
SIGNATURE = b"\x89HDF\r\n\x1a\n"
# HDF5 puts its signature at 0, or after a user block of 512 bytes, 1 KiB, 2 KiB ... (powers of two)
SIGNATURE_OFFSETS = (0, 512, 1024, 2048)

_OPTIONS = {"fields", "decode", "on_error", "seed", "rdcc_nbytes", "rdcc_nslots", "rdcc_w0", "max_open"}


def _first(spec: str) -> str:
    return next(iter(braceexpand(spec)), spec)


def _has_signature(path: str) -> bool:
    try:
        with builtins.open(path, "rb") as f:  # this module's open() is the backend's
            head = f.read(SIGNATURE_OFFSETS[-1] + len(SIGNATURE))
    except OSError:
        return False
    return any(head[o : o + len(SIGNATURE)] == SIGNATURE for o in SIGNATURE_OFFSETS)


def _files_in(folder: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file())


def detect(spec: str) -> bool:
    """A name ending in ``.h5``/``.hdf5``/``.he5``/``.hdf`` (after brace expansion; also on ``s3://``, so
    that such a SPEC gets HDF5Dataset's "local files only" advice), a local file that starts with HDF5's
    signature, or a local folder holding such files."""
    first = _first(spec)
    if first.lower().endswith(EXTENSIONS):
        return True
    if "://" in spec:
        return False
    if os.path.isdir(spec):
        return bool(_files_in(spec))
    return os.path.isfile(first) and _has_signature(first)


def _paths(spec: str) -> str | list[str]:
    if "://" not in spec and os.path.isdir(spec):
        files = _files_in(spec)
        if not files:
            raise ConfigError(f"{spec}: the folder has no HDF5 files ({', '.join(EXTENSIONS)})")
        return files
    return spec


def default_fields(path: str) -> tuple[str, ...]:
    """The fields to read when none are named: ``image`` and ``label`` when the file has both (the
    layout ``fastdata convert --format hdf5`` writes), else every dataset of rows (at any depth) of the
    length most datasets share."""
    import h5py

    lengths: dict[str, int] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.ndim >= 1:
            lengths[name] = int(obj.shape[0])

    try:
        with h5py.File(path, "r") as f:
            f.visititems(visit)
    except OSError:
        return ("image", "label")  # a missing or damaged file: HDF5Dataset's error names it and the fix
    if "image" in lengths and lengths.get("label") == lengths["image"]:
        return ("image", "label")
    if not lengths:
        raise ConfigError(f"{path}: the file holds no datasets of rows; is it a fastdata-readable HDF5 file?")
    # the length most datasets share; ties go to the longer
    length = max(Counter(lengths.values()).items(), key=lambda kv: (kv[1], kv[0]))[0]
    return tuple(name for name, n in lengths.items() if n == length)


def open(spec: str, **options: Any) -> Any:
    """A :class:`~fastdata.HDF5Dataset` over the file(s) of ``spec``."""
    import fastdata as fd
    from fastdata.storage import expand_urls, scheme

    unknown = set(options) - _OPTIONS
    if unknown:
        raise ConfigError(
            f"hdf5 backend: unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_OPTIONS))}"
        )
    paths = _paths(spec)
    fields = options.pop("fields", None)
    if isinstance(fields, str):
        fields = [f.strip() for f in fields.split(",") if f.strip()]
    if fields is None:
        first = paths[0] if isinstance(paths, list) else expand_urls(paths)[0]
        if scheme(first):  # HDF5Dataset says what to do about a remote file
            return fd.HDF5Dataset(paths, **options)
        fields = default_fields(first)
    return fd.HDF5Dataset(paths, tuple(fields), **options)


def write_demo_file(
    path: Path, *, samples: int = DEMO_SAMPLES, shape: tuple[int, ...] = DEMO_SHAPE, seed: int = 0
) -> str:
    """One HDF5 file of ``samples`` uint8 images of ``shape`` and int64 labels, in the layout
    ``fastdata convert --format hdf5 --decode`` writes (uncompressed chunks of about 1 MiB)."""
    import h5py

    rng = np.random.default_rng(seed)
    row = int(np.prod(shape))
    chunk_rows = max(1, min(samples, (1 << 20) // row))
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        images = f.create_dataset("image", (samples, *shape), dtype=np.uint8, chunks=(chunk_rows, *shape))
        for start in range(0, samples, chunk_rows):  # a chunk at a time: memory stays small
            n = min(chunk_rows, samples - start)
            images[start : start + n] = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        f.create_dataset("label", data=rng.integers(0, 10, samples).astype(np.int64))
    return str(path)


@contextlib.contextmanager
def demo(folder: Path, scale: float = 1.0) -> Iterator[str]:
    """16384 CIFAR-sized images (32x32x3 uint8) and labels in one file, about 50 MB (``scale`` times as
    many)."""
    yield write_demo_file(Path(folder) / "demo.h5", samples=max(256, round(DEMO_SAMPLES * scale)))
