"""convert_hdf5: a small-file corpus to HDF5 parts and their manifest; parts atomic, resumable after a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import xxhash
from PIL import Image

import fastdata as fd
from fastdata.convert import convert
from fastdata.convert._hdf5 import WRITE_ORDER_SEED
from fastdata.convert._resume import STATE_DIR
from fastdata.core.errors import ConfigError, DecodeFailed
from fastdata.formats._manifest import read_manifest, sample_counts
from tests.convert_driver import kill, start_paused
from tests.datagen import jpeg_bytes, make_image_folder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("corpus")
    make_image_folder(src, classes=3, per_class=5, seed=1)
    return src


def read_all(path: Path | str, fields: tuple[str, ...] = ("image", "label", "key"), **kw: Any) -> list[dict[str, Any]]:
    ds = fd.HDF5Dataset(str(path), fields, **kw)
    samples = list(ds.__getitems__(list(range(len(ds)))))
    ds.close()
    return samples


def parts(out: Path, manifest: dict[str, Any]) -> str:
    return str(out / manifest["pattern"])


def test_round_trip_keeps_every_file_its_bytes_and_label(corpus_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest = convert(corpus_dir, str(out), format="hdf5", shard_count=3, progress=False)
    assert manifest["pattern"] == "shard-{000000..000002}.h5"
    samples = read_all(parts(out, manifest))
    relpaths = sorted(str(p.relative_to(corpus_dir)) for p in corpus_dir.rglob("*.jpg"))
    # every file exactly once, in the documented shuffled order
    order = np.random.default_rng(WRITE_ORDER_SEED).permutation(len(relpaths))
    assert [s["key"] for s in samples] == [relpaths[i] for i in order]
    for s in samples:
        assert s["image"] == (corpus_dir / s["key"]).read_bytes()
        assert s["label"] == int(s["key"].split("/")[0].split("_")[1])
    # the manifest beside the file, in the layout fastdata.formats._manifest reads
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert read_manifest(str(out)) == manifest
    assert manifest["format"] == "hdf5" and manifest["samples"] == 15 and manifest["decoded"] is False
    assert manifest["classes"] == ["class_0", "class_1", "class_2"]
    assert manifest["class_counts"] == {"class_0": 5, "class_1": 5, "class_2": 5}
    assert [s["samples"] for s in manifest["shards"]] == [5, 5, 5]
    for shard in manifest["shards"]:
        h5 = out / shard["name"]
        assert shard["bytes"] == h5.stat().st_size and shard["xxh3_128"] == xxhash.xxh3_128(h5.read_bytes()).hexdigest()
        assert sample_counts([str(h5)]) == {str(h5): 5}
        with h5py.File(h5, "r") as f:
            assert list(f.attrs["classes"]) == manifest["classes"] and sum(f.attrs["class_counts"]) == 5
            assert f["label"].dtype == np.int64 and h5py.check_vlen_dtype(f["image"].dtype) == np.uint8
    assert sorted(p.name for p in out.iterdir()) == [
        ".fastdata-convert",
        "manifest.json",
        *(s["name"] for s in manifest["shards"]),
    ]


def test_parallel_parts_equal_serial_ones(corpus_dir: Path, tmp_path: Path) -> None:
    a = convert(corpus_dir, str(tmp_path / "a"), format="hdf5", shard_count=4, decode=True, size=(8, 8), progress=False)
    b = convert(
        corpus_dir,
        str(tmp_path / "b"),
        format="hdf5",
        shard_count=4,
        decode=True,
        size=(8, 8),
        workers=2,
        progress=False,
    )
    assert a["shards"] == b["shards"]  # names, counts, bytes, sha256


def test_decode_and_resize_to_fixed_shape(corpus_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "decoded"
    manifest = convert(corpus_dir, str(out), format="hdf5", decode=True, size=(6, 10), progress=False)
    assert manifest["fields"]["image"] == {"kind": "array", "dtype": "uint8", "shape": [6, 10, 3]}
    samples = read_all(parts(out, manifest))
    with pytest.raises(ConfigError, match=r"decoded\.h5: looks like a file name; .* give the folder"):
        convert(corpus_dir, str(tmp_path / "decoded.h5"), format="hdf5", progress=False)
    for s in samples:
        with Image.open(corpus_dir / s["key"]) as img:
            expected = np.asarray(img.convert("RGB").resize((10, 6), Image.Resampling.BILINEAR))
        np.testing.assert_array_equal(s["image"], expected)
        assert s["image"].dtype == np.uint8


def test_decode_without_size_keeps_a_common_size_and_refuses_mixed_ones(corpus_dir: Path, tmp_path: Path) -> None:
    m = convert(corpus_dir, str(tmp_path / "same"), format="hdf5", decode=True, size=None, progress=False)
    assert read_all(parts(tmp_path / "same", m))[0]["image"].shape == (24, 32, 3)
    mixed = tmp_path / "mixed"
    make_image_folder(mixed, classes=1, per_class=3, seed=2)
    (mixed / "class_0" / "img_9999.jpg").write_bytes(jpeg_bytes(np.random.default_rng(0), (8, 8)))
    with pytest.raises(ConfigError, match=r"img_9999\.jpg: image is 8x8, the first is 24x32; .*--size HxW"):
        convert(mixed, str(tmp_path / "out"), format="hdf5", decode=True, size=None, progress=False)
    assert [p.name for p in (tmp_path / "out").iterdir()] == [STATE_DIR]  # no part, no temporary file


def test_size_needs_decode(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pass decode=True"):
        convert(corpus_dir, str(tmp_path), format="hdf5", decode=False, size=(8, 8), progress=False)


def test_corrupt_images_named_or_every_one_skipped_in_one_run(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_image_folder(src, classes=2, per_class=4)
    (src / "class_1" / "img_0001.jpg").write_bytes(b"not a jpeg at all")
    (src / "class_0" / "img_0002.jpg").write_bytes(b"nor this one")
    with pytest.raises(DecodeFailed, match=r"class_\d/img_000\d\.jpg: cannot decode as an image"):
        convert(src, str(tmp_path / "out"), format="hdf5", decode=True, size=(4, 4), progress=False)
    assert sorted(os.listdir(tmp_path / "out")) == [STATE_DIR]
    manifest = convert(
        src, str(tmp_path / "out"), format="hdf5", decode=True, size=(4, 4), skip_bad=True, restart=True, progress=False
    )
    assert manifest["samples"] == 6 and manifest["skipped"] == 2
    assert sorted(p.split(":")[0].rsplit("/", 2)[-2] for p in manifest["problems"]) == ["class_0", "class_1"]
    keys = {s["key"] for s in read_all(parts(tmp_path / "out", manifest))}
    assert len(keys) == 6 and not keys & {"class_1/img_0001.jpg", "class_0/img_0002.jpg"}


def test_files_of_equal_length_keep_their_bytes(tmp_path: Path) -> None:
    src = tmp_path / "same"
    src.mkdir()
    blob = jpeg_bytes(np.random.default_rng(5))
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(blob)
    m = convert(src, str(tmp_path / "out"), format="hdf5", decode=False, size=None, progress=False)
    assert [s["image"] for s in read_all(parts(tmp_path / "out", m))] == [blob] * 3


def test_flat_folder_has_no_classes(tmp_path: Path) -> None:
    src = tmp_path / "flat"
    src.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        (src / f"{i}.jpg").write_bytes(jpeg_bytes(rng))
    manifest = convert(src, str(tmp_path / "out"), format="hdf5", decode=False, size=None, progress=False)
    assert manifest["classes"] == [] and manifest["class_counts"] == {} and manifest["samples"] == 4
    assert [s["label"] for s in read_all(parts(tmp_path / "out", manifest))] == [-1] * 4


@pytest.mark.slow
def test_killed_run_leaves_nothing_under_the_final_name_and_a_rerun_completes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    rng = np.random.default_rng(4)
    blobs = [jpeg_bytes(rng, (64, 48)) for _ in range(8)]
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(40):
            (src / f"c{c}" / f"{i:05d}.jpg").write_bytes(blobs[(c + i) % 8])
    out = tmp_path / "out"
    options = {"format": "hdf5", "decode": True, "size": [48, 48], "shard_count": 8}
    # paused (in its on_shard hook) once the first part is finished: killed mid-way, every time
    kill(start_paused(str(src), str(out), 1, options))
    assert not (out / "manifest.json").exists()
    finished = {p.name for p in out.glob("*.h5")}
    assert 1 <= len(finished) < 8  # parts exist only complete, under their final name
    before = {n: (out / n).stat().st_mtime_ns for n in finished}

    manifest = convert(src, str(out), format="hdf5", decode=True, size=(48, 48), shard_count=8, progress=False)
    assert {n: (out / n).stat().st_mtime_ns for n in finished} == before, "a finished part was written again"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [STATE_DIR, "manifest.json", *(s["name"] for s in manifest["shards"])]
    )
    clean = convert(
        src, str(tmp_path / "clean"), format="hdf5", decode=True, size=(48, 48), shard_count=8, progress=False
    )
    assert manifest["shards"] == clean["shards"]  # the same bytes as an uninterrupted run
    assert len(fd.HDF5Dataset(parts(out, manifest))) == 80


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
    assert read_all(parts(out, manifest))[0]["image"].shape == (6, 10, 3)
    assert f"fastdata.HDF5Dataset('{out / manifest['pattern']}')" in result.stderr
