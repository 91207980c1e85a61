"""S3Dataset: where its objects come from (prefix, URLs, manifest, cached listing), what a sample is,
decoding, bad options, and fetching ahead; against a real S3 server (moto) on 127.0.0.1."""

from __future__ import annotations

import json
import multiprocessing
from functools import partial
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader, SequentialSampler

import fastdata as fd
from fastdata.core.errors import BadSampleWarning, ConfigError, DecodeFailed, SourceNotFound
from fastdata.datasets._s3 import sample_key
from fastdata.storage.s3._client import S3Config, client
from fastdata.storage.s3._reader import executor
from tests.datagen import jpeg_bytes
from tests.s3_server import MotoServer, upload_files


@pytest.fixture
def prefix(s3_server: MotoServer, s3_bucket: str) -> tuple[str, dict[str, bytes]]:
    """23 objects under ``s3://BUCKET/data/`` (one in a sub-folder), a folder marker, and an object
    outside the prefix."""
    rng = np.random.default_rng(1)
    files = {f"data/{i:03d}.bin": rng.bytes(int(rng.integers(1, 500))) for i in range(22)}
    files["data/sub/x.v2.bin"] = b"nested"
    client = s3_server.client()
    upload_files(client, s3_bucket, {**files, "data/empty-folder/": b"", "other/y.bin": b"not listed"})
    return f"s3://{s3_bucket}/data/", {f"s3://{s3_bucket}/{k}": v for k, v in files.items()}


def test_a_prefix_is_listed_once_across_pages(prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any]) -> None:
    url, files = prefix
    ds = fd.S3Dataset(url, page_size=5, **s3_options)  # 5 pages
    assert ds.urls == sorted(files) and len(ds) == 23
    assert ds.counters()["s3_requests"] == 5
    assert [ds[i]["bin"] for i in range(len(ds)) if "sub" not in ds.urls[i]] == [
        files[u] for u in sorted(files) if "sub" not in u
    ]
    nested = ds[ds.urls.index(url + "sub/x.v2.bin")]
    assert nested == {"__key__": "data/sub/x", "__url__": url + "sub/x.v2.bin", "v2.bin": b"nested"}


def test_sample_keys_follow_webdataset() -> None:
    assert sample_key("s3://b/a/b.c/name.tar.gz") == ("a/b.c/name", "tar.gz")
    assert sample_key("s3://b/a/README") == ("a/README", "data")
    assert sample_key("s3://b/x.JPG") == ("x", "jpg")


def test_the_listing_is_cached_to_a_file(
    prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any], s3_server: MotoServer, tmp_path: Any
) -> None:
    url, files = prefix
    cache = tmp_path / "listing.json"
    first = fd.S3Dataset(url, cache=cache, **s3_options)
    assert json.loads(cache.read_text())["urls"] == first.urls
    upload_files(s3_server.client(), url.split("/")[2], {"data/zz-new.bin": b"after"})
    again = fd.S3Dataset(url, cache=cache, **s3_options)
    assert again.urls == first.urls and again.counters()["s3_requests"] == 0  # not listed again
    other = fd.S3Dataset(url + "sub/", cache=cache, **s3_options)  # another prefix: listed, cache replaced
    assert other.urls == [url + "sub/x.v2.bin"]
    assert len(fd.S3Dataset(url, **s3_options)) == len(files) + 1


def test_urls_and_manifests(
    prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any], s3_server: MotoServer, tmp_path: Any
) -> None:
    url, files = prefix
    chosen = sorted(files)[:4]
    assert fd.S3Dataset(chosen, **s3_options).urls == chosen
    text = tmp_path / "keys.txt"
    text.write_text("# four objects\n" + "\n".join(chosen) + "\n\n")
    assert fd.S3Dataset(str(text), **s3_options)[3]["bin"] == files[chosen[3]]
    bucket = url.split("/")[2]
    upload_files(s3_server.client(), bucket, {"lists/some.json": json.dumps(chosen[::-1]).encode()})
    assert fd.S3Dataset(f"s3://{bucket}/lists/some.json", **s3_options).urls == chosen[::-1]
    with pytest.raises(ConfigError, match="names a prefix"):
        fd.S3Dataset([url], **s3_options)
    with pytest.raises(ConfigError, match="give an s3://bucket/prefix/"):
        fd.S3Dataset("/local/folder", **s3_options)
    with pytest.raises(SourceNotFound, match="no objects under this prefix"):
        fd.S3Dataset(f"s3://{bucket}/nothing-here/", **s3_options)


