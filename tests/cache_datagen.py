"""Remote shards for the cache tests (tests/test_cache.py, tests/test_cache_distributed.py): shards without
sidecars written by webdataset's TarWriter and by GNU tar, uploaded to the moto server, and the client
options that reach it through the counting proxy."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds

from tests.s3_server import CREDENTIALS, REGION

SAMPLES = 24  # per shard
PAYLOAD = 6000  # bytes of each sample's "bin" member


def shard_samples(shard: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng([seed, shard])
    return [
        {"__key__": f"s{shard:02d}-{i:04d}", "bin": rng.bytes(PAYLOAD + int(rng.integers(0, 900))), "cls": b"%d" % i}
        for i in range(SAMPLES)
    ]


def webdataset_shard(samples: list[dict[str, Any]]) -> bytes:
    """A shard as webdataset's TarWriter writes it (a PAX header before every member; no sidecar)."""
    buf = io.BytesIO()
    with wds.TarWriter(buf) as sink:
        for s in samples:
            sink.write(dict(s))
    return buf.getvalue()


def gnu_tar_shard(samples: list[dict[str, Any]], folder: Path) -> bytes:
    """A shard written by GNU tar itself, in name order (no sidecar)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for s in samples:
        for ext in ("bin", "cls"):
            (folder / f"{s['__key__']}.{ext}").write_bytes(s[ext])
            names.append(f"{s['__key__']}.{ext}")
    out = folder / "shard.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(out), "-C", str(folder), *names], check=True)
    return out.read_bytes()


def upload(server: Any, bucket: str, shards: dict[str, bytes]) -> list[str]:
    client = server.client()
    for key, data in shards.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)
    return [f"s3://{bucket}/{key}" for key in shards]


def via(proxy: Any) -> dict[str, Any]:
    """Client options that reach the server through the counting proxy."""
    return {"endpoint_url": proxy.endpoint_url, "region_name": REGION, **CREDENTIALS}


def keyed(samples: Any) -> dict[str, bytes]:
    return {s["__key__"]: bytes(s["bin"]) for s in samples}


def make_corpus(server: Any, bucket: str, folder: Path) -> dict[str, Any]:
    """Four shards without sidecars or manifest, two written by webdataset and two by GNU tar."""
    shards, expected = {}, {}
    for i in range(4):
        samples = shard_samples(i)
        expected.update(keyed(samples))
        data = webdataset_shard(samples) if i % 2 else gnu_tar_shard(samples, folder / f"src{i}")
        shards[f"train/shard-{i:06d}.tar"] = data
    urls = upload(server, bucket, shards)
    return {"urls": urls, "expected": expected, "bytes": sum(map(len, shards.values())), "shards": shards}
