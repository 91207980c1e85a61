"""The node-local cache of remote shards and objects, on the real moto server, the bytes counted at the
proxy in front of it (not by fastdata's own counters): shards without sidecars (webdataset- and
tar-made) fetched once over epochs and workers, a download killed midway, a cache smaller than the data,
two datasets in one cache, an object replaced between epochs, entries open by a reader never evicted,
S3Dataset objects, and ``fastdata inspect CACHE_DIR``. The torchrun case (2 ranks x 2 workers sharing one
cache) is in tests/test_cache_distributed.py."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.convert import convert
from fastdata.inspection._cache import inspect_cache
from fastdata.storage import open_remote
from fastdata.storage.cache import CacheWarning, NodeCache
from tests.cache_datagen import (
    SAMPLES,
    keyed,
    make_corpus,
    shard_samples,
    upload,
    via,
    webdataset_shard,
)
from tests.datagen import make_image_folder

ROOT = Path(__file__).resolve().parent.parent


def epoch_of(ds: Any, epoch: int, workers: int, batched: bool) -> dict[str, bytes]:
    """The ``bin`` member of every sample of one epoch, by key (each read once)."""
    ds.set_epoch(epoch)
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        collate_fn=fd.as_is,
    )
    got: dict[str, bytes] = {}
    for item in loader:
        for s in item if batched else [item]:
            assert s["__key__"] not in got, f"{s['__key__']} read twice in epoch {epoch}"
            got[s["__key__"]] = bytes(s["bin"])
    return got


@pytest.fixture
def corpus(s3_server: Any, s3_bucket: str, tmp_path: Path) -> dict[str, Any]:
    """Four shards without sidecars or manifest, two written by webdataset and two by GNU tar."""
    return make_corpus(s3_server, s3_bucket, tmp_path)


@pytest.mark.parametrize(
    ("shuffle", "batch_size", "workers"),
    [(False, None, 0), (True, None, 2), (True, 8, 2), (False, 8, 2)],
    ids=["in-order-0w", "shuffled-per-sample-2w", "shuffled-batched-2w", "in-order-batched-2w"],
)
def test_shards_without_sidecars_are_fetched_once_over_epochs_and_workers(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path, shuffle: bool, batch_size: int | None, workers: int
) -> None:
    ds = fd.TarShardDataset(
        corpus["urls"],
        shuffle=shuffle,
        batch_size=batch_size,
        collate_fn=list if batch_size else None,
        storage_options=via(fault_proxy),
        cache_dir=tmp_path / "cache",
    )
    fetched = []
    for epoch in range(2):
        assert epoch_of(ds, epoch, workers, batch_size is not None) == corpus["expected"]
        fetched.append(fault_proxy.stats().get("bytes", 0))
    # the index is built from the bytes the samples are read from: every shard's bytes once, construction
    # and both epochs together (without the cache: 2.00x in the first epoch alone, then 1x every epoch)
    assert fetched[0] == fetched[1] == corpus["bytes"]
    counters = ds.counters()
    assert counters["cache_misses"] == 4 and counters["cache_remote_bytes"] == corpus["bytes"]
    assert counters["cache_hits"] >= 4 and counters["cache_local_bytes"] >= 2 * corpus["bytes"]


def test_shards_without_sidecars_are_fetched_once_without_a_cache_asked_for(
    corpus: dict[str, Any], fault_proxy: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # no cache_dir, no FASTDATA_CACHE_DIR: indexing a shard with no sidecar downloads it whole, so the
    # download is kept in fastdata's own cache folder and read from (it was fetched twice: 2.00x)
    monkeypatch.delenv("FASTDATA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.warns(CacheWarning, match=r"no \.idx sidecar and no manifest.*cache_dir=False"):
        ds = fd.TarShardDataset(corpus["urls"], shuffle=True, storage_options=via(fault_proxy))
    assert epoch_of(ds, 0, 2, False) == corpus["expected"]
    # construction and the epoch together: 1.00x the shards (and the two 404s that found no manifest or sidecar)
    assert corpus["bytes"] <= fault_proxy.stats()["bytes"] <= 1.01 * corpus["bytes"]
    assert (tmp_path / "xdg" / "fastdata" / "remote").is_dir()
    # asked not to cache: what it cost before, the scan and then the reads
    fault_proxy.reset()
    plain = fd.TarShardDataset(corpus["urls"], shuffle=True, storage_options=via(fault_proxy), cache_dir=False)
    assert epoch_of(plain, 0, 2, False) == corpus["expected"]
    assert fault_proxy.stats()["bytes"] >= 1.9 * corpus["bytes"]  # the scan, then the members again


def test_a_cache_smaller_than_the_data_keeps_to_its_limit_and_reads_every_sample(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path
) -> None:
    biggest = max(map(len, corpus["shards"].values()))
    # three and a half shards of four: a reader holds two open (pinned) and downloads the next
    limit = biggest * 7 // 2
    cache = tmp_path / "cache"
    ds = fd.TarShardDataset(corpus["urls"], storage_options=via(fault_proxy), cache_dir=cache, cache_limit=limit)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # never over the limit
        for epoch in range(3):
            assert epoch_of(ds, epoch, 0, False) == corpus["expected"]
            held = inspect_cache(str(cache))["totals"]
            assert held["bytes"] <= limit and held["entries"] <= 3, held
    counters = ds.counters()
    assert counters["cache_evictions"] >= 4  # read in order, least recently used first: each epoch misses
    # every shard is fetched once per epoch at most (never twice in one), construction included
    assert fault_proxy.stats()["bytes"] <= 4 * corpus["bytes"]


def test_an_entry_open_by_a_reader_is_never_evicted(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    objects = {f"o{i}.bin": os.urandom(10_000 + i) for i in range(5)}
    urls = upload(s3_server, s3_bucket, objects)
    cache = NodeCache(tmp_path / "cache", limit=25_000)  # two objects fit
    remote = open_remote(urls[0], **via(fault_proxy))
    pinned = cache.open(urls[0], remote)
    assert pinned is not None
    # another process of the node fills the cache well past its limit meanwhile
    script = (
        "import sys; from fastdata.storage import open_remote; from fastdata.storage.cache import NodeCache\n"
        f"cache = NodeCache({str(tmp_path / 'cache')!r}, limit=25_000)\n"
        f"for url in {urls[1:]!r}:\n"
        f"    cache.open(url, open_remote(url, **{via(fault_proxy)!r})).close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    held = {e["url"]: e["state"] for e in inspect_cache(str(tmp_path / "cache"))["entries"]}
    assert held[urls[0]] == "open" and urls[-1] in held and len(held) == 2, held
    assert pinned.read(0, pinned.size) == objects["o0.bin"]
    pinned.close()
    assert inspect_cache(str(tmp_path / "cache"))["entries"][0]["state"] == "complete"


def test_two_datasets_with_other_shards_share_one_cache(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    a = {f"a/shard-{i}.tar": webdataset_shard(shard_samples(i, seed=1)) for i in range(2)}
    b = {f"b/shard-{i}.tar": webdataset_shard(shard_samples(i + 10, seed=2)) for i in range(3)}
    urls_a, urls_b = upload(s3_server, s3_bucket, a), upload(s3_server, s3_bucket, b)
    cache = tmp_path / "cache"
    ds_a = fd.TarShardDataset(urls_a, shuffle=True, storage_options=via(fault_proxy), cache_dir=cache)
    ds_b = fd.IndexedTarDataset(urls_b, storage_options=via(fault_proxy), cache_dir=cache)
    want_a = {k: v for i in range(2) for k, v in keyed(shard_samples(i, seed=1)).items()}
    want_b = {k: v for i in range(3) for k, v in keyed(shard_samples(i + 10, seed=2)).items()}
    for epoch in range(2):
        assert epoch_of(ds_a, epoch, 2, False) == want_a
        loader = DataLoader(ds_b, batch_size=5, sampler=ds_b.sampler(), num_workers=2, collate_fn=list)
        ds_b.set_epoch(epoch)
        assert keyed(s for batch in loader for s in batch) == want_b
    assert fault_proxy.stats()["bytes"] == sum(map(len, a.values())) + sum(map(len, b.values()))
    held = {e["url"] for e in inspect_cache(str(cache))["entries"]}
    assert held == {*urls_a, *urls_b}


def test_an_object_replaced_between_epochs_is_read_as_it_is_now(
    corpus: dict[str, Any], s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    ds = fd.TarShardDataset(corpus["urls"], storage_options=via(fault_proxy), cache_dir=cache)
    assert epoch_of(ds, 0, 2, False) == corpus["expected"]
    new = shard_samples(1, seed=99)  # the same keys and count, other bytes: a new ETag
    new_bytes = webdataset_shard(new)
    s3_server.client().put_object(Bucket=s3_bucket, Key="train/shard-000001.tar", Body=new_bytes)
    fault_proxy.reset()
    want = {**corpus["expected"], **keyed(new)}
    assert epoch_of(ds, 1, 2, False) == want
    assert fault_proxy.stats()["bytes"] == len(new_bytes)  # the new version only; the others from the cache
    held = [e for e in inspect_cache(str(cache))["entries"] if e["url"] == corpus["urls"][1]]
    assert len(held) == 1 and held[0]["bytes"] == len(new_bytes)  # the old version is gone


def _wait_for(condition: Any, timeout: float = 60.0) -> None:
    """Wait until ``condition()`` holds (a state another process reaches), failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition was not reached"
        time.sleep(0.02)


