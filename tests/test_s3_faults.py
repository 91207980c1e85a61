"""Faults between the client and a real S3 server, injected by the fault proxy (tests/fault_proxy.py):
throttling, connections reset or cut mid-body, stalls, denied and missing keys. Retried where that makes
sense, reported everywhere, never a silent loss, never a hang past the configured timeouts."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections import Counter
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import BadSampleWarning, SourceNotFound, SourceUnreadable
from fastdata.core.process._shared import SharedState
from fastdata.storage._remote import ObjectChanged
from fastdata.storage.s3._client import COUNTERS, Stats
from fastdata.storage.s3._fetch import S3Unavailable
from fastdata.storage.s3._reader import S3Reader
from tests.datagen import make_shards
from tests.fault_proxy import FaultProxy
from tests.s3_server import MotoServer, upload_files

BUCKET = "faults"
MiB = 1 << 20


@pytest.fixture(scope="module")
def objects(s3_server: MotoServer) -> dict[str, bytes]:
    """60 objects of 2-40 KB, and one of 3 MB: ``{url: bytes}``."""
    client = s3_server.client()
    client.create_bucket(Bucket=BUCKET)
    rng = np.random.default_rng(11)
    files = {f"obj/{i:04d}.bin": rng.bytes(int(rng.integers(2000, 40_000))) for i in range(60)}
    files["big/blob.bin"] = rng.bytes(3 * MiB)
    upload_files(client, BUCKET, files)
    return {f"s3://{BUCKET}/{k}": v for k, v in files.items()}


def small(objects: dict[str, bytes], n: int = 60) -> list[str]:
    return [u for u in objects if "/obj/" in u][:n]


@pytest.fixture
def via_proxy(s3_options: dict[str, Any], fault_proxy: FaultProxy) -> dict[str, Any]:
    return {**s3_options, "endpoint_url": fault_proxy.endpoint_url}


def test_throttling_is_retried_and_counted(
    objects: dict[str, bytes], via_proxy: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    urls = small(objects, 20)
    ds = fd.S3Dataset(urls, **via_proxy)
    fault_proxy.configure(slowdown=0.3, seed=2)
    got = ds.__getitems__(list(range(20)))
    assert [s["bin"] for s in got] == [objects[u] for u in urls]
    injected = fault_proxy.stats().get("slowdown", 0)
    counters = ds.counters()
    assert injected > 0
    assert counters["s3_throttles"] == injected and counters["s3_retries"] >= injected
    assert counters["skipped"] == 0


@pytest.mark.parametrize("cut_reset", [False, True], ids=["closed", "reset"])
def test_bodies_cut_midway_are_resumed_to_identical_bytes(
    objects: dict[str, bytes], via_proxy: dict[str, Any], fault_proxy: FaultProxy, cut_reset: bool
) -> None:
    url = f"s3://{BUCKET}/big/blob.bin"
    shared = SharedState(COUNTERS)
    fault_proxy.configure(cut=0.5, cut_reset=cut_reset, seed=3)
    with S3Reader(url, part_size=256 * 1024, open_bytes=1000, stats=Stats(shared), **via_proxy) as r:
        assert r.read(0, r.size) == objects[url]
    urls = small(objects, 20)
    ds = fd.S3Dataset(urls, **via_proxy)
    assert [s["bin"] for s in ds.__getitems__(list(range(20)))] == [objects[u] for u in urls]
    cuts = fault_proxy.stats().get("cut", 0)
    assert cuts > 0
    assert shared.total("s3_resumed") + ds.counters()["s3_resumed"] == cuts  # every cut seen and resumed


def test_connections_reset_before_the_response_are_retried(
    objects: dict[str, bytes], via_proxy: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    urls = small(objects, 20)
    ds = fd.S3Dataset(urls, **via_proxy)
    fault_proxy.configure(reset=0.3, seed=4)
    assert [s["bin"] for s in ds.__getitems__(list(range(20)))] == [objects[u] for u in urls]
    resets = fault_proxy.stats().get("reset", 0)
    assert resets > 0 and ds.counters()["s3_errors"] >= resets and ds.counters()["s3_retries"] >= resets


def test_a_stall_mid_body_is_resumed(
    objects: dict[str, bytes], via_proxy: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    urls = small(objects, 8)
    ds = fd.S3Dataset(urls, read_timeout=0.5, **via_proxy)
    fault_proxy.configure(stall=0.4, stall_at="body", stall_s=3, seed=5)
    assert [s["bin"] for s in ds.__getitems__(list(range(8)))] == [objects[u] for u in urls]
    assert fault_proxy.stats().get("stall", 0) == ds.counters()["s3_resumed"] > 0


def test_a_server_that_never_answers_fails_within_the_timeouts(
    objects: dict[str, bytes], via_proxy: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    url = small(objects, 1)[0]
    fault_proxy.configure(stall=1.0, stall_s=30, seed=6)
    # 2 attempts of 0.5 s: an error after about a second, never a hang (the proxy would wait 30 s)
    with pytest.raises(S3Unavailable, match=r"read_timeout=0.5s") as e:
        S3Reader(url, read_timeout=0.5, max_attempts=2, **via_proxy)
    assert url in str(e.value)
    assert fault_proxy.stats()["stall"] == 2


def test_access_denied_is_reported_and_not_retried(
    objects: dict[str, bytes], via_proxy: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    urls = small(objects, 3)
    fault_proxy.configure(deny="/obj/0001")
    ds = fd.S3Dataset(urls, **via_proxy)
    with pytest.raises(SourceUnreadable, match=rf"{urls[1]}: access denied \(AccessDenied\)"):
        ds.__getitems__([0, 1, 2])
    assert fault_proxy.stats()["deny"] == 1  # asked once: a 403 is not retried
    skipping = fd.S3Dataset(urls, on_error="skip", **via_proxy)
    with pytest.warns(BadSampleWarning, match="access denied"):
        got = skipping.__getitems__([0, 1, 2])
    assert [s["__url__"] for s in got] == [urls[0], urls[2]] and skipping.skipped == 1


def test_missing_objects_raise_or_are_skipped_and_counted(
    objects: dict[str, bytes], s3_options: dict[str, Any]
) -> None:
    urls = small(objects, 2)
    gone = f"s3://{BUCKET}/obj/deleted.bin"
    with pytest.raises(SourceNotFound, match=rf"{gone}: no such key"):
        fd.S3Dataset([urls[0], gone, urls[1]], **s3_options).__getitems__([0, 1, 2])
    ds = fd.S3Dataset([urls[0], gone, urls[1]], on_missing="skip", **s3_options)
    with pytest.warns(BadSampleWarning, match="deleted.bin"):
        got = ds.__getitems__([0, 1, 2])
    assert [s["bin"] for s in got] == [objects[urls[0]], objects[urls[1]]]
    assert ds.skipped == 1 and ds[1]["bin"] == objects[urls[1]] and ds.skipped == 2  # ds[2] stands in
    with pytest.raises(SourceNotFound, match="no such bucket"):
        fd.S3Dataset("s3://not-a-bucket-anywhere/prefix/", **s3_options)


def test_an_object_replaced_after_listing_is_reported(
    s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    client = s3_server.client()
    upload_files(client, s3_bucket, {"a.bin": b"x" * 1000})
    ds = fd.S3Dataset(f"s3://{s3_bucket}/", **s3_options)
    upload_files(client, s3_bucket, {"a.bin": b"y" * 500})  # truncated since it was listed
    with pytest.raises(ObjectChanged, match="500 bytes, 1000 were expected"):
        ds[0]


def _collect(loader: DataLoader) -> list[tuple[str, bytes]]:
    return [(u, b) for batch in loader for u, b in zip(batch["__url__"], batch["bin"])]


@pytest.mark.slow
def test_a_full_epoch_through_20_percent_faults_yields_every_object_once(
    objects: dict[str, bytes], via_proxy: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    urls = small(objects)
    ds = fd.S3Dataset(urls, **via_proxy)
    fault_proxy.configure(slowdown=0.1, cut=0.1, seed=7)
    loader = DataLoader(
        ds,
        batch_size=6,
        sampler=ds.sampler(shuffle=True),
        num_workers=2,
        multiprocessing_context=multiprocessing.get_context("fork"),
    )
    got = _collect(loader)
    assert Counter(u for u, _ in got) == Counter(urls)  # every object exactly once
    assert all(b == objects[u] for u, b in got)  # byte for byte
    stats, counters = fault_proxy.stats(), ds.counters()
    assert stats.get("slowdown", 0) > 0 and stats.get("cut", 0) > 0
    assert counters["s3_throttles"] == stats["slowdown"] and counters["s3_resumed"] == stats["cut"]
    assert counters["skipped"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True], ids=["from-the-store", "through-the-cache"])
def test_tar_shards_on_s3_through_20_percent_faults(
    s3_server: MotoServer,
    s3_env: dict[str, str],
    fault_proxy: FaultProxy,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    cached: bool,
) -> None:
    paths = make_shards(tmp_path, shards=10, per_shard=20, seed=8)
    client = s3_server.client()
    client.create_bucket(Bucket="faults-shards")
    upload_files(client, "faults-shards", {os.path.basename(p): p for p in paths})
    local = {s["__key__"]: s["bin"] for s in fd.IndexedTarDataset(paths)}
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.endpoint_url)  # tar datasets use the AWS chain
    fault_proxy.configure(slowdown=0.1, cut=0.1, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing skipped, nothing rescanned
        ds = fd.TarShardDataset(
            "s3://faults-shards/train-{000000..000009}.tar",
            batch_size=8,
            cache_dir=tmp_path / "cache" if cached else False,
        )
        loader = DataLoader(
            ds, batch_size=None, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork")
        )
        got = [(k, b) for batch in loader for k, b in zip(batch["__key__"], batch["bin"])]
    assert sorted(k for k, _ in got) == sorted(local)  # every sample exactly once
    assert all(b == local[k] for k, b in got)
    stats = fault_proxy.stats()
    assert stats.get("slowdown", 0) + stats.get("cut", 0) > 0
