"""Uploading finished files (shards, sidecars, the manifest) to a real S3 server: multipart for large
files, checked afterwards, skipped when already there, and the manifest strictly last."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

import fastdata as fd
from fastdata.convert._upload import ShardUploader
from fastdata.core.errors import SourceNotFound, SourceUnreadable
from fastdata.formats.tar._reader import scan
from fastdata.storage._local import LocalReader
from fastdata.storage.s3._upload import file_sha256, upload_file
from tests.datagen import make_shards
from tests.fault_proxy import FaultProxy
from tests.s3_server import MotoServer

MiB = 1 << 20


def keys(server: MotoServer, bucket: str) -> list[str]:
    return [o["Key"] for o in server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_small_and_multipart_uploads_arrive_intact(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Any
) -> None:
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(b"hello")
    big.write_bytes(np.random.default_rng(0).bytes(11 * MiB))  # 3 parts of 5 MiB (S3's minimum part)
    assert upload_file(small, f"s3://{s3_bucket}/a/small.bin", **s3_options)
    assert upload_file(big, f"s3://{s3_bucket}/a/big.bin", multipart_threshold=5 * MiB, part_size=5 * MiB, **s3_options)
    client = s3_server.client()
    head = client.head_object(Bucket=s3_bucket, Key="a/big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # S3's mark of a 3-part upload
    assert head["Metadata"]["sha256"] == file_sha256(big)
    assert client.get_object(Bucket=s3_bucket, Key="a/big.bin")["Body"].read() == big.read_bytes()
    assert client.get_object(Bucket=s3_bucket, Key="a/small.bin")["Body"].read() == b"hello"
    # a resumed conversion: the same file is not sent again; a changed one is
    assert not upload_file(small, f"s3://{s3_bucket}/a/small.bin", skip_existing=True, **s3_options)
    small.write_bytes(b"HELLO")
    assert upload_file(small, f"s3://{s3_bucket}/a/small.bin", skip_existing=True, **s3_options)


def test_upload_errors_name_the_problem(
    s3_bucket: str, s3_options: dict[str, Any], tmp_path: Any, fault_proxy: FaultProxy
) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x")
    with pytest.raises(SourceNotFound, match="no such file to upload"):
        upload_file(tmp_path / "missing.bin", f"s3://{s3_bucket}/f.bin", **s3_options)
    with pytest.raises(SourceNotFound, match="s3://no-bucket-for-upload: no such bucket"):
        upload_file(path, "s3://no-bucket-for-upload/f.bin", **s3_options)
    fault_proxy.configure(deny="/locked/", methods=["PUT"])
    with pytest.raises(SourceUnreadable, match="access denied"):
        upload_file(path, f"s3://{s3_bucket}/locked/f.bin", **{**s3_options, "endpoint_url": fault_proxy.endpoint_url})


def _convert_like(folder: Any) -> tuple[list[str], str]:
    """What the converter leaves in its staging folder: shards, their sidecars, a manifest."""
    paths = make_shards(folder, shards=3, per_shard=10, seed=3)
    shards = []
    for p in paths:
        with LocalReader(p) as r:
            index = scan(r)
        with open(p + ".idx", "wb") as f:
            f.write(index.to_bytes())
        shards.append({"name": os.path.basename(p), "samples": len(index), "bytes": os.path.getsize(p)})
    manifest = os.path.join(folder, "manifest.json")
    with open(manifest, "w") as f:
        json.dump({"format": "tar", "version": 1, "samples": 30, "shards": shards}, f)
    return paths, manifest


def test_shards_then_the_manifest_last(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], s3_env: dict[str, str], tmp_path: Any
) -> None:
    s3_server.client().put_object(Bucket=s3_bucket, Key="train/manifest.json", Body=b'{"stale": true}')
    paths, manifest = _convert_like(tmp_path)
    with ShardUploader(f"s3://{s3_bucket}/train", **s3_options) as up:
        for p in paths:
            up.upload(p)
            assert "train/manifest.json" not in keys(s3_server, s3_bucket)  # the stale one went first
            up.upload(p + ".idx")
        up.wait()
        assert "train/manifest.json" not in keys(s3_server, s3_bucket)
        uploaded = up.finish(manifest)
    assert uploaded[-1] == f"s3://{s3_bucket}/train/manifest.json" and len(uploaded) == 7
    ds = fd.TarShardDataset(f"s3://{s3_bucket}/train/train-{{000000..000002}}.tar", batch_size=5)
    assert ds.source.counts == [10, 10, 10]  # from the manifest
    assert sorted(k for batch in ds for k in batch["__key__"]) == [f"s{i:06d}" for i in range(30)]
    again = ShardUploader(f"s3://{s3_bucket}/train", **s3_options)
    for p in paths:
        again.upload(p)
    assert len(again.skipped) == 3 and again.finish(manifest)[-1].endswith("manifest.json")


def test_a_failed_shard_upload_means_no_manifest(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path: Any
) -> None:
    paths, manifest = _convert_like(tmp_path)
    fault_proxy.configure(deny="train-000001.tar", methods=["PUT"])
    through_proxy = {**s3_options, "endpoint_url": fault_proxy.endpoint_url}
    with (
        pytest.raises(SourceUnreadable, match=r"train-000001\.tar: access denied"),
        ShardUploader(f"s3://{s3_bucket}/out/", **through_proxy) as up,
    ):
        for p in paths:
            up.upload(p)
        up.finish(manifest)
    assert "out/manifest.json" not in keys(s3_server, s3_bucket)
