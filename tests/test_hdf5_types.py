"""Every HDF5 datatype HDF5Dataset reads gives exactly what h5py's ``ds[i]`` gives (byte order made native,
compounds as dicts, variable-length strings decoded), through real DataLoader workers; the datatypes it
cannot read are refused when the dataset is built, naming the file, field, datatype and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import fastdata as fd
from fastdata.core.errors import FastdataError
from fastdata.formats.hdf5._reader import BadLayout
from tests.hdf5_datagen import (
    KIND_ROWS,
    assert_same_value,
    h5py_value,
    make_kinds,
    make_unreadable,
    write_with_absent_filter,
)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    path = str(tmp_path_factory.mktemp("kinds") / "kinds.h5")
    return path, make_kinds(path)


def expected_rows(path: str, fields: list[str]) -> list[dict[str, Any]]:
    with h5py.File(path, "r") as f:
        return [{name: h5py_value(f[name], i) for name in fields} for i in range(KIND_ROWS)]


@pytest.mark.parametrize(
    ("workers", "context", "collate_fn"),
    [
        (0, None, list),
        (2, "fork", list),
        (2, "fork", lambda b: b),  # the batch object itself crosses from the worker (compound rows unbuilt)
        pytest.param(2, "spawn", list, marks=pytest.mark.slow),
    ],
)
def test_every_datatype_reads_as_h5py_reads_it(
    kinds: tuple[str, list[str]], workers: int, context: str | None, collate_fn: Any
) -> None:
    path, fields = kinds
    ds = fd.HDF5Dataset(path, fields)
    loader = DataLoader(
        ds,
        batch_size=4,
        sampler=ds.sampler(shuffle=True, remainder="uneven"),
        collate_fn=collate_fn,
        num_workers=workers,
        multiprocessing_context=context,
        timeout=60 if workers else 0,
    )
    expected = expected_rows(path, fields)
    seen = []
    for batch in loader:
        for sample in batch:
            i = sample["__index__"]
            seen.append(i)
            for name in fields:
                assert_same_value(sample[name], expected[i][name], f"{name}[{i}]")
    assert sorted(seen) == list(range(KIND_ROWS))


def test_rows_in_any_order_and_repeated_match_h5py(kinds: tuple[str, list[str]]) -> None:
    # sorted, reversed and repeated rows take the other read paths (point selections, one read per run)
    path, fields = kinds
    ds = fd.HDF5Dataset(path, fields)
    expected = expected_rows(path, fields)
    for rows in ([8, 0, 3, 3, 7], [1, 2, 3, 4], [5], list(range(KIND_ROWS))[::-1]):
        for sample, i in zip(ds.__getitems__(rows), rows):
            for name in fields:
                assert_same_value(sample[name], expected[i][name], f"{name}[{i}]")


def test_fields_come_back_native_and_as_documented(kinds: tuple[str, list[str]]) -> None:
    path, fields = kinds
    ds = fd.HDF5Dataset(path, fields)
    info = {f.name: f for f in ds.infos[0].fields}  # type: ignore[union-attr]
    assert info["f4_native"].direct and not info["f8_big"].direct  # big-endian goes through HDF5, converted
    assert info["compound"].kind == "compound" and info["compound"].direct is False  # a big-endian member
    assert (info["array_f4"].row_shape, info["array_f4"].dtype) == ((3,), np.dtype("<f4"))
    assert info["array_f4"].direct  # an HDF5 array of native floats: read straight from the file
    assert (info["vlen_str_2d"].kind, info["vlen_str_2d"].row_shape) == ("str", (2,))
    sample = ds[2]
    assert isinstance(sample["vlen_str"], str) and isinstance(sample["vlen_bytes"], bytes)
    assert sample["f8_big"].dtype.isnative and sample["i4_big_2d"].dtype == np.dtype("=i4")
    assert set(sample["compound"]) == {"a", "b", "c", "s", "p"} and set(sample["compound"]["p"]) == {"x", "y"}


def test_collate_batches_every_datatype(kinds: tuple[str, list[str]]) -> None:
    path, fields = kinds
    ds = fd.HDF5Dataset(path, fields)
    rows = [6, 1, 4]
    batch = ds.__getitems__(rows)
    ours = ds.collate(batch)
    with h5py.File(path, "r") as f:
        for name in ("f4_native", "f8_big", "i4_big_2d", "array_f4", "array_i2_big", "bool", "complex_big", "f2"):
            theirs = torch.from_numpy(
                np.stack([np.asarray(f[name][i]) for i in rows]).astype(f[name].dtype.base.newbyteorder("="))
            )
            assert torch.equal(ours[name], theirs), name
        compound, records = ours["compound"], np.stack([f["compound"][i] for i in rows])
        assert torch.equal(compound["b"], torch.from_numpy(records["b"].astype("=f8")))
        assert torch.equal(compound["p"]["y"], torch.from_numpy(records["p"]["y"].astype("=f4")))
        assert compound["s"] == list(records["s"])
        assert ours["vlen_str_2d"][0].tolist() == f["vlen_str_2d"].asstr()[6].tolist()
        longdouble = ours["longdouble"]  # torch has no long double: the numpy column
        assert isinstance(longdouble, np.ndarray) and longdouble.dtype == np.longdouble
        np.testing.assert_array_equal(longdouble, [f["longdouble"][i] for i in rows])
        np.testing.assert_array_equal(ours["fixed_str_2d"], [f["fixed_str_2d"][i] for i in rows])
    assert [len(v) for v in ours["vlen_f4"]] == [len(s["vlen_f4"]) for s in batch]  # unequal lengths: a list
    # where default_collate can batch a field, collate gives the same
    plain = [s for s in batch]
    for name in ("compound", "fixed_str", "vlen_str", "vlen_bytes", "enum"):
        assert_collated_equal(ours[name], default_collate([s[name] for s in plain]), name)


def assert_collated_equal(ours: Any, theirs: Any, where: str) -> None:
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        for k in theirs:
            assert_collated_equal(ours[k], theirs[k], f"{where}.{k}")
    elif isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), where
    else:
        assert ours == theirs, where


def test_collate_fn_ds_collate_through_workers(kinds: tuple[str, list[str]]) -> None:
    path, fields = kinds
    ds = fd.HDF5Dataset(path, fields)
    loader = DataLoader(ds, batch_size=3, collate_fn=ds.collate, num_workers=2, timeout=60)
    batches = list(loader)
    assert sum(len(b["__index__"]) for b in batches) == KIND_ROWS
    assert isinstance(batches[0]["compound"]["a"], torch.Tensor)


# -- refused at construction -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("time32", r"field 'time32' has an HDF5 time datatype that h5py cannot read .*PyTables.*int64 or float64"),
        ("time64", r"field 'time64' has an HDF5 time datatype"),
        ("quad", r"field 'quad' has an HDF5 float datatype .*128-bit float .*quadruple.* float64"),
        ("opaque", r"field 'opaque' holds HDF5 opaque data \(4 bytes a row, tag 'raw'"),
        ("refs", r"field 'refs' holds HDF5 object or region references .*dereference them"),
        ("vlen_in_array", r"field 'vlen_in_array' holds an HDF5 array datatype of variable-length elements"),
    ],
)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_unreadable_datatypes_are_refused_at_construction(
    tmp_path: Path, field: str, message: str, on_error: str
) -> None:
    path = str(tmp_path / "odd.h5")
    make_unreadable(path)
    # UnsupportedField: a FastdataError and a TypeError (h5py's own error for these is a bare TypeError)
    with pytest.raises(TypeError, match=rf"odd\.h5: {message}") as caught:
        fd.HDF5Dataset(path, (field, "label"), on_error=on_error)  # type: ignore[arg-type]
    assert isinstance(caught.value, FastdataError) and type(caught.value).__name__ == "UnsupportedField"
    assert fd.HDF5Dataset(path, ("label",))[3]["label"] == 3


def test_a_filter_that_is_not_installed_is_named_with_the_fix(tmp_path: Path) -> None:
    path = str(tmp_path / "blosc.h5")
    write_with_absent_filter(path)
    with h5py.File(path, "r") as f, pytest.raises(OSError):
        f["image"][0]  # h5py cannot read it either
    with pytest.raises(
        FastdataError,
        match=r"blosc\.h5: field 'image' \(float32\) cannot be read: it is compressed with HDF5 filter 32001 "
        r"\(blosc\), which is not available in this process: pip install hdf5plugin, and import hdf5plugin",
    ):
        fd.HDF5Dataset(path, ("image", "label"), on_error="skip")
    assert fd.HDF5Dataset(path, ("label",))[7]["label"] == 7


def test_null_dataspace_is_a_layout_error(tmp_path: Path) -> None:
    path = str(tmp_path / "null.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("nothing", data=h5py.Empty("f4"))
    with pytest.raises(BadLayout, match=r"null\.h5: field 'nothing' has a null dataspace"):
        fd.HDF5Dataset(path, ("nothing",))


def test_a_row_unreadable_for_want_of_a_filter_names_the_filter(tmp_path: Path) -> None:
    # what a worker says when the filter the main process had is missing in it (a spawn worker whose
    # script did not import hdf5plugin): the field was described elsewhere, its rows fail here
    from fastdata.formats.hdf5._handle import H5Handle, row_error
    from fastdata.formats.hdf5._reader import ChunkCache, CorruptHDF5, FieldInfo, FileInfo, file_identity

    path = str(tmp_path / "blosc.h5")
    write_with_absent_filter(path)
    field = FieldInfo("image", "array", np.dtype("<f4"), (), 4, 4, False, filters=((32001, "blosc"),))
    handle = H5Handle(FileInfo(path, 8, (field,), file_identity(path)), ChunkCache())
    try:
        error = row_error(handle, field, 5, 5, "HDF5 cannot read it (OSError: ...)")
    finally:
        handle.close()
    assert isinstance(error, CorruptHDF5)
    assert "blosc.h5: field 'image', row 5 (dataset index 5)" in str(error)
    assert "filter 32001 (blosc), which is not available in this process: pip install hdf5plugin" in str(error)
    assert "damaged" not in str(error)
