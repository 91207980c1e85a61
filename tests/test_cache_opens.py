"""A cached shard is opened once per worker and epoch while its samples are read, whatever the cache's limit:
shuffled windows read their shards in any order, and the bound on open readers (two per worker when the
cache has a limit, so that a small limit is kept) reopened a shard for about every sample read (1,294
opens per 1,200-sample epoch over 10 shards). On the real moto server, with real DataLoader workers."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.storage.cache import CacheWarning
from tests.cache_datagen import shard_samples, upload, via, webdataset_shard

SHARDS = 8


@pytest.fixture
def shards(s3_server: Any, s3_bucket: str) -> dict[str, Any]:
    """Eight webdataset shards (no sidecars) of 24 samples each."""
    data = {f"s{i:02d}.tar": webdataset_shard(shard_samples(i)) for i in range(SHARDS)}
    return {"urls": upload(s3_server, s3_bucket, data), "biggest": max(map(len, data.values()))}


def read_epoch(ds: Any, epoch: int, workers: int) -> int:
    ds.set_epoch(epoch)
    context = "fork" if workers else None
    loader = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=context, collate_fn=fd.as_is)
    return sum(len(item) if isinstance(item, list) else 1 for item in loader)


@pytest.mark.parametrize(
    ("cache", "batch_size", "workers"),
    [("limit", None, 0), ("limit", 8, 2), ("implicit", 8, 2), ("no-limit", 8, 2)],
    ids=["limit-per-sample-0w", "limit-batched-2w", "implicit-default-batched-2w", "no-limit-batched-2w"],
)
def test_a_cached_shard_is_opened_once_per_worker_and_epoch_whatever_the_limit(
    shards: dict[str, Any],
    fault_proxy: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cache: str,
    batch_size: int | None,
    workers: int,
) -> None:
    monkeypatch.delenv("FASTDATA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    options: dict[str, Any] = {"cache_dir": tmp_path / "cache", "cache_limit": 16 * shards["biggest"]}
    if cache == "implicit":  # no cache asked for: shards without sidecars go to fastdata's own, with a limit
        options = {}
    elif cache == "no-limit":
        options.pop("cache_limit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)  # (the implicit cache says where it keeps the shards)
        ds = fd.TarShardDataset(
            shards["urls"],
            shuffle=True,
            batch_size=batch_size,
            collate_fn=list if batch_size else None,
            storage_options=via(fault_proxy),
            **options,
        )
    built = ds.counters()["shard_opens"]
    for epoch in range(2):
        before = ds.counters()["shard_opens"]
        assert read_epoch(ds, epoch, workers) == SHARDS * 24
        opens = ds.counters()["shard_opens"] - before
        # every worker reads each shard of its part once (batched: each worker draws from every shard);
        # a reader reopened for each turn of the two-reader bound made this 24 (64 samples at a time) and 142
        assert SHARDS <= opens <= SHARDS * max(1, workers), (epoch, opens)
    assert built <= SHARDS
    assert ds.counters()["cache_misses"] == SHARDS  # and each shard fetched once
