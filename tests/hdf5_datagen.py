"""Small, seeded HDF5 files made by the tests themselves, in every layout the HDF5 backend reads."""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5p, h5s, h5t, h5z

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


# -- every datatype HDF5Dataset reads, and what h5py itself gives for a row --------------------------

KIND_ROWS = 9


def make_kinds(path: str | os.PathLike[str], n: int = KIND_ROWS, seed: int = 0) -> list[str]:
    """A file with one field of each datatype HDF5Dataset reads (``n`` rows each): byte orders, HDF5
    array datatypes, compounds (nested, 2-D, compressed), fixed-length and variable-length strings (1-D
    and 2-D), variable-length bytes and arrays, long double, bool, enum, complex, float16. Returns the
    field names."""
    rng = np.random.default_rng(seed)
    words = ["", "a", "bb", "äöü", "日本", "x" * 20, "end"]

    def text(shape: tuple[int, ...]) -> np.ndarray:
        return np.array([words[k] for k in rng.integers(0, len(words), int(np.prod(shape)))], dtype=object).reshape(
            shape
        )

    point = np.dtype([("x", "<f4"), ("y", ">f4")])
    compound = np.dtype([("a", "<i4"), ("b", ">f8"), ("c", "<f4", (2,)), ("s", "S4"), ("p", point)])
    compound_values = np.zeros(n, dtype=compound)
    compound_values["a"] = rng.integers(-100, 100, n)
    compound_values["b"] = rng.normal(size=n)
    compound_values["c"] = rng.normal(size=(n, 2))
    compound_values["s"] = [bytes(rng.integers(97, 123, int(k)).astype(np.uint8)) for k in rng.integers(0, 5, n)]
    compound_values["p"]["x"], compound_values["p"]["y"] = rng.normal(size=n), rng.normal(size=n)
    with h5py.File(path, "w") as f:
        f.create_dataset("f4_native", data=rng.normal(size=(n, 2)).astype("<f4"), chunks=(4, 2))
        f.create_dataset("f8_big", data=rng.normal(size=n).astype(">f8"))
        f.create_dataset("i4_big_2d", data=rng.integers(-(2**30), 2**30, (n, 3)).astype(">i4"), chunks=(2, 3))
        f.create_dataset(
            "u2_big_gzip", data=rng.integers(0, 2**16, (n, 2)).astype(">u2"), chunks=(3, 2), compression="gzip"
        )
        arr = f.create_dataset("array_f4", (n,), dtype=np.dtype(("<f4", (3,))), chunks=(4,))
        arr[...] = rng.normal(size=(n, 3))
        arr_big = f.create_dataset("array_i2_big", (n,), dtype=np.dtype((">i2", (2, 2))))
        arr_big[...] = rng.integers(-1000, 1000, (n, 2, 2))
        f.create_dataset("compound", data=compound_values)
        f.create_dataset("compound_gzip", data=compound_values, chunks=(4,), compression="gzip")
        f.create_dataset("compound_2d", data=np.stack([compound_values, compound_values[::-1]], axis=1))
        f.create_dataset("fixed_str", data=np.array([w.encode()[:8] for w in text((n,))], dtype="S8"))
        f.create_dataset(
            "fixed_str_2d", data=np.array([w.encode()[:8] for w in text((n * 2,))], dtype="S8").reshape(n, 2)
        )
        f.create_dataset("vlen_str", data=text((n,)), dtype=h5py.string_dtype())
        f.create_dataset("vlen_str_2d", data=text((n, 2)), dtype=h5py.string_dtype(), chunks=(2, 2))
        vbytes = f.create_dataset("vlen_bytes", (n,), dtype=h5py.vlen_dtype(np.uint8))
        vbytes_2d = f.create_dataset("vlen_bytes_2d", (n, 2), dtype=h5py.vlen_dtype(np.uint8))
        vf4 = f.create_dataset("vlen_f4", (n,), dtype=h5py.vlen_dtype(np.dtype("<f4")))
        for i in range(n):
            vbytes[i] = rng.integers(0, 256, int(rng.integers(0, 30))).astype(np.uint8)
            for j in range(2):
                vbytes_2d[i, j] = rng.integers(0, 256, int(rng.integers(0, 5))).astype(np.uint8)
            vf4[i] = rng.normal(size=int(rng.integers(0, 6))).astype("<f4")
        f.create_dataset("longdouble", data=rng.normal(size=n).astype(np.longdouble) / 3)
        f.create_dataset("bool", data=rng.integers(0, 2, n).astype(bool))
        f.create_dataset(
            "enum",
            data=rng.integers(0, 3, n).astype("u1"),
            dtype=h5py.enum_dtype({"r": 0, "g": 1, "b": 2}, basetype="u1"),
        )
        f.create_dataset("complex_big", data=(rng.normal(size=n) + 1j * rng.normal(size=n)).astype(">c16"))
        f.create_dataset("f2", data=rng.normal(size=(n, 2)).astype("<f2"))
        return list(f)


