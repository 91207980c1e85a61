"""``fastdata bench s3://...`` measures the pipeline the local tar backend measures (issue 35, item 1):
the same ``-o`` options (decode, size, batch_size, fields), decoded and batched in the dataset by default,
each remote byte fetched once per run through a fetch cache, the bytes fetched against the bytes stored
in the report, and the transport ``fd.Loader`` uses. Against the moto server on 127.0.0.1."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastdata as fd
from fastdata.bench import backends
from fastdata.cli import main
from fastdata.core.errors import ConfigError
from fastdata.storage.s3 import S3Config
from tests.datagen import jpeg_bytes, make_shards
from tests.s3_server import MotoServer, upload_files

SHARDS, PER_SHARD = 2, 12
OBJECTS = 6


@pytest.fixture(scope="module")
def shards(s3_server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, str]:
    """Two webdataset shards of 12 JPEGs (32x24) and labels, no sidecars, under ``s3://.../train/``; their
    bytes; the same shards local."""
    client = s3_server.client()
    client.create_bucket(Bucket="bench-s3-pipeline")
    paths = make_shards(tmp_path_factory.mktemp("shards"), shards=SHARDS, per_shard=PER_SHARD, jpeg=True, seed=5)
    upload_files(client, "bench-s3-pipeline", {f"train/{os.path.basename(p)}": p for p in paths})
    rng = np.random.default_rng(6)
    upload_files(client, "bench-s3-pipeline", {f"img/{i:02d}.jpg": jpeg_bytes(rng, (40, 30)) for i in range(OBJECTS)})
    return "s3://bench-s3-pipeline/train/", sum(os.path.getsize(p) for p in paths), paths[0]


def test_s3_shards_take_the_tar_backends_options_and_give_decoded_batches_of_the_asked_size(
    shards: tuple[str, int, str], s3_options: dict[str, Any], tmp_path: Path
) -> None:
    prefix, _, local = shards
    s3 = backends.get("s3")
    config = S3Config(**s3_options)
    fields = {"image": "jpg;png", "label": "cls"}
    asked = {"config": config, "size": "16x20", "batch_size": 4, "fields": fields, "cache_dir": str(tmp_path)}
    assert s3.batches_in_dataset(prefix, asked)
    swept, note, facts = s3.prepare(prefix, asked)
    assert "size=(16, 20) (-o size)" in note and facts["source"] == "s3 tar shards (2)"
    ds = s3.open(prefix, **swept)
    try:
        assert isinstance(ds, fd.TarShardDataset) and ds.batch_size == 4
        batch = next(iter(ds))
    finally:
        ds.close()
    image, label = batch["image"], batch["label"]
    assert isinstance(image, torch.Tensor) and tuple(image.shape) == (4, 3, 16, 20)  # decoded, resized, batched
    assert len(label) == 4
    cached = {"config": config, "cache_dir": str(tmp_path)}
    # the decode modes the local backend takes: raw bytes, numpy arrays; PIL refused alike, with the fix
    raw = s3.open(prefix, **s3.prepare(prefix, {**cached, "decode": "raw", "batch_size": 2})[0])
    numpy = s3.open(prefix, **s3.prepare(prefix, {**cached, "decode": "numpy", "batch_size": 2})[0])
    try:
        assert isinstance(next(iter(raw))["jpg"][0], bytes)
        assert tuple(next(iter(numpy))["jpg"].shape) == (2, 24, 32, 3)  # decoded as numpy (HWC), collated
    finally:
        raw.close()
        numpy.close()
    with pytest.raises(ConfigError, match="-o decode=pil gives PIL images, which do not batch"):
        s3.prepare(prefix, {"config": config, "decode": "pil"})
    with pytest.raises(ConfigError, match="-o decode=pil gives PIL images, which do not batch"):
        backends.get("tar").prepare(local, {"decode": "pil"})


def test_objects_under_a_prefix_are_decoded_and_their_batch_size_goes_to_the_dataloader(
    shards: tuple[str, int, str], s3_options: dict[str, Any], tmp_path: Path
) -> None:
    s3 = backends.get("s3")
    prefix = "s3://bench-s3-pipeline/img/"
    asked = {"config": S3Config(**s3_options), "batch_size": 4, "cache_dir": str(tmp_path)}
    assert not s3.batches_in_dataset(prefix, asked)  # one sample per object: the DataLoader batches
    swept, note, facts = s3.prepare(prefix, asked)
    assert note == "decode='torch'" and facts["loader_batch_size"] == 4  # not lost: the DataLoader's batch size
    assert facts["source"] == "s3 objects (one sample per object)" and facts["stored_bytes"] > 0
    ds = s3.open(prefix, **swept)
    try:
        assert isinstance(ds, fd.S3Dataset) and len(ds) == OBJECTS
        assert tuple(ds[0]["jpg"].shape) == (3, 30, 40)  # decoded to a CHW tensor, as training reads it
    finally:
        ds.close()


@pytest.mark.slow
def test_the_s3_bench_says_what_it_measured_fetches_each_byte_once_and_measures_the_loaders_transport(
    shards: tuple[str, int], s3_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix, stored, _ = shards
    fast = ["--seconds", "0.3", "--batch-size", "4", "-o", "size=16x16"]
    assert main(["bench", prefix, "--workers", "0,1", *fast, "--json", str(tmp_path / "s3.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "measured: s3 tar shards (2); decoded, decode='torch' at size=(16, 16) (-o size); " in out
    assert "batched in the dataset (4 per batch); transport slots (fd.Loader's default); fetched " in out
    assert "(fetch cache: a temporary folder, removed after the run;" in out
    data = json.loads((tmp_path / "s3.json").read_text())
    measured = data["measured"]
    assert measured["stored_bytes"] == stored
    # every point built its own dataset (and a look at a few samples came first): one fetch of each shard
    assert stored <= measured["fetched_bytes"] <= 1.1 * stored, measured
    assert f"= {measured['fetched_bytes'] / stored:.2f}x the " in out
    points = data["result"]["points"]
    assert all(p["error"] is None for p in points)
    # the transport fd.Loader uses with worker processes unless told
    assert measured["transport"] == [fd.loading.DEFAULT_TRANSPORT] == ["slots"]
    assert {p["config"]["transport"] for p in points if p["config"]["num_workers"]} == {"slots"}
    # uncached reads, when asked, are measured and said as such: a default one fetched 54x what is stored
    assert main(["bench", prefix, "--workers", "0", *fast, "-o", "cache_dir=false"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(fetch cache: none (-o cache_dir=false: uncached reads, as asked))" in out
