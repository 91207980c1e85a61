"""`fastdata inspect` on HDF5 files that are healthy but unusual: scalar, empty and null-dataspace
datasets, datatypes HDF5Dataset refuses, a missing compression filter, external links (working and
broken). It must report them, never crash."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from fastdata.cli import main
from fastdata.inspection._media import inspect_hdf5
from tests.hdf5_datagen import make_unreadable, write_with_absent_filter


def test_scalar_empty_and_null_datasets_are_listed_not_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        f["label"] = np.arange(5)
        f["scale"] = 2.5
        f.create_dataset("nothing", data=h5py.Empty("f4"))
        f.create_dataset("none_yet", (0, 3), dtype="f4", maxshape=(None, 3))
        f["label"].attrs["unit"] = "class"
    report = inspect_hdf5(str(path))
    fields = report.details["fields"]
    assert fields["nothing"]["shape"] is None and fields["nothing"]["length"] is None
    assert fields["scale"]["shape"] == [] and fields["none_yet"]["length"] == 0
    assert fields["label"]["attrs"] == {"unit": "class"}
    assert "scalar or null-dataspace datasets (not fields): 'nothing', 'scale'" in report.notes
    assert main(["inspect", str(path)]) == 1  # 'none_yet' (0 rows) and 'label' (5) differ in length
    out = capsys.readouterr().out
    assert "field nothing: null dataspace float32" in out and "field scale: scalar float64" in out
    assert main(["inspect", str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["files"][0]["details"]["fields"]["nothing"]["shape"] is None


def test_unreadable_datatypes_and_missing_filters_are_noted_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd, blosc = tmp_path / "types.h5", tmp_path / "blosc.h5"
    make_unreadable(str(odd))
    write_with_absent_filter(str(blosc))
    report = inspect_hdf5(str(odd))
    fields = report.details["fields"]
    assert fields["time32"]["dtype"].startswith("unreadable by h5py") and fields["quad"]["length"] == 4
    notes = "\n".join(report.notes)
    for name in ("time32", "time64", "quad", "opaque", "refs", "vlen_in_array"):
        assert f"field {name!r} cannot be read by HDF5Dataset" in notes, name
    assert "'label'" not in notes
    filtered = inspect_hdf5(str(blosc))
    assert any("filter 32001 (blosc)" in n and "pip install hdf5plugin" in n for n in filtered.notes)
    assert main(["inspect", str(tmp_path)]) == 0
    assert "cannot be read by HDF5Dataset" in capsys.readouterr().out


def test_external_links_are_followed_and_broken_ones_noted(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["frames"] = np.zeros((6, 2, 2), np.uint16)
    with h5py.File(tmp_path / "master.h5", "w") as f:
        f["entry/frames"] = h5py.ExternalLink("data.h5", "/frames")
        f["entry/lost"] = h5py.ExternalLink("gone.h5", "/frames")
        f["entry/alias"] = h5py.SoftLink("/entry/nowhere")
    report = inspect_hdf5(str(tmp_path / "master.h5"))
    frames = report.details["fields"]["entry/frames"]
    assert frames["shape"] == [6, 2, 2] and frames["linked_file"] == str(tmp_path / "data.h5")
    assert report.samples == 6
    assert "broken link: 'entry/lost' -> gone.h5:/frames (a link to nothing)" in report.notes
    assert "broken link: 'entry/alias' -> /entry/nowhere (a link to nothing)" in report.notes
