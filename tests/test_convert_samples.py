"""``fastdata convert`` of folders whose files share keys (``KEY.jpg``, ``KEY.json``, ``KEY.cls``: written
for webdataset, or unpacked from its shards): one sample per key with every file as a member, never split
between shards or by ``--shuffle``; class folders keep their labels; the summary and the manifest count
samples and members."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import webdataset as wds

import fastdata as fd
from fastdata.cli import main
from fastdata.convert import convert
from fastdata.convert._corpus import scan_corpus
from fastdata.core.errors import ConfigError

N = 40
FIELDS = ("cls", "jpg", "json")


def _webdataset_folder(root: Path) -> dict[str, dict[str, bytes]]:
    """A folder made the way users make one: webdataset's ``ShardWriter`` shards, unpacked with GNU tar."""
    want: dict[str, dict[str, bytes]] = {}
    with wds.ShardWriter(str(root / "wds-%06d.tar"), maxcount=15) as sink:
        for i in range(N):
            sample = {
                "jpg": f"jpg-{i}-".encode() * (3 + 40 * (i % 3)),
                "json": json.dumps({"caption": f"caption {i}"}).encode(),
                "cls": str(i % 4).encode(),
            }
            sink.write({"__key__": f"s{i:06d}", **sample})
            want[f"s{i:06d}"] = sample
    folder = root / "folder"
    folder.mkdir()
    for shard in sorted(root.glob("wds-*.tar")):
        subprocess.run(["tar", "xf", str(shard), "-C", str(folder)], check=True)
    return want


def _read(out: Path) -> list[dict[str, object]]:
    return list(fd.TarShardDataset(str(out)))


@pytest.mark.parametrize(
    "options",
    [{"shard_size": "4KB"}, {"shard_count": 3, "shuffle": True, "seed": 5}],
    ids=["small-shards", "shard-count-shuffled"],
)
def test_files_sharing_a_key_become_one_sample_with_every_field(tmp_path: Path, options: dict[str, object]) -> None:
    want = _webdataset_folder(tmp_path)
    manifest = convert(tmp_path / "folder", tmp_path / "out", progress=False, fsync=False, **options)
    assert manifest["samples"] == N and manifest["fields"] == dict.fromkeys(FIELDS, N)
    assert len(manifest["shards"]) >= 3  # samples cut between shards: never a sample's files
    samples = _read(tmp_path / "out")
    assert sorted(s["__key__"] for s in samples) == sorted(want)
    for s in samples:
        assert {k: bytes(v) for k, v in s.items() if not k.startswith("__")} == want[str(s["__key__"])]  # type: ignore[arg-type]
    # webdataset reads the shards the same way: each sample's members are next to each other
    shards = [str(tmp_path / "out" / s["name"]) for s in manifest["shards"]]
    upstream = list(wds.WebDataset(shards, shardshuffle=False))
    assert len(upstream) == N and all(set(FIELDS) <= set(s) for s in upstream)


def test_the_summary_counts_samples_and_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _webdataset_folder(tmp_path)
    assert main(["convert", str(tmp_path / "folder"), str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"fastdata convert: {N} samples ({N} cls, {N} jpg, {N} json)" in err
    corpus = scan_corpus(tmp_path / "folder")
    assert corpus.sample_fields() == (N, dict.fromkeys(FIELDS, N))


def test_class_folders_keep_their_labels_once_per_sample(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name in ["cat", "dog"]:
        (src / name).mkdir(parents=True)
        for i in range(5):
            (src / name / f"{name}{i}.jpg").write_bytes(f"{name}-image-{i}".encode())
            if i % 2 == 0:
                (src / name / f"{name}{i}.txt").write_bytes(f"a {name}, number {i}".encode())
    manifest = convert(src, tmp_path / "out", shard_count=2, shuffle=True, progress=False, fsync=False)
    assert manifest["class_counts"] == {"cat": 5, "dog": 5} and manifest["samples"] == 10
    assert manifest["fields"] == {"cls": 10, "jpg": 10, "txt": 6}
    samples = {str(s["__key__"]): s for s in _read(tmp_path / "out")}
    assert len(samples) == 10
    for key, s in samples.items():
        name, i = key.split("/")[0], int(key[-1])
        assert bytes(s["cls"]) == str(["cat", "dog"].index(name)).encode()  # type: ignore[arg-type]
        assert bytes(s["jpg"]) == f"{name}-image-{i}".encode()  # type: ignore[arg-type]
        assert ("txt" in s) == (i % 2 == 0)


def test_two_images_under_one_key_stay_two_samples(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"jpeg one")
    (src / "a.png").write_bytes(b"png two")
    (src / "a.json").write_bytes(b"{}")
    (src / "b.jpg").write_bytes(b"jpeg b")
    (src / "b.seg.png").write_bytes(b"mask b")
    manifest = convert(src, tmp_path / "out", shard_count=1, progress=False, fsync=False)
    members = {str(s["__key__"]): sorted(k for k in s if not k.startswith("__")) for s in _read(tmp_path / "out")}
    assert members["b"] == ["jpg", "seg.png"]  # an image and its mask: one sample
    assert len(members) == 4 and manifest["samples"] == 4  # a.jpg, a.png, a.json: three samples of their own


def test_hdf5_refuses_a_corpus_of_multi_file_samples(tmp_path: Path) -> None:
    _webdataset_folder(tmp_path)
    with pytest.raises(ConfigError, match=f"{N} samples of fields cls, jpg, json.*format='tar'"):
        convert(tmp_path / "folder", tmp_path / "h5", format="hdf5", progress=False, fsync=False)


def test_a_sample_with_a_vanished_file_is_left_out_whole_under_skip_bad(tmp_path: Path) -> None:
    from tests.convert_driver import convert_listed

    want = _webdataset_folder(tmp_path)
    corpus = scan_corpus(tmp_path / "folder")
    (tmp_path / "folder" / "s000007.json").unlink()  # listed, then gone before it is written
    with pytest.raises(fd.SourceNotFound, match=r"s000007\.json"):
        convert_listed(corpus, str(tmp_path / "out"), shard_count=2, progress=False, fsync=False)
    manifest = convert_listed(
        corpus, str(tmp_path / "out"), shard_count=2, skip_bad=True, restart=True, progress=False, fsync=False
    )
    assert manifest["samples"] == N - 1 and "s000007" in " ".join(manifest["problems"])
    keys = sorted(str(s["__key__"]) for s in _read(tmp_path / "out"))
    assert keys == sorted(k for k in want if k != "s000007")  # no partial s000007 without its caption
