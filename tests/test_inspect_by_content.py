"""``fastdata inspect`` tells files by their content (magic bytes), as the datasets read them, not by
their suffix: a netCDF-4 file (``.nc``) and an AnnData-named file (``.h5ad``) are HDF5 inside, an
``.m4a`` is an MP4 container, compressed tars and files without a telling name are what their bytes
are. Before, each was refused: "cannot inspect this kind of file"."""

from __future__ import annotations

import gzip
import lzma
import shutil
from pathlib import Path

import numpy as np
import pytest

from fastdata.cli import main
from fastdata.inspection import inspect_paths
from fastdata.inspection._sniff import sniff
from tests.datagen import make_shards
from tests.videogen import make_videos


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import av
    import netCDF4
    import tables

    root = tmp_path_factory.mktemp("by-content")
    with netCDF4.Dataset(root / "series.nc", "w") as nc:
        nc.createDimension("obs", 5)
        nc.createVariable("value", np.float32, ("obs",))[:] = np.arange(5)
    with tables.open_file(str(root / "cells.h5ad"), "w") as f:  # HDF5 under AnnData's suffix
        f.create_array("/", "X", np.ones((4, 3), dtype=np.float32))
    shard = make_shards(root / "made", shards=1, per_shard=3)[0]
    shutil.copy(shard, root / "shard.bin")  # a tar without a telling name
    (root / "shard.tar.xz").write_bytes(lzma.compress(Path(shard).read_bytes()))
    (root / "shard.data").write_bytes(gzip.compress(Path(shard).read_bytes()))
    shutil.rmtree(root / "made")
    video = make_videos(root / "v", count=1, frames=12)[0]
    shutil.move(video, root / "clip.dat")
    shutil.rmtree(root / "v")
    with av.open(str(root / "tone.m4a"), "w") as container:  # audio only, in an MP4 container
        stream = container.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    (root / "notes.xyz").write_bytes(b"not data\n" * 100)
    return root


def test_the_sniffer_tells_each_file_by_its_bytes(folder: Path) -> None:
    kinds = {p.name: sniff(str(p)) for p in folder.iterdir()}
    assert kinds == {
        "series.nc": "hdf5",
        "cells.h5ad": "hdf5",
        "shard.bin": "tar",
        "shard.tar.xz": "tar",
        "shard.data": "tar",
        "clip.dat": "video",
        "tone.m4a": "video",
        "notes.xyz": None,
    }


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("series.nc", "hdf5"), ("cells.h5ad", "hdf5"), ("shard.bin", "tar"), ("shard.data", "tar"), ("clip.dat", "video")],
)
def test_each_file_is_inspected_as_what_it_is(folder: Path, name: str, fmt: str) -> None:
    report = inspect_paths(str(folder / name))
    (only,) = report["files"]
    assert only["format"] == fmt
    if fmt == "tar":
        assert only["samples"] == 3 and only["complete"]
    elif fmt == "video":
        assert only["samples"] == 12
    else:
        assert only["samples"] in (4, 5)


def test_a_folder_walk_finds_them_all_and_leaves_other_files_alone(folder: Path, capsys: pytest.CaptureFixture) -> None:
    report = inspect_paths(str(folder))
    found = {Path(f["url"]).name: f["format"] for f in report["files"]}
    assert found == {
        "series.nc": "hdf5",
        "cells.h5ad": "hdf5",
        "shard.bin": "tar",
        "shard.tar.xz": "tar",
        "shard.data": "tar",
        "clip.dat": "video",
        "tone.m4a": "video",
    }
    audio = next(f for f in report["files"] if f["url"].endswith("tone.m4a"))
    assert any("no video stream" in line for line in audio["bad"])  # said, not refused
    assert main(["inspect", str(folder / "notes.xyz")]) == 2
    assert "cannot inspect this kind of file: by its first bytes it is no tar shard" in capsys.readouterr().err