def test_options_are_checked_at_construction(s3_options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="on_missing='ignore' is not one of 'raise', 'skip'"):
        fd.S3Dataset(["s3://b/k"], on_missing="ignore", **s3_options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_error='warn'"):
        fd.S3Dataset(["s3://b/k"], on_error="warn", **s3_options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown S3 option.*retries"):
        fd.S3Dataset(["s3://b/k"], retries=3, **s3_options)


def test_decode_transform_and_bad_images(s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]) -> None:
    rng = np.random.default_rng(2)
    upload_files(
        s3_server.client(),
        s3_bucket,
        {"img/a.jpg": jpeg_bytes(rng, (16, 8)), "img/b.jpg": b"not a jpeg", "img/c.jpg": jpeg_bytes(rng, (16, 8))},
    )
    url = f"s3://{s3_bucket}/img/"
    ds = fd.S3Dataset(url, decode="numpy", transform=lambda s: s["jpg"].shape, **s3_options)
    assert ds[0] == (8, 16, 3)
    with pytest.raises(DecodeFailed, match=r"img/b\.jpg.*cannot decode"):
        ds[1]
    skipping = fd.S3Dataset(url, decode="numpy", on_error="skip", **s3_options)
    with pytest.warns(BadSampleWarning):
        batch = skipping.__getitems__([0, 1, 2])
    assert len(batch) == 2 and skipping.skipped == 1
    # a batch of only bad samples: the next good one stands in (tests/test_substitute.py)
    assert [s["__key__"] for s in skipping.__getitems__([1])] == ["img/c"]
    assert skipping.skipped == 2 and skipping.counters()["substituted"] == 1


def payload(sample: dict[str, Any]) -> bytes:
    return next(v for k, v in sample.items() if not k.startswith("__"))


def _loader(ds: fd.S3Dataset, num_workers: int, **kw: Any) -> DataLoader:
    ctx = multiprocessing.get_context("fork") if num_workers else None
    return DataLoader(
        ds, batch_size=4, num_workers=num_workers, multiprocessing_context=ctx, collate_fn=lambda batch: batch, **kw
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_next_batch_is_fetched_ahead(
    prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any], num_workers: int
) -> None:
    url, files = prefix
    ds = fd.S3Dataset(url, **s3_options)
    listed = ds.counters()["s3_requests"]
    got = [payload(s) for batch in _loader(ds, num_workers, sampler=ds.sampler(shuffle=True)) for s in batch]
    assert sorted(got) == sorted(files.values())
    counters = ds.counters()
    # every batch but each worker's first came from a fetch started while an earlier one was used
    assert counters["s3_prefetch_hits"] >= len(ds) - 4 * (num_workers or 1) - 4
    assert counters["s3_requests"] - listed <= len(ds) + 4 * (num_workers or 1)  # next to nothing wasted


def test_no_guessing_without_its_sampler(prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any]) -> None:
    url, files = prefix
    ds = fd.S3Dataset(url, **s3_options)
    ds.sampler()  # made, but the loader uses another order: lookahead must notice and fetch nothing extra
    listed = ds.counters()["s3_requests"]
    got = [payload(s) for batch in _loader(ds, 0, sampler=SequentialSampler(ds)) for s in batch]
    assert sorted(got) == sorted(files.values())
    assert ds.counters()["s3_requests"] - listed == len(ds) and ds.counters()["s3_prefetch_hits"] == 0
    off = fd.S3Dataset(url, lookahead=0, **s3_options)
    list(_loader(off, 0, sampler=off.sampler()))
    assert off.counters()["s3_prefetch_hits"] == 0


def _pool_sizes(config: S3Config, sample: dict[str, Any]) -> tuple[int, int]:
    """Run in the process that reads: its thread pool's size and its client's connection pool."""
    return executor(config)._max_workers, client(config).meta.config.max_pool_connections


def test_threads_and_connections_are_sized_per_worker(
    prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any]
) -> None:
    url, _ = prefix
    config = S3Config.from_options(**s3_options)
    ds = fd.S3Dataset(url, config=config, transform=partial(_pool_sizes, config))
    assert ds[0] == (16, 20)  # the main process reads alone: all 16 threads, a connection each (+4)
    sizes = {s for batch in _loader(ds, 2, sampler=ds.sampler()) for s in batch}
    assert sizes == {(8, 12)}  # two workers share the 16
    fixed = S3Config.from_options(concurrency=3, **s3_options)
    assert fd.S3Dataset(url, config=fixed, transform=partial(_pool_sizes, fixed))[0] == (3, 7)


