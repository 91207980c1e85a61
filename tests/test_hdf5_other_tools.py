"""HDF5 files written by other tools, and damaged ones: ragged numeric rows written by netCDF4
(``createVLType``) and PyTables (``VLArray``) collate as lists, as docs/hdf5.md promises, whether the
batch carries whole columns or not (a transform, no fixed-size field); photos of different sizes decoded
from byte fields stop with ``CannotBatch``; one flipped bit in an object header is ``CorruptHDF5``
naming the file at construction, not h5py's bare ``RuntimeError``."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import CannotBatch
from fastdata.formats.hdf5 import CorruptHDF5
from tests.photogen import make_photo_folder

ROWS = 10


def keep(sample: dict) -> dict:
    return sample  # a transform that keeps the sample a dict of its fields


@pytest.fixture(scope="module")
def netcdf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A netCDF-4 file (HDF5 inside) with a variable-length float32 variable and an int64 label."""
    import netCDF4

    path = str(tmp_path_factory.mktemp("nc") / "series.nc")
    with netCDF4.Dataset(path, "w") as nc:
        ragged = nc.createVLType(np.float32, "ragged")
        nc.createDimension("obs", ROWS)
        series = nc.createVariable("series", ragged, ("obs",))
        label = nc.createVariable("label", np.int64, ("obs",))
        for i in range(ROWS):
            series[i] = np.arange(i + 1, dtype=np.float32)
            label[i] = i
    return path


@pytest.fixture(scope="module")
def pytables(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PyTables file with a VLArray of int32 tokens."""
    import tables

    path = str(tmp_path_factory.mktemp("pt") / "tokens.h5")
    with tables.open_file(path, "w") as f:
        tokens = f.create_vlarray("/", "tokens", tables.Int32Atom())
        for i in range(ROWS):
            tokens.append(np.arange(i + 2, dtype=np.int32))
        f.create_array("/", "label", np.arange(ROWS, dtype=np.int64))
    return path


@pytest.mark.parametrize("tool", ["netcdf", "pytables"])
@pytest.mark.parametrize("how", ["with label", "alone", "transformed"])
def test_ragged_rows_written_by_other_tools_collate_as_lists(
    tool: str, how: str, request: pytest.FixtureRequest
) -> None:
    path = request.getfixturevalue(tool)
    field = "series" if tool == "netcdf" else "tokens"
    fields = (field, "label") if how == "with label" else (field,)
    ds = fd.HDF5Dataset(path, fields, transform=keep if how == "transformed" else None)
    batch = next(iter(DataLoader(ds, batch_size=4, collate_fn=ds.collate)))
    rows = batch[field]
    assert isinstance(rows, list) and [len(r) for r in rows] == [i + (1 if tool == "netcdf" else 2) for i in range(4)]
    assert torch.equal(batch["__index__"], torch.arange(4))


def test_ragged_rows_through_the_loaders_workers(netcdf: str) -> None:
    ds = fd.HDF5Dataset(netcdf, ("series",))
    with fd.Loader(ds, batch_size=5, num_workers=2, shuffle=False) as loader:
        batches = list(loader)
    lengths = sorted(len(r) for b in batches for r in b["series"])
    assert lengths == list(range(1, ROWS + 1))


def test_photos_of_different_sizes_in_hdf5_stop_with_the_fixes(tmp_path: Path) -> None:
    from fastdata.convert import convert

    make_photo_folder(tmp_path / "photos", count=6)
    convert(str(tmp_path / "photos"), str(tmp_path / "h5"), format="hdf5", progress=False, fsync=False)
    ds = fd.HDF5Dataset(tmp_path / "h5", ("image", "label"), decode="torch")
    with pytest.raises(CannotBatch, match=r"cannot batch key 'image': sample at index \d+ has shape \[3, "):
        next(iter(DataLoader(ds, batch_size=4, collate_fn=ds.collate)))
    sized = fd.HDF5Dataset(tmp_path / "h5", ("image", "label"), decode=fd.Decoder("torch", size=(32, 40)))
    batch = next(iter(DataLoader(sized, batch_size=4, collate_fn=sized.collate)))
    assert batch["image"].shape == (4, 3, 32, 40)


def _flipped_header(tmp_path: Path) -> Path:
    """A file (HDF5's newest format: object headers with signatures) with one bit of the image
    dataset's object header version flipped."""
    path = tmp_path / "flipped.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f["image"] = np.zeros((8, 4, 4, 3), dtype=np.uint8)
        f["label"] = np.arange(8)
        header = h5py.h5o.get_info(f["image"].id).addr
    data = bytearray(path.read_bytes())
    assert data[header : header + 4] == b"OHDR"
    data[header + 4] ^= 1  # the version byte
    path.write_bytes(data)
    return path


def test_a_flipped_bit_in_an_object_header_is_corrupt_hdf5_naming_the_file(tmp_path: Path) -> None:
    path = _flipped_header(tmp_path)
    with pytest.raises(CorruptHDF5, match=rf"^{path}: HDF5 cannot read the file's metadata .*re-create it") as caught:
        fd.HDF5Dataset(path, ("image", "label"))
    assert caught.value.source == str(path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        skipped = fd.HDF5Dataset([path, path], ("image", "label"), on_error="skip")
    assert len(skipped) == 0 and skipped.skipped == 2
    assert any(str(path) in str(w.message) for w in seen)


def _pandas_like(path: Path, layout: str) -> str:
    """The HDF5 layout pandas' ``DataFrame.to_hdf(path, key="obs", format=layout)`` writes through
    PyTables, written with PyTables itself (the attributes and names pandas uses)."""
    import tables

    with tables.open_file(str(path), "w") as f:
        group = f.create_group("/", "obs")
        if layout == "table":
            group._v_attrs.pandas_type = "frame_table"
            rows = np.zeros(ROWS, dtype=[("index", "<i8"), ("values_block_0", "<f8", (2,))])
            rows["index"] = np.arange(ROWS)
            rows["values_block_0"] = np.arange(2 * ROWS, dtype=np.float64).reshape(ROWS, 2)
            f.create_table(group, "table", rows)
        else:
            group._v_attrs.pandas_type = "frame"
            f.create_array(group, "axis0", np.array([b"a", b"b"]))  # the column names
            f.create_array(group, "axis1", np.arange(ROWS))  # the index
            f.create_array(group, "block0_items", np.array([b"a", b"b"]))
            f.create_array(group, "block0_values", np.arange(2 * ROWS, dtype=np.float64).reshape(ROWS, 2))
    return str(path)


@pytest.mark.parametrize("layout", ["fixed", "table"])
def test_inspect_reads_pandas_layouts_and_names_the_fields(tmp_path: Path, layout: str) -> None:
    import subprocess
    import sys

    path = _pandas_like(tmp_path / f"{layout}.h5", layout)
    run = subprocess.run([sys.executable, "-m", "fastdata", "inspect", path], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{ROWS} samples" in run.stdout and "0 bad" in run.stdout
    assert f"pandas frame saved with format='{layout}'" in run.stdout
    fields = ("obs/table",) if layout == "table" else ("obs/axis1", "obs/block0_values")
    assert f"HDF5Dataset(fields={fields!r})" in run.stdout
    ds = fd.HDF5Dataset(path, fields=fields)
    assert len(ds) == ROWS
