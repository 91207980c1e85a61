"""convert_hdf5: a small-file corpus to one HDF5 file and its manifest; atomic, restartable after a kill."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from PIL import Image

import fastdata as fd
from fastdata.convert.corpus import scan_corpus
from fastdata.convert.hdf5 import WRITE_ORDER_SEED, convert_hdf5
from fastdata.core.errors import ConfigError, DecodeFailed
from fastdata.formats.manifest import read_manifest, sample_counts
from tests.datagen import jpeg_bytes, make_image_folder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("corpus")
    make_image_folder(src, classes=3, per_class=5, seed=1)
    return src


def read_all(path: Path, fields: tuple[str, ...] = ("image", "label", "key"), **kw: Any) -> list[dict[str, Any]]:
    ds = fd.HDF5Dataset(str(path), fields, **kw)
    samples = list(ds.__getitems__(list(range(len(ds)))))
    ds.close()
    return samples


def test_round_trip_keeps_every_file_its_bytes_and_label(corpus_dir: Path, tmp_path: Path) -> None:
    manifest = convert_hdf5(scan_corpus(corpus_dir), str(tmp_path / "out"), decode=False, size=None, progress=False)
    h5 = tmp_path / "out" / "data.h5"
    samples = read_all(h5)
    relpaths = sorted(str(p.relative_to(corpus_dir)) for p in corpus_dir.rglob("*.jpg"))
    # every file exactly once, in the documented shuffled order
    order = np.random.default_rng(WRITE_ORDER_SEED).permutation(len(relpaths))
    assert [s["key"] for s in samples] == [relpaths[i] for i in order]
    for s in samples:
        assert s["image"] == (corpus_dir / s["key"]).read_bytes()
        assert s["label"] == int(s["key"].split("/")[0].split("_")[1])
    # the manifest beside the file, in the layout fastdata.formats.manifest reads
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == manifest
    assert read_manifest(str(tmp_path / "out")) == manifest
    assert manifest["format"] == "hdf5" and manifest["samples"] == 15 and manifest["decoded"] is False
    assert manifest["classes"] == ["class_0", "class_1", "class_2"]
    assert manifest["class_counts"] == {"class_0": 5, "class_1": 5, "class_2": 5}
    shard = manifest["shards"][0]
    assert shard["name"] == "data.h5" and shard["samples"] == 15 and shard["bytes"] == h5.stat().st_size
    assert shard["sha256"] == hashlib.sha256(h5.read_bytes()).hexdigest()
    assert sample_counts([str(h5)]) == {str(h5): 15}
    with h5py.File(h5, "r") as f:
        assert list(f.attrs["classes"]) == manifest["classes"]
        assert f.attrs["class_counts"].tolist() == [5, 5, 5]
        assert f["label"].dtype == np.int64 and h5py.check_vlen_dtype(f["image"].dtype) == np.uint8
    assert not list((tmp_path / "out").glob("*.partial"))


def test_decode_and_resize_to_fixed_shape(corpus_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "decoded.h5"  # a file name: the manifest goes beside it
    manifest = convert_hdf5(scan_corpus(corpus_dir), str(out), decode=True, size=(6, 10), progress=False)
    assert manifest["fields"]["image"] == {"kind": "array", "dtype": "uint8", "shape": [6, 10, 3]}
    assert (tmp_path / "manifest.json").exists()
    samples = read_all(out)
    for s in samples:
        with Image.open(corpus_dir / s["key"]) as img:
            expected = np.asarray(img.convert("RGB").resize((10, 6), Image.Resampling.BILINEAR))
        np.testing.assert_array_equal(s["image"], expected)
        assert s["image"].dtype == np.uint8


def test_decode_without_size_keeps_a_common_size_and_refuses_mixed_ones(corpus_dir: Path, tmp_path: Path) -> None:
    convert_hdf5(scan_corpus(corpus_dir), str(tmp_path / "same"), decode=True, size=None, progress=False)
    assert read_all(tmp_path / "same" / "data.h5")[0]["image"].shape == (24, 32, 3)
    mixed = tmp_path / "mixed"
    make_image_folder(mixed, classes=1, per_class=3, seed=2)
    (mixed / "class_0" / "img_9999.jpg").write_bytes(jpeg_bytes(np.random.default_rng(0), (8, 8)))
    with pytest.raises(ConfigError, match=r"img_9999\.jpg: image is 8x8, the first is 24x32; .*--size HxW"):
        convert_hdf5(scan_corpus(mixed), str(tmp_path / "out"), decode=True, size=None, progress=False)
    assert not (tmp_path / "out" / "data.h5").exists() and not list((tmp_path / "out").glob("*.partial"))


def test_size_needs_decode(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pass decode=True"):
        convert_hdf5(scan_corpus(corpus_dir), str(tmp_path), decode=False, size=(8, 8), progress=False)


def test_corrupt_image_named_and_nothing_left_behind(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_image_folder(src, classes=2, per_class=2)
    (src / "class_1" / "img_0001.jpg").write_bytes(b"not a jpeg at all")
    with pytest.raises(DecodeFailed, match=r"class_1/img_0001\.jpg: cannot decode as an image"):
        convert_hdf5(scan_corpus(src), str(tmp_path / "out"), decode=True, size=(4, 4), progress=False)
    assert sorted(os.listdir(tmp_path / "out")) == []


def test_files_of_equal_length_keep_their_bytes(tmp_path: Path) -> None:
    src = tmp_path / "same"
    src.mkdir()
    blob = jpeg_bytes(np.random.default_rng(5))
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(blob)
    convert_hdf5(scan_corpus(src), str(tmp_path / "out"), decode=False, size=None, progress=False)
    assert [s["image"] for s in read_all(tmp_path / "out" / "data.h5")] == [blob] * 3


def test_flat_folder_has_no_classes(tmp_path: Path) -> None:
    src = tmp_path / "flat"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        (src / f"{i}.jpg").write_bytes(jpeg_bytes(rng))
    manifest = convert_hdf5(scan_corpus(src), str(tmp_path / "out"), decode=False, size=None, progress=False)
    assert manifest["classes"] == [] and manifest["class_counts"] == {}
    assert [s["label"] for s in read_all(tmp_path / "out" / "data.h5")] == [-1] * 4


DRIVER = """
import sys
from fastdata.convert.corpus import scan_corpus
from fastdata.convert.hdf5 import convert_hdf5
convert_hdf5(scan_corpus(sys.argv[1]), sys.argv[2], decode=True, size=(48, 48), progress=True)
"""


@pytest.mark.slow
def test_killed_run_leaves_nothing_under_the_final_name_and_a_rerun_completes(tmp_path: Path) -> None:
    # 800 copies of a few JPEGs: a conversion that runs long enough (several batches) to be killed part way
    src = tmp_path / "big"
    rng = np.random.default_rng(4)
    blobs = [jpeg_bytes(rng, (64, 48)) for _ in range(8)]
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(400):
            (src / f"c{c}" / f"{i:05d}.jpg").write_bytes(blobs[(c + i) % 8])
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(src), str(out)], stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    seen = b""
    while True:  # wait for the progress bar to show written samples, then kill without warning
        chunk = os.read(proc.stderr.fileno(), 4096)
        if not chunk:
            pytest.fail(f"the conversion ended before it could be killed: {seen[-400:]!r}")
        seen += chunk
        done = [int(m) for m in re.findall(rb"(\d+)/800", seen)]
        if done and max(done) > 0:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert max(done) < 800
    assert not (out / "data.h5").exists() and not (out / "manifest.json").exists()
    assert (out / "data.h5.partial").exists()  # the half-written file, under its temporary name only

    manifest = convert_hdf5(scan_corpus(src), str(out), decode=True, size=(48, 48), progress=False)
    assert sorted(os.listdir(out)) == ["data.h5", "manifest.json"]
    clean = convert_hdf5(scan_corpus(src), str(tmp_path / "clean"), decode=True, size=(48, 48), progress=False)
    assert manifest["shards"][0]["sha256"] == clean["shards"][0]["sha256"]  # same bytes as an uninterrupted run
    assert len(fd.HDF5Dataset(str(out / "data.h5"))) == 800


def test_cli_converts_to_hdf5(corpus_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastdata",
            "convert",
            str(corpus_dir),
            str(out),
            "--format",
            "hdf5",
            "--decode",
            "--size",
            "6x10",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "hdf5" and manifest["samples"] == 15
    assert read_all(out / "data.h5")[0]["image"].shape == (6, 10, 3)
