"""``fastdata convert SRC s3://bucket/prefix --format tar``: against a real S3 server (moto) on 127.0.0.1.

Round trip through both tar datasets on S3, the staging folder and its clean-up, a refused prefix, a
failed upload (no manifest) then a resumed run through injected faults, and a SIGKILLed CLI run resumed.
Buckets are versioned, so "nothing was uploaded twice" is a count of each object's versions.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.cli import main
from fastdata.convert import convert
from fastdata.convert._remote import staging_folder
from fastdata.core.errors import ConfigError, SourceUnreadable
from tests.datagen import make_image_folder
from tests.fault_proxy import FaultProxy
from tests.s3_server import MotoServer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[bytes, int]]]:
    """An ImageFolder tree of 3 classes; key -> (JPEG bytes, label)."""
    root = tmp_path_factory.mktemp("corpus")
    files = {}
    for rel, label in make_image_folder(root, classes=3, per_class=9, seed=4):
        files[rel.rsplit(".", 1)[0]] = ((root / rel).read_bytes(), label)
    return root, files


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # the default staging folder is in the user's cache folder: keep the tests out of $HOME
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def versioned(server: MotoServer, bucket: str) -> str:
    server.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return bucket


def versions(server: MotoServer, bucket: str, prefix: str) -> Counter[str]:
    """How many times each key under ``prefix`` was written."""
    listing = server.client().list_object_versions(Bucket=bucket, Prefix=prefix)
    return Counter(v["Key"][len(prefix) :] for v in listing.get("Versions", []))


def read_back(url: str, files: dict[str, tuple[bytes, int]], options: dict[str, Any]) -> None:
    """Both tar datasets read every sample once from S3, with the source file's bytes and label."""
    streamed = fd.TarShardDataset(url, storage_options=options, batch_size=5)
    indexed = fd.IndexedTarDataset(url, storage_options=options)
    for samples in ([s for batch in streamed for s in _unbatch(batch)], [indexed[i] for i in range(len(indexed))]):
        keys = Counter(s["__key__"] for s in samples)
        assert keys == Counter(list(files)), "samples missing, repeated or unexpected"
        for s in samples:
            assert s["jpg"] == files[s["__key__"]][0] and int(s["cls"]) == files[s["__key__"]][1]
    streamed.close()
    indexed.close()


def _unbatch(batch: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(batch, values)) for values in zip(*batch.values())]


def test_convert_to_s3_then_read_back_with_both_tar_datasets(
    corpus, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], _cache_dir: Path
) -> None:
    root, files = corpus
    manifest = convert(
        root,
        f"s3://{s3_bucket}/train",
        shard_count=5,
        workers=2,
        progress=False,
        fsync=False,
        storage_options=s3_options,
    )
    assert manifest["samples"] == len(files) and len(manifest["shards"]) == 5
    names = [s["name"] for s in manifest["shards"]]
    assert versions(s3_server, s3_bucket, "train/") == Counter([*names, *(n + ".idx" for n in names), "manifest.json"])
    stored = s3_server.client().get_object(Bucket=s3_bucket, Key="train/manifest.json")["Body"].read()
    assert json.loads(stored) == manifest
    read_back(f"s3://{s3_bucket}/train/{manifest['pattern']}", files, s3_options)
    # the staging folder (in the cache folder by default) is gone once the manifest is uploaded
    staging = staging_folder(f"s3://{s3_bucket}/train")
    assert staging.startswith(str(_cache_dir / "convert-staging")) and not Path(staging).exists()


