"""``TarShardDataset(stream=True)`` over ``s3://`` shards without sidecars and no cache: building it fetches
nothing, and every epoch (the first too) fetches each stored byte once and reads each sample once, per sample
and batched, with real workers (fork and spawn); what it gives up (``len()``, a resume position, a place in a
``Mix``) is refused with the fix. Indexed, the first epoch fetched about twice the bytes (a scan to count the
samples, then the reads). Bytes are counted at the proxy in front of the moto server."""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import ConfigError
from tests.cache_datagen import SAMPLES, shard_samples, upload, via, webdataset_shard

SHARDS = 6
ALL_KEYS = sorted(f"s{i:02d}-{j:04d}" for i in range(SHARDS) for j in range(SAMPLES))


@pytest.fixture
def corpus(s3_server: Any, s3_bucket: str) -> tuple[list[str], int]:
    data = {f"s{i:02d}.tar": webdataset_shard(shard_samples(i)) for i in range(SHARDS)}
    return upload(s3_server, s3_bucket, data), sum(map(len, data.values()))


def keys_of(loader: Any, batched: bool) -> list[str]:
    return [k for b in loader for k in (b["__key__"] if batched else [b["__key__"]])]


@pytest.mark.parametrize(
    ("workers", "context", "batch_size"),
    [(0, None, None), (2, "fork", None), (2, "spawn", 5), (3, "fork", 4)],
)
def test_a_streamed_epoch_fetches_each_byte_once_from_the_first_epoch_on(
    corpus: tuple[list[str], int], fault_proxy: Any, workers: int, context: str | None, batch_size: int | None
) -> None:
    urls, stored = corpus
    fault_proxy.reset()
    ds = fd.TarShardDataset(
        urls, shuffle=True, batch_size=batch_size, storage_options=via(fault_proxy), cache_dir=False, stream=True
    )
    assert fault_proxy.stats().get("bytes", 0) == 0  # nothing fetched to build it (no scan to count samples)
    loader = DataLoader(
        ds,
        batch_size=None if batch_size else 4,
        num_workers=workers,
        multiprocessing_context=context,
        persistent_workers=workers > 0,
    )
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        fault_proxy.reset()
        keys = keys_of(loader, batched=True)
        assert sorted(keys) == ALL_KEYS, epoch  # every sample once, none lost
        fetched = fault_proxy.stats()["bytes"]
        # each byte once (the indexed first epoch: ~2x); the rest are request/response headers
        assert stored <= fetched <= 1.02 * stored, (epoch, fetched, stored)
        orders.append(keys)
    assert orders[0] != orders[1]  # a new order every epoch
    if batch_size:  # each worker batches its own shards: its last batch may be smaller, none larger
        assert all(len(b["__key__"]) <= batch_size for b in loader)


def test_a_streamed_epoch_is_split_over_ranks_and_seeded(corpus: tuple[list[str], int], fault_proxy: Any) -> None:
    urls, _ = corpus
    opts = via(fault_proxy)

    def read(rank: int, seed: int = 3) -> list[str]:
        ds = fd.TarShardDataset(
            urls, shuffle=True, seed=seed, rank=rank, world_size=2, storage_options=opts, cache_dir=False, stream=True
        )
        return [s["__key__"] for s in ds]

    ranks = [read(0), read(1)]
    assert sorted(ranks[0] + ranks[1]) == ALL_KEYS  # the ranks' shards are disjoint, and cover the epoch
    assert ranks[0] == read(0)  # the same order for the same seed and epoch
    assert ranks[0] != read(0, seed=4)


def test_what_streaming_gives_up_is_refused_with_the_fix(corpus: tuple[list[str], int], fault_proxy: Any) -> None:
    urls, _ = corpus
    ds = fd.TarShardDataset(urls, storage_options=via(fault_proxy), batch_size=4, stream=True)
    with pytest.raises(TypeError, match="stream=True reads its shards without counting"):
        len(ds)
    with pytest.raises(ConfigError, match="has no resume position; build it without stream=True"):
        ds.state_dict()
    with pytest.raises(ConfigError, match="cannot draw from it by position; build it without stream=True"):
        fd.Mix({"a": ds, "b": ds})
    few = fd.TarShardDataset(urls, storage_options=via(fault_proxy), rank=0, world_size=8, stream=True)
    with pytest.warns(UserWarning, match="6 shards for 8 rank"):
        assert len(list(few)) == SAMPLES  # rank 0 of 8 reads one whole shard; ranks 6 and 7 none
    with pytest.raises(ConfigError, match="pass cache_dir= without stream=True"):
        fd.TarShardDataset(urls, storage_options=via(fault_proxy), cache_dir="/tmp/x", stream=True)


def test_a_missing_shard_is_handed_to_on_error(corpus: tuple[list[str], int], fault_proxy: Any, s3_bucket: str) -> None:
    urls, _ = corpus
    gone = [*urls[:2], f"s3://{s3_bucket}/missing.tar"]
    ds = fd.TarShardDataset(gone, storage_options=via(fault_proxy), stream=True, on_error="skip")
    with pytest.warns(UserWarning):
        keys = sorted(s["__key__"] for s in ds)
    assert keys == [k for k in ALL_KEYS if k[:3] in ("s00", "s01")]
    assert ds.skipped == 1
    strict = fd.TarShardDataset(gone, storage_options=via(fault_proxy), stream=True)
    with pytest.raises(FileNotFoundError, match=r"missing\.tar"):
        list(strict)


@pytest.mark.parametrize(("workers", "batched"), [(0, False), (2, True)])
def test_fastdata_loader_reads_a_streamed_dataset_as_is(
    corpus: tuple[list[str], int], fault_proxy: Any, workers: int, batched: bool
) -> None:
    urls, stored = corpus
    ds = fd.TarShardDataset(
        urls,
        shuffle=True,
        storage_options=via(fault_proxy),
        cache_dir=False,
        stream=True,
        batch_size=4 if batched else None,
    )
    # the dataset batches itself, or the Loader batches its samples; never both
    loader = fd.Loader(ds, num_workers=workers) if batched else fd.Loader(ds, batch_size=4, num_workers=workers)
    with loader:
        orders = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            fault_proxy.reset()
            keys = keys_of(loader, batched=True)
            assert sorted(keys) == ALL_KEYS, epoch  # every sample once per epoch
            assert fault_proxy.stats()["bytes"] <= 1.02 * stored
            orders.append(keys)
        assert orders[0] != orders[1]  # the Loader's epoch reaches the dataset
        with pytest.raises(ConfigError, match="has no resume position; build it without stream=True"):
            loader.state_dict()  # the dataset's own reason, not a plain IterableDataset's
        with pytest.raises(TypeError, match=r"TarShardDataset has no len\(\), so neither has a Loader over it"):
            len(loader)
    with pytest.raises(ConfigError, match="the dataset batches itself; pass one or the other"):
        fd.Loader(fd.TarShardDataset(urls, storage_options=via(fault_proxy), stream=True, batch_size=4), batch_size=4)
