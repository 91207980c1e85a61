"""``fastdata convert s3://bucket/prefix/ OUT``: a corpus in object storage, against a real S3 server (moto)
on 127.0.0.1, listed in pages and read through the fault proxy (throttling, bodies cut mid-way)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.cli import main
from fastdata.convert import convert
from fastdata.convert._s3_corpus import scan_s3
from fastdata.core.errors import ConfigError, SourceNotFound
from tests.convert_driver import convert_listed
from tests.datagen import make_image_folder
from tests.fault_proxy import FaultProxy
from tests.s3_server import MotoServer


@pytest.fixture(scope="module")
def local_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """An ImageFolder tree of 3 classes; key -> (JPEG bytes, label)."""
    root = tmp_path_factory.mktemp("corpus")
    files = {}
    for rel, label in make_image_folder(root, classes=3, per_class=9, seed=11):
        files[rel.rsplit(".", 1)[0]] = ((root / rel).read_bytes(), label)
    return root, files


def upload_tree(server: MotoServer, bucket: str, prefix: str, root: Path) -> None:
    s3 = server.client()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(root).as_posix()}", Body=path.read_bytes())
    s3.put_object(Bucket=bucket, Key=f"{prefix}/class_0/.DS_Store", Body=b"finder")  # hidden: left out


def read_back(out: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    ds = fd.IndexedTarDataset(str(out / manifest["pattern"]))
    samples = [ds[i] for i in range(len(ds))]
    ds.close()
    return samples


def test_an_s3_prefix_listed_in_pages_and_read_through_faults_converts_every_object_once(
    local_corpus, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path
) -> None:
    root, files = local_corpus
    upload_tree(s3_server, s3_bucket, "src", root)
    through_proxy = {**s3_options, "endpoint_url": fault_proxy.endpoint_url}
    # one request in six answered 503 SlowDown (botocore retries it), one GET body in six cut off
    # half-way (the read resumes from the byte reached); listings are faulted too
    fault_proxy.configure(slowdown=0.15, cut=0.15, methods=["GET"], listings=True, seed=2)
    corpus = scan_s3(f"s3://{s3_bucket}/src", through_proxy, page_size=5)  # 28 keys: 6 pages
    assert corpus.root == f"s3://{s3_bucket}/src/" and corpus.classes == ["class_0", "class_1", "class_2"]
    assert len(corpus.items) == 27 and corpus.ignored == 1
    manifest = convert_listed(corpus, str(tmp_path / "out"), shard_count=4, workers=2, progress=False, fsync=False)
    stats = fault_proxy.stats()
    assert stats.get("slowdown", 0) > 0 and stats.get("cut", 0) > 0, stats
    samples = read_back(tmp_path / "out", manifest)
    assert Counter(s["__key__"] for s in samples) == Counter(list(files))
    for s in samples:
        assert s["jpg"] == files[s["__key__"]][0] and int(s["cls"]) == files[s["__key__"]][1]
    assert manifest["source"] == f"s3://{s3_bucket}/src/" and manifest["class_counts"] == {
        f"class_{c}": 9 for c in range(3)
    }
    # the same corpus converted from the local folder holds the same samples (mtimes aside: objects have none)
    local = convert(root, tmp_path / "local", shard_count=4, progress=False, fsync=False)
    assert [s["samples"] for s in local["shards"]] == [s["samples"] for s in manifest["shards"]]


def test_an_object_gone_since_the_listing_is_named_or_skipped(
    local_corpus, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], tmp_path
) -> None:
    root, _ = local_corpus
    upload_tree(s3_server, s3_bucket, "src", root)
    corpus = scan_s3(f"s3://{s3_bucket}/src/", s3_options)
    s3_server.client().delete_object(Bucket=s3_bucket, Key="src/class_1/img_0004.jpg")
    with pytest.raises(SourceNotFound, match=r"src/class_1/img_0004\.jpg: no such key"):
        convert_listed(corpus, str(tmp_path / "out"), shard_count=3, progress=False, fsync=False)
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "shard-000001.tar" not in left and not [n for n in left if n.endswith(".tmp")], left
    manifest = convert_listed(
        corpus, str(tmp_path / "out"), shard_count=3, skip_bad=True, restart=True, progress=False, fsync=False
    )
    assert manifest["samples"] == 26 and manifest["skipped"] == 1 and "img_0004.jpg" in manifest["problems"][0]


def test_the_cli_converts_an_s3_prefix_and_refuses_a_mixed_layout(
    local_corpus, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], tmp_path, monkeypatch
) -> None:
    root, files = local_corpus
    upload_tree(s3_server, s3_bucket, "src", root)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    assert main(["convert", f"s3://{s3_bucket}/src/", str(out), "--shard-count", "2", "--quiet", "--no-fsync"]) == 0
    assert len(read_back(out, fd.formats.read_manifest(str(out)) or {})) == len(files)
    s3_server.client().put_object(Bucket=s3_bucket, Key="src/loose.jpg", Body=b"x")
    with pytest.raises(ConfigError, match=r"holds both objects \(loose\.jpg, \.\.\.\) and class 'folders'"):
        scan_s3(f"s3://{s3_bucket}/src/", s3_options)
    with pytest.raises(SourceNotFound, match="no objects under this prefix"):
        scan_s3(f"s3://{s3_bucket}/nothing/", s3_options)