def test_a_prefix_holding_other_objects_is_refused_before_anything_is_written(
    corpus, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    s3_server.client().put_object(Bucket=s3_bucket, Key="train/notes.txt", Body=b"someone else's")
    with pytest.raises(ConfigError, match=r"holds 1 object\(s\) this conversion would not write, like 'notes.txt'"):
        convert(
            corpus[0],
            f"s3://{s3_bucket}/train",
            shard_count=2,
            progress=False,
            staging=tmp_path / "stage",
            storage_options=s3_options,
        )
    assert not (tmp_path / "stage").exists()
    # options that only an s3:// output takes, and a format that cannot go there
    with pytest.raises(ConfigError, match="s3:// outputs only"):
        convert(corpus[0], tmp_path / "local", staging=tmp_path / "stage", progress=False)
    with pytest.raises(ConfigError, match="format='hdf5' writes local files"):
        convert(corpus[0], f"s3://{s3_bucket}/h5", format="hdf5", progress=False)
    assert main(["convert", str(corpus[0]), str(tmp_path / "local"), "--endpoint-url", "http://x:1"]) == 2


def test_a_failed_upload_leaves_no_manifest_and_a_rerun_through_faults_completes(
    corpus, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    root, files = corpus
    versioned(s3_server, s3_bucket)
    url = f"s3://{s3_bucket}/out"
    through_proxy = {**s3_options, "endpoint_url": fault_proxy.endpoint_url}
    fault_proxy.configure(deny="shard-000003.tar", methods=["PUT"])
    with pytest.raises(SourceUnreadable, match=r"shard-000003\.tar(\.idx)?: access denied"):
        convert(root, url, shard_count=6, progress=False, fsync=False, staging=tmp_path, storage_options=through_proxy)
    assert "manifest.json" not in versions(s3_server, s3_bucket, "out/")
    assert os.path.isdir(staging_folder(url, tmp_path)), "the staging folder is what a rerun resumes from"
    before = versions(s3_server, s3_bucket, "out/")
    # the rerun: one PUT, HEAD or GET in ten answered 503 SlowDown (botocore retries them)
    fault_proxy.configure(slowdown=0.1, methods=["PUT", "HEAD", "GET"], listings=True, seed=3)
    manifest = convert(
        root, url, shard_count=6, progress=False, fsync=False, staging=tmp_path, storage_options=through_proxy
    )
    assert fault_proxy.stats().get("slowdown", 0) > 0
    written = versions(s3_server, s3_bucket, "out/")
    assert set(written) >= set(before) and max(written.values()) == 1, "an object was uploaded twice"
    assert len(written) == 2 * 6 + 1 and not Path(staging_folder(url, tmp_path)).exists()
    read_back(f"{url}/{manifest['pattern']}", files, s3_options)


@pytest.mark.slow
def test_a_killed_cli_run_resumes_and_uploads_nothing_twice(
    corpus, s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    root, files = corpus
    versioned(s3_server, s3_bucket)
    url = f"s3://{s3_bucket}/killed"
    staging = Path(staging_folder(url, tmp_path))
    args = [
        str(root),
        url,
        "--shard-count",
        "27",
        "--workers",
        "2",
        "--shuffle",
        "--seed",
        "1",
        "--quiet",
        "--staging",
        str(tmp_path),
        "--no-fsync",
    ]
    # one PUT in ten is held back (its response only: the server has the object) for longer than the
    # test, so the run cannot get to its manifest before it is killed
    fault_proxy.configure(stall=0.1, stall_s=120, methods=["PUT"], seed=5)
    env = {**os.environ, **s3_server.env(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastdata", "convert", *args, "--endpoint-url", fault_proxy.endpoint_url],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and len(_uploaded(staging)) < 3:
            time.sleep(0.01)  # polling the records the run writes: there is no event to wait on
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode() if proc.stderr else ""
    uploaded = _uploaded(staging)
    assert len(uploaded) >= 3, "no shard was uploaded before the kill"
    before = versions(s3_server, s3_bucket, "killed/")
    assert "manifest.json" not in before and set(uploaded) <= set(before)
    fault_proxy.reset()
    # the same command again (in this process, to save a second start-up of the command)
    options = dict(shard_count=27, workers=2, shuffle=True, seed=1, progress=False, fsync=False)
    manifest = convert(root, url, staging=tmp_path, storage_options=s3_options, **options)  # type: ignore[arg-type]
    assert not staging.exists()
    written = versions(s3_server, s3_bucket, "killed/")
    assert max(written.values()) == 1, f"uploaded twice: {[k for k, n in written.items() if n > 1]}"
    stored = json.loads(s3_server.client().get_object(Bucket=s3_bucket, Key="killed/manifest.json")["Body"].read())
    assert stored == manifest and len(written) == 2 * 27 + 1
    clean = convert(root, tmp_path / "clean", **options)  # type: ignore[arg-type]
    # the same shards as a local conversion; an s3:// output's digest is SHA-256 (the store checks it),
    # a local one's the fast one
    local_sha256 = [hashlib.sha256((tmp_path / "clean" / s["name"]).read_bytes()).hexdigest() for s in clean["shards"]]
    assert [s.pop("sha256") for s in manifest["shards"]] == local_sha256 and manifest["samples"] == len(files)
    assert manifest["shards"] == [{k: v for k, v in s.items() if k != "xxh3_128"} for s in clean["shards"]]
    read_back(f"{url}/{manifest['pattern']}", files, s3_options)


def _uploaded(staging: Path) -> list[str]:
    """Shards the run has recorded as uploaded and verified."""
    out = []
    done = staging / ".fastdata-convert" / "done"
    for p in done.glob("*.json") if done.is_dir() else []:
        try:
            if json.loads(p.read_text()).get("uploaded"):
                out.append(p.name[: -len(".json")])
        except ValueError:
            continue  # being replaced right now
    return out