def test_a_download_killed_midway_is_never_read_and_is_redone(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    # every GET of shard 2 is held back halfway through its body: its download stops there
    fault_proxy.configure(stall=1.0, stall_s=120, stall_at="body", only="shard-000002")
    script = (
        "import fastdata as fd\n"
        f"fd.TarShardDataset({corpus['urls']!r}, storage_options={via(fault_proxy)!r}, cache_dir={str(cache)!r})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        objects = cache / "objects"
        _wait_for(lambda: fault_proxy.stats().get("stall", 0) >= 1 and any(objects.glob("*.part")))
        child.send_signal(signal.SIGKILL)  # mid-body: no chance to clean up
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    left = inspect_cache(str(cache))["entries"]
    assert [e["state"] for e in left if e["url"] is None] == [
        "left by a killed download (deleted by the next download or eviction)"
    ]
    assert all(e["url"] != corpus["urls"][2] for e in left)  # never listed as cached
    fault_proxy.reset()
    ds = fd.TarShardDataset(corpus["urls"], storage_options=via(fault_proxy), cache_dir=cache)
    assert epoch_of(ds, 0, 2, False) == corpus["expected"]
    held = inspect_cache(str(cache))
    assert not list((cache / "objects").glob("*.part")) and held["totals"]["entries"] == 4
    # what the killed process had finished is used; the cut shard is fetched again, whole
    assert fault_proxy.stats()["bytes"] <= corpus["bytes"]
    assert ds.counters()["cache_remote_bytes"] >= len(corpus["shards"]["train/shard-000002.tar"])


def test_s3_dataset_objects_are_fetched_once_and_checked(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    objects = {f"img/{i:03d}.jpg": os.urandom(3000 + i) for i in range(20)}
    upload(s3_server, s3_bucket, objects)
    ds = fd.S3Dataset(f"s3://{s3_bucket}/img/", cache_dir=tmp_path / "cache", **via(fault_proxy))
    fault_proxy.reset()
    for epoch in range(2):
        ds.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=4, sampler=ds.sampler(), num_workers=2, collate_fn=list)
        got = {s["__key__"]: s["jpg"] for batch in loader for s in batch}
        assert got == {k[: -len(".jpg")]: v for k, v in objects.items()}
    assert fault_proxy.stats()["bytes"] == sum(map(len, objects.values()))
    counters = ds.counters()
    assert counters["cache_misses"] == 20 and counters["cache_hits"] >= 20


def test_inspect_shows_what_the_cache_holds(corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fd.TarShardDataset(corpus["urls"][:2], storage_options=via(fault_proxy), cache_dir=cache)
    out = subprocess.run(
        [sys.executable, "-m", "fastdata", "inspect", str(cache), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    assert sorted(e["url"] for e in report["entries"]) == corpus["urls"][:2]
    assert all(e["state"] == "complete" and e["etag"] for e in report["entries"])
    text = subprocess.run(
        [sys.executable, "-m", "fastdata", "inspect", str(cache)], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "2 object(s)" in text and corpus["urls"][0] in text


def test_cache_options_are_checked_at_construction(tmp_path: Path) -> None:
    with pytest.raises(fd.ConfigError, match=r"cache_limit='lots' is not a size"):
        fd.TarShardDataset("s3://bucket/a.tar", cache_dir=tmp_path, cache_limit="lots")
    with pytest.raises(fd.ConfigError, match=r"cache_limit=0: must be more than 0"):
        fd.IndexedTarDataset("s3://bucket/a.tar", cache_dir=tmp_path, cache_limit=0)


def test_tarfile_agrees_with_the_shards_read(corpus: dict[str, Any]) -> None:
    """The test corpus is what tarfile reads (so the comparisons above are with real tar files)."""
    for data in corpus["shards"].values():
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            assert len([m for m in t.getmembers() if m.isfile()]) == 2 * SAMPLES


def test_converted_shards_with_sidecars_and_manifest_are_fetched_once(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, tmp_path: Path
) -> None:
    make_image_folder(tmp_path / "src", classes=2, per_class=20)
    convert(tmp_path / "src", tmp_path / "out", shard_count=3, progress=False, fsync=False)
    files = {f"conv/{p.name}": p.read_bytes() for p in sorted((tmp_path / "out").iterdir()) if p.is_file()}
    upload(s3_server, s3_bucket, files)
    urls = [f"s3://{s3_bucket}/{k}" for k in files if k.endswith(".tar")]
    fault_proxy.reset()
    ds = fd.TarShardDataset(
        urls,
        shuffle=True,
        batch_size=4,
        collate_fn=list,
        storage_options=via(fault_proxy),
        cache_dir=tmp_path / "cache",
    )
    local = fd.TarShardDataset(sorted(str(p) for p in (tmp_path / "out").glob("*.tar")))
    want = {s["__key__"]: bytes(s["jpg"]) for s in local}
    for epoch in range(2):
        ds.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", collate_fn=fd.as_is)
        got = {s["__key__"]: bytes(s["jpg"]) for batch in loader for s in batch}
        assert got == want
    # the shards, their .idx sidecars and the manifest: each object's bytes once for both epochs
    assert fault_proxy.stats()["bytes"] == sum(map(len, files.values()))


@pytest.mark.parametrize("check", ["epoch", "build"])
def test_the_store_is_asked_for_versions_at_most_once_per_process_and_epoch_or_once(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path, check: str
) -> None:
    ds = fd.TarShardDataset(
        corpus["urls"],
        shuffle=True,
        batch_size=8,
        collate_fn=list,
        storage_options=via(fault_proxy),
        cache_dir=tmp_path / "cache",
        cache_check=check,
    )
    assert epoch_of(ds, 0, 2, True) == corpus["expected"]
    fault_proxy.reset()
    # both workers open every shard (batches are dealt to them in turn) and look for its sidecar
    assert epoch_of(ds, 1, 2, True) == corpus["expected"]
    asked = fault_proxy.stats().get("requests", 0)
    # "epoch": a HEAD per shard, by whichever worker opens it first (the other one uses its answer when
    # its own epoch began before it was asked: at most one per worker); the indexes came with the
    # workers from the dataset's construction, so no sidecar is looked for again. "build": none at all
    if check == "epoch":
        assert len(corpus["urls"]) <= asked <= 2 * len(corpus["urls"])
    else:
        assert asked == 0
    assert fault_proxy.stats().get("bytes", 0) == 0


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_read_in_the_main_process_then_by_workers(
    corpus: dict[str, Any], fault_proxy: Any, tmp_path: Path, context: str
) -> None:
    """A pass in the main process leaves read-ahead queued on its threads; workers forked (or spawned)
    after it must not wait on what those threads will never give them."""
    ds = fd.TarShardDataset(
        corpus["urls"], shuffle=True, storage_options=via(fault_proxy), cache_dir=tmp_path / "cache"
    )
    assert keyed(ds) == corpus["expected"]
    ds.set_epoch(1)
    loader = DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=context, collate_fn=fd.as_is, timeout=120
    )
    assert keyed(loader) == corpus["expected"]
    assert fault_proxy.stats()["bytes"] == corpus["bytes"]