def test_each_object_costs_one_get(
    prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any], objects_of_every_size: dict[str, bytes]
) -> None:
    url, files = prefix
    listed = fd.S3Dataset(url, lookahead=0, **s3_options)  # sizes from the listing
    before = listed.counters()["s3_requests"]
    assert [payload(s) for s in listed.__getitems__(list(range(len(listed))))] == [files[u] for u in listed.urls]
    assert listed.counters()["s3_requests"] - before == len(listed)
    # sizes unknown (a list of URLs): one GET for an object under 256 KiB, a second for the rest of a larger one
    urls = sorted(objects_of_every_size)
    unlisted = fd.S3Dataset(urls, lookahead=0, **s3_options)
    assert [payload(s) for s in unlisted.__getitems__(list(range(len(urls))))] == [
        objects_of_every_size[u] for u in urls
    ]
    large = sum(len(objects_of_every_size[u]) > 256 * 1024 for u in urls)
    assert large == 2 and unlisted.counters()["s3_requests"] == len(urls) + large


@pytest.fixture
def objects_of_every_size(s3_server: MotoServer, s3_bucket: str) -> dict[str, bytes]:
    """Objects of 1 byte, just under, at and over the first GET's 256 KiB, and of 5 MiB."""
    rng = np.random.default_rng(3)
    sizes = {"a": 1, "b": 256 * 1024 - 1, "c": 256 * 1024, "d": 256 * 1024 + 1, "e": 5 << 20}
    files = {f"sized/{k}.bin": rng.bytes(n) for k, n in sizes.items()}
    upload_files(s3_server.client(), s3_bucket, files)
    return {f"s3://{s3_bucket}/{k}": v for k, v in files.items()}


def _epoch_long_arrays(batch: list[dict[str, Any]]) -> tuple[list[str], bool, list[bytes]]:
    """Run as the collate_fn, in the worker: every array or tensor reachable from the worker's dataset
    that is as long as the dataset and not in shared memory (the listing's sizes aside), whether the
    dataset's plan is shared memory, and the batch's payloads."""
    import gc

    import torch
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    assert info is not None
    ds = info.dataset
    n, private, seen, todo = len(ds), [], {id(ds)}, [ds]

    def shared(a: Any) -> bool:
        while isinstance(a, np.ndarray):
            a = a.base
        return isinstance(a, torch.Tensor) and a.is_shared()

    while todo and len(seen) < 200_000:
        obj = todo.pop()
        if obj is ds.sizes or isinstance(obj, (type, type(gc), type(_epoch_long_arrays))):
            continue
        if isinstance(obj, (np.ndarray, torch.Tensor)):
            if obj.ndim and len(obj) >= n and not shared(obj):
                private.append(f"{type(obj).__name__}[{len(obj)}]")
            continue
        for ref in gc.get_referents(obj):
            if id(ref) not in seen:
                seen.add(id(ref))
                todo.append(ref)
    return private, ds._plan._tensor.is_shared(), [payload(s) for s in batch]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_read_ahead_from_one_shared_plan(
    prefix: tuple[str, dict[str, bytes]], s3_options: dict[str, Any], context: str
) -> None:
    url, files = prefix
    ds = fd.S3Dataset(url, **s3_options)
    loader = DataLoader(
        ds,
        batch_size=3,
        sampler=ds.sampler(shuffle=True),
        num_workers=2,
        multiprocessing_context=multiprocessing.get_context(context),
        collate_fn=_epoch_long_arrays,
        persistent_workers=True,  # the workers keep the dataset they started with: the plan must follow
    )
    got = []
    for private, plan_shared, payloads in loader:
        assert private == [] and plan_shared  # no worker holds an order of its own
        got += payloads
    assert sorted(got) == sorted(files.values())
    hits = ds.counters()["s3_prefetch_hits"]
    assert hits > 0  # the workers did learn the order: from the shared plan
    ds.set_epoch(1)  # a new epoch: the plan of epoch 0 must not be used, the new one must
    again = [p for _, _, payloads in loader for p in payloads]
    assert sorted(again) == sorted(got) and again != got
    assert ds.counters()["s3_prefetch_hits"] > hits