def h5py_value(ds: Any, i: int) -> Any:
    """What HDF5Dataset must give for row ``i`` of the h5py dataset ``ds``: h5py's own ``ds[i]``, with
    variable-length strings decoded (``ds.asstr()[i]``), one-dimensional variable-length ``uint8`` rows as
    ``bytes`` and compounds as dicts of their members."""
    strings = h5py.check_string_dtype(ds.dtype)
    if strings is not None and strings.length is None:
        return ds.asstr()[i]
    value = ds[i]
    vlen = h5py.check_vlen_dtype(ds.dtype)
    if vlen == np.dtype(np.uint8) and ds.ndim == 1:
        return value.tobytes()
    return _dicts(value)


def _dicts(value: Any) -> Any:
    names = getattr(getattr(value, "dtype", None), "names", None)
    return {n: _dicts(value[n]) for n in names} if names else value


def assert_same_value(ours: Any, theirs: Any, where: str = "") -> None:
    """``ours`` equals ``theirs`` exactly: same Python/numpy type, dtype (in native byte order), shape and
    values (NaNs equal)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), where
        for k in theirs:
            assert_same_value(ours[k], theirs[k], f"{where}.{k}")
    elif isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), (where, type(ours))
        assert ours.shape == theirs.shape, where
        assert ours.dtype == theirs.dtype.newbyteorder("=") and ours.dtype.isnative, (where, ours.dtype, theirs.dtype)
        if theirs.dtype.kind == "O":
            for a, b in zip(ours.reshape(-1), theirs.reshape(-1)):
                assert_same_value(a, b, where)
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=where)
    else:
        assert type(ours) is type(theirs), (where, type(ours), type(theirs))
        assert ours == theirs or (ours != ours and theirs != theirs), (where, ours, theirs)


def make_unreadable(path: str) -> None:
    """Fields h5py itself cannot read, or that fastdata refuses, beside a readable ``label``."""
    with h5py.File(path, "w") as f:
        f["label"] = np.arange(4)
        space = h5s.create_simple((4,))
        h5d.create(f.id, b"time32", h5t.UNIX_D32LE, space)  # what PyTables' time32 columns are
        h5d.create(f.id, b"time64", h5t.UNIX_D64LE, space)
        quad = h5t.IEEE_F64LE.copy()
        quad.set_size(16)
        quad.set_precision(128)
        quad.set_fields(127, 112, 15, 0, 112)  # IEEE 754 binary128
        quad.set_ebias(16383)
        h5d.create(f.id, b"quad", quad, space)
        opaque = h5t.create(h5t.OPAQUE, 4)
        opaque.set_tag(b"raw")
        h5d.create(f.id, b"opaque", opaque, space)
        f.create_dataset("refs", (4,), dtype=h5py.ref_dtype)
        f.create_dataset("vlen_in_array", (4,), dtype=np.dtype((h5py.vlen_dtype(np.uint8), (2,))))


def write_with_absent_filter(path: str) -> np.ndarray:
    """A dataset whose chunks are marked as compressed with filter 32001 (Blosc), registered with The HDF
    Group but not installed here: h5py writes the chunks' bytes as they are (write_direct_chunk, filter
    mask 0: "filter applied"), so only a reader that has the filter could read them."""
    assert not h5z.filter_avail(32001), "this test needs a machine without the Blosc filter plugin"
    values = np.arange(8, dtype="<f4")
    with h5py.File(path, "w") as f:
        dcpl = h5p.create(h5p.DATASET_CREATE)
        dcpl.set_chunk((4,))
        dcpl.set_filter(32001, h5z.FLAG_OPTIONAL, (2, 2, 4, 16, 5, 1, 1))
        h5d.create(f.id, b"image", h5t.IEEE_F32LE, h5s.create_simple((8,)), dcpl=dcpl)
        for lo in (0, 4):
            f["image"].id.write_direct_chunk((lo,), values[lo : lo + 4].tobytes(), filter_mask=0)
        f["label"] = np.arange(8)
    return values


def overwrite_in_place(path: str | os.PathLike[str], write: Any) -> None:
    """Rewrite ``path`` the way another process's ``h5py.File(path, "w")`` does (truncated and written
    again: same inode, new size and time), with what ``write(f)`` puts into a fresh HDF5 file. Done through
    plain file writes, since HDF5 will not truncate a file this process has open."""
    fresh = f"{os.fspath(path)}.new"
    with h5py.File(fresh, "w") as f:
        write(f)
    with open(fresh, "rb") as src:
        data = src.read()
    os.remove(fresh)
    with open(path, "r+b") as dst:
        dst.truncate(0)
        dst.write(data)
