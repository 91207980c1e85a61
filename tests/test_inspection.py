"""``fastdata inspect``: counts, extensions, bad members by name, manifest checks, --write-manifest."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

import fastdata as fd
from fastdata.cli import main
from fastdata.convert import convert
from fastdata.inspection import inspect_paths, write_manifest
from fastdata.manifest import sample_counts
from tests.datagen import make_image_folder, make_shards


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("insp")
    make_image_folder(root / "src", classes=2, per_class=6)
    convert(root / "src", root / "out", shard_count=3, progress=False, fsync=False)
    return root / "out"


def test_a_converted_folder_matches_its_manifest(converted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = inspect_paths(str(converted), checksum=True)
    assert report["totals"] == {"files": 3, "samples": 12, "bytes": report["totals"]["bytes"],
                                "extensions": {"cls": 12, "jpg": 12}, "bad": 0, "incomplete": 0}
    (summary,) = report["manifests"].values()
    assert summary["samples"] == 12 and summary["shards"] == 3 and summary["problems"] == []
    assert main(["inspect", str(converted / "shard-{000000..000002}.tar")]) == 0
    out = capsys.readouterr().out
    assert "total: 3 file(s), 12 samples" in out and "class_count" not in out and "2 classes" in out


def test_bad_members_are_named_and_the_manifest_mismatch_reported(converted: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
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
    assert "mismatch: shard-000002.tar: sha256 differs" in out
    assert main(["inspect", str(folder), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["totals"]["incomplete"] == 1 and report["totals"]["bad"] == 2


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
    with pytest.raises(fd.SourceNotFound, match="holds no file fastdata can inspect"):
        inspect_paths(str(tmp_path / "e"))
    (tmp_path / "x.zip").write_bytes(b"")
    with pytest.raises(fd.ConfigError, match="cannot inspect"):
        inspect_paths(str(tmp_path / "x.zip"))
    assert main(["inspect", str(tmp_path / "missing.tar")]) == 2
