"""``fastdata inspect``: counts, extensions, bad members by name, manifest checks, --write-manifest; HDF5
files, folders of videos, and ``s3://`` prefixes and shards on the moto server."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import fastdata as fd
from fastdata.cli import main
from fastdata.convert import convert
from fastdata.formats._manifest import sample_counts
from fastdata.inspection._paths import inspect_paths, write_manifest
from tests.datagen import make_image_folder, make_shards
from tests.s3_server import MotoServer, upload_files


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("insp")
    make_image_folder(root / "src", classes=2, per_class=6)
    convert(root / "src", root / "out", shard_count=3, progress=False, fsync=False)
    return root / "out"


def test_a_converted_folder_matches_its_manifest(converted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = inspect_paths(str(converted), checksum=True)
    assert report["totals"] == {
        "files": 3,
        "samples": 12,
        "bytes": report["totals"]["bytes"],
        "extensions": {"cls": 12, "jpg": 12},
        "bad": 0,
        "incomplete": 0,
        "split": 0,
    }
    (summary,) = report["manifests"].values()
    assert summary["samples"] == 12 and summary["shards"] == 3 and summary["problems"] == []
    assert main(["inspect", str(converted / "shard-{000000..000002}.tar")]) == 0
    out = capsys.readouterr().out
    assert "total: 3 file(s), 12 samples" in out and "class_count" not in out and "2 classes" in out


def test_bad_members_are_named_and_the_manifest_mismatch_reported(
    converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "copy"
    folder.mkdir()
    for p in converted.iterdir():
        if p.is_file():
            (folder / p.name).write_bytes(p.read_bytes())
    # shard 1 loses its tail; shard 2 gains a member named '../evil.jpg'
    data = (folder / "shard-000001.tar").read_bytes()
    (folder / "shard-000001.tar").write_bytes(data[: len(data) // 2])
    with tarfile.open(folder / "shard-000002.tar", "a") as tf:
        info = tarfile.TarInfo("../evil.jpg")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"bad"))
    assert main(["inspect", str(folder), "--checksum"]) == 1
    out = capsys.readouterr().out
    assert "shard-000001.tar" in out and "INCOMPLETE" in out and "truncated" in out
    assert "bad: " in out and "'../evil.jpg'" in out
    assert "mismatch: shard-000001.tar: manifest says 20480 bytes, the file has 10240" in out
    assert "mismatch: shard-000002.tar: manifest says 4 samples, the shard has 5" in out
    assert "mismatch: shard-000002.tar: xxh3_128 differs" in out  # the digest the manifest names
    assert main(["inspect", str(folder), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["totals"]["incomplete"] == 1 and report["totals"]["bad"] == 2


def test_an_older_manifest_with_sha256_digests_still_verifies(converted: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "older"
    folder.mkdir()
    for p in converted.iterdir():
        if p.is_file():
            (folder / p.name).write_bytes(p.read_bytes())
    manifest = json.loads((folder / "manifest.json").read_text())
    for shard in manifest["shards"]:  # as fastdata wrote them before the fast digest
        del shard["xxh3_128"]
        shard["sha256"] = hashlib.sha256((folder / shard["name"]).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert main(["inspect", str(folder), "--checksum"]) == 0
    assert "mismatch" not in capsys.readouterr().out
    data = bytearray((folder / "shard-000001.tar").read_bytes())
    data[600] ^= 0xFF  # inside the first member's data: same size, same members, other bytes
    (folder / "shard-000001.tar").write_bytes(bytes(data))
    assert main(["inspect", str(folder), "--checksum"]) == 1
    assert "mismatch: shard-000001.tar: sha256 differs from the manifest's" in capsys.readouterr().out


def test_write_manifest_for_shards_made_by_webdataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with wds.ShardWriter(str(tmp_path / "w-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"k{i}", "txt": f"sample {i}", "cls": i % 2})
    assert main(["inspect", str(tmp_path), "--write-manifest"]) == 0
    assert "wrote" in capsys.readouterr().out
    urls = sorted(str(p) for p in tmp_path.glob("w-*.tar"))
    assert all(os.path.isfile(u + ".idx") for u in urls)
    assert sample_counts(urls) == {urls[0]: 4, urls[1]: 4, urls[2]: 2}
    assert sorted(s["__key__"] for s in fd.TarShardDataset(urls)) == sorted(f"k{i}" for i in range(10))
    with pytest.raises(fd.ConfigError, match="exists already"):
        write_manifest(str(tmp_path))
    assert write_manifest(str(tmp_path), force=True) == [str(tmp_path / "manifest.json")]


def test_unknown_files_and_empty_folders_are_refused(tmp_path: Path) -> None:
    make_shards(tmp_path / "s", shards=1, per_shard=2)
    (tmp_path / "e").mkdir()
    with pytest.raises(fd.SourceNotFound, match="holds no shards, HDF5 files or videos"):
        inspect_paths(str(tmp_path / "e"))
    (tmp_path / "x.zip").write_bytes(b"")
    with pytest.raises(fd.ConfigError, match="cannot inspect"):
        inspect_paths(str(tmp_path / "x.zip"))
    assert main(["inspect", str(tmp_path / "missing.tar")]) == 2


# -- HDF5 ----------------------------------------------------------------------------------------------
def test_hdf5_files_report_fields_chunking_attrs_and_unequal_lengths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import h5py

    from tests.hdf5_datagen import make_files

    paths, _ = make_files(tmp_path, sizes=(11, 13, 9))  # chunked, contiguous, gzip-compressed
    with h5py.File(paths[0], "a") as f:
        f.attrs["classes"] = np.array(["cat", "dog"], dtype=h5py.string_dtype())
    with h5py.File(tmp_path / "uneven.h5", "w") as f:
        f.create_dataset("image", data=np.zeros((5, 2), np.float32))
        f.create_dataset("label", data=np.zeros(4, np.int64))
    (tmp_path / "cut.h5").write_bytes(Path(paths[1]).read_bytes()[:1000])
    report = inspect_paths(str(tmp_path))
    files = {os.path.basename(r["url"]): r for r in report["files"]}
    assert sorted(files) == ["cut.h5", "part-0.h5", "part-1.h5", "part-2.h5", "uneven.h5"]
    part0 = files["part-0.h5"]
    assert part0["format"] == "hdf5" and part0["samples"] == 11 and part0["bad"] == []
    fields = part0["details"]["fields"]
    assert fields["image"] == {
        "length": 11,
        "shape": [11, 4, 5, 3],
        "dtype": "uint8",
        "chunks": [4, 4, 5, 3],
        "compression": None,
    }
    assert fields["label"]["dtype"] == "int64" and fields["key"]["chunks"] == [3]
    assert fields["blob"]["dtype"] == "uint8 (variable length)" and fields["blob"]["length"] == 11
    assert part0["details"]["attrs"] == {"classes": ["cat", "dog"]}
    assert files["part-1.h5"]["details"]["fields"]["image"]["chunks"] is None
    assert files["part-2.h5"]["details"]["fields"]["image"]["compression"] == "gzip"
    (uneven,) = files["uneven.h5"]["bad"]
    assert "unequal lengths ('image': 5, 'label': 4)" in uneven
    assert files["cut.h5"]["complete"] is False and "HDF5 cannot open it" in files["cut.h5"]["bad"][0]
    assert report["totals"]["bad"] == 2 and report["totals"]["samples"] == 11 + 13 + 9 + 4
    assert main(["inspect", str(tmp_path / "part-{0..2}.h5")]) == 0
    out = capsys.readouterr().out
    assert "field image: 11x4x5x3 uint8, chunks 4x4x5x3" in out and "gzip" in out
    assert 'attr classes: ["cat", "dog"]' in out
    assert main(["inspect", str(tmp_path)]) == 1
    assert "bad: " in capsys.readouterr().out


# -- videos --------------------------------------------------------------------------------------------
def test_a_folder_of_videos_reports_codecs_and_frames_and_names_unreadable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.videogen import make_videos

    make_videos(tmp_path / "class_a", count=2, frames=[12, 20], codec="mp4v")
    make_videos(tmp_path / "class_b", count=1, frames=15, codec="mjpg")
    (tmp_path / "class_b" / "broken.mp4").write_bytes(b"not a video at all" * 50)
    report = inspect_paths(str(tmp_path))
    files = {os.path.relpath(r["url"], tmp_path): r for r in report["files"]}
    assert sorted(files) == ["class_a/v000.mp4", "class_a/v001.mp4", "class_b/broken.mp4", "class_b/v000.avi"]
    assert [files[f"class_a/v00{k}.mp4"]["samples"] for k in (0, 1)] == [12, 20]
    assert files["class_a/v000.mp4"]["details"] == {
        "codec": "mpeg4",
        "frames": 12,
        "fps": 25.0,
        "width": 96,
        "height": 64,
        "seconds": 0.48,
        "stream": 0,
        "video_streams": 1,
        "rotation": 0,
        "constant_frame_rate": True,
    }
    assert files["class_b/v000.avi"]["details"]["codec"] == "mjpeg"
    broken = files["class_b/broken.mp4"]
    assert not broken["complete"] and "broken.mp4" in broken["bad"][0]
    assert report["totals"]["extensions"] == {"mjpeg": 1, "mpeg4": 2} and report["totals"]["bad"] == 1
    assert main(["inspect", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "v001.mp4  20 frames" in out and "video: mpeg4, 20 frames, 25.0 fps, 96x64" in out
    assert "bad: " in out and "broken.mp4" in out


def test_a_video_cut_short_with_its_index_in_front_is_bad_and_a_turned_one_is_reported_turned(tmp_path: Path) -> None:
    """The index of a ``+faststart`` MP4 announces frames the cut file does not hold: named as bad (it
    used to be reported as a complete, shorter video). A turned video reports its displayed size."""
    from tests.videogen import frames_for, write_h264, write_pyav

    full = write_h264(tmp_path / "full.mp4", frames_for(0, 30), faststart=True)
    data = Path(full).read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) // 2])
    write_pyav(tmp_path / "turned.mp4", [frames_for(0, 10)], rotation=90)
    files = {os.path.basename(r["url"]): r for r in inspect_paths(str(tmp_path))["files"]}
    cut = files["cut.mp4"]
    assert not cut["complete"] and re.search(
        r"cut\.mp4: the container announces 30 frames, the file holds", cut["bad"][0]
    )
    assert files["full.mp4"]["complete"] and files["full.mp4"]["samples"] == 30
    turned = files["turned.mp4"]["details"]
    assert (turned["width"], turned["height"], turned["rotation"]) == (64, 96, 90)


# -- S3 ------------------------------------------------------------------------------------------------
def test_an_s3_prefix_of_shards_is_listed_inspected_and_checked_against_its_manifest(
    converted: Path, s3_env: dict[str, str], s3_server: MotoServer, s3_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = s3_server.client()
    upload_files(s3, s3_bucket, {f"train/{p.name}": p for p in sorted(converted.iterdir()) if p.is_file()})
    upload_files(s3, s3_bucket, {"train/readme.txt": b"hello"})
    local = inspect_paths(str(converted))
    report = inspect_paths(f"s3://{s3_bucket}/train")
    (prefix,) = report["prefixes"].values()
    objects = [p for p in converted.iterdir() if p.is_file()]
    assert prefix["objects"] == len(objects) + 1 and prefix["inspected"] == 3
    assert prefix["bytes"] == sum(p.stat().st_size for p in objects) + 5
    assert prefix["suffixes"] == {".tar": 3, ".idx": 3, ".json": 1, ".txt": 1}
    assert report["totals"] == local["totals"]
    assert [r["url"] for r in report["files"]] == [f"s3://{s3_bucket}/train/shard-{k:06d}.tar" for k in range(3)]
    assert all(r["notes"] == [] for r in report["files"]), "the sidecar indexes on S3 were not checked"
    (summary,) = report["manifests"].values()
    assert summary["samples"] == 12 and summary["problems"] == []
    # one shard alone: the others are not reported missing; then one deleted: it is
    one = inspect_paths(f"s3://{s3_bucket}/train/shard-000001.tar")
    assert one["totals"]["samples"] == 4 and one["manifests"][f"s3://{s3_bucket}/train"]["problems"] == []
    s3.delete_object(Bucket=s3_bucket, Key="train/shard-000002.tar")
    assert main(["inspect", f"s3://{s3_bucket}/train/"]) == 1
    out = capsys.readouterr().out
    assert f"prefix s3://{s3_bucket}/train/: 7 object(s)" in out
    assert "mismatch: shard-000002.tar: listed in the manifest but missing" in out


def test_an_s3_prefix_of_plain_objects_is_counted_and_media_listed_not_opened(
    s3_env: dict[str, str], s3_server: MotoServer, s3_bucket: str, tmp_path: Path
) -> None:
    from tests.hdf5_datagen import make_h5

    make_h5(tmp_path / "a.h5", 3)
    upload_files(
        s3_server.client(),
        s3_bucket,
        {"raw/x/1.jpg": b"a" * 10, "raw/x/2.jpg": b"b" * 20, "raw/y/3.cls": b"1", "raw/a.h5": tmp_path / "a.h5"},
    )
    report = inspect_paths(f"s3://{s3_bucket}/raw")
    assert report["prefixes"][f"s3://{s3_bucket}/raw"] == {
        "objects": 4,
        "bytes": 31 + (tmp_path / "a.h5").stat().st_size,
        "suffixes": {".jpg": 2, ".h5": 1, ".cls": 1},
        "inspected": 1,
    }
    (h5,) = report["files"]
    assert h5["format"] == "hdf5" and h5["bytes"] == (tmp_path / "a.h5").stat().st_size
    assert h5["notes"] == ["not opened: HDF5 files are read from local disk (copy the file first)"]
    with pytest.raises(fd.SourceNotFound, match="no objects under this prefix"):
        inspect_paths(f"s3://{s3_bucket}/nothing")
