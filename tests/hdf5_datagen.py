"""Small, seeded HDF5 files made by the tests themselves, in every layout the HDF5 backend reads."""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

IMAGE_SHAPE = (4, 5, 3)


def make_h5(
    path: str | os.PathLike[str],
    n: int,
    *,
    first_key: int = 0,
    seed: int = 0,
    chunks: int | None = 4,
    compression: str | None = None,
    blob: bool = True,
) -> dict[str, Any]:
    """An HDF5 file of ``n`` samples: ``image`` (n, 4, 5, 3) uint8, ``label`` int64, ``key`` int64 (unique
    over files: ``first_key + i``) and, with ``blob``, ``blob`` variable-length uint8 rows.

    Args:
        chunks: rows per chunk of ``image``; None stores it contiguously.
        compression: e.g. ``"gzip"`` for ``image`` (needs ``chunks``).

    Returns:
        What was written, field by field (numpy arrays; a list of bytes for ``blob``).
    """
    rng = np.random.default_rng(seed)
    data: dict[str, Any] = {
        "image": rng.integers(0, 256, (n, *IMAGE_SHAPE), dtype=np.uint8),
        "label": rng.integers(0, 10, n).astype(np.int64),
        "key": np.arange(first_key, first_key + n, dtype=np.int64),
    }
    if blob:
        data["blob"] = [rng.bytes(int(rng.integers(0, 40))) for _ in range(n)]
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "image",
            data=data["image"],
            chunks=(min(chunks, n), *IMAGE_SHAPE) if chunks else None,
            compression=compression,
        )
        f.create_dataset("label", data=data["label"])
        f.create_dataset("key", data=data["key"], chunks=(min(3, n),))
        if blob:
            ds = f.create_dataset("blob", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(min(5, n),))
            for i, b in enumerate(data["blob"]):
                ds[i] = np.frombuffer(b, dtype=np.uint8)
    return data


def make_files(
    folder: str | os.PathLike[str],
    sizes: tuple[int, ...] = (11, 13, 9),
    seed: int = 0,
) -> tuple[list[str], dict[str, Any]]:
    """Files of ``sizes`` samples in three layouts (chunked, contiguous, gzip-compressed chunks), with
    keys running over all of them; returns the paths and every field concatenated over the files."""
    layouts: list[dict[str, Any]] = [{"chunks": 4}, {"chunks": None}, {"chunks": 3, "compression": "gzip"}]
    paths: list[str] = []
    parts: list[dict[str, Any]] = []
    first = 0
    for k, n in enumerate(sizes):
        path = os.path.join(folder, f"part-{k}.h5")
        parts.append(make_h5(path, n, first_key=first, seed=seed + k, **layouts[k % len(layouts)]))
        paths.append(path)
        first += n
    every = {
        name: (np.concatenate([p[name] for p in parts]) if name != "blob" else [b for p in parts for b in p[name]])
        for name in parts[0]
    }
    return paths, every
