"""``fd.Mix`` over remote tar sources read from the store (``cache_dir=False``) fetches each shard byte about
once per epoch: it read each batch's few samples of a source alone, each in ranged GETs of its own, and
fetched 5-9x the shards' bytes per epoch at a tenth of the source's own speed. On the real moto server
(bytes counted at the proxy in front of it), with real workers."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import fastdata as fd
from fastdata.core.errors import EgressWarning
from tests.cache_datagen import SAMPLES, shard_samples, upload, via, webdataset_shard


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_of_remote_tar_sources_fetches_each_byte_about_once_per_epoch(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, workers: int
) -> None:
    data = {f"s{i:02d}.tar": webdataset_shard(shard_samples(i)) for i in range(6)}
    urls = upload(s3_server, s3_bucket, data)
    stored = sum(map(len, data.values()))

    def source(part: list[str]) -> fd.TarShardDataset:
        return fd.TarShardDataset(part, shuffle=True, storage_options=via(fault_proxy), cache_dir=False)

    mix = fd.Mix({"a": source(urls[:3]), "b": source(urls[3:])}, seed=1)
    loader = fd.Loader(mix, batch_size=8, num_workers=workers)
    said: list[str] = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        fault_proxy.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            keys = [k for batch in loader for k in batch["__key__"]]
        said += [str(w.message) for w in caught if issubclass(w.category, EgressWarning)]
        assert sorted(keys) == sorted(f"s{i:02d}-{j:04d}" for i in range(6) for j in range(SAMPLES))
        # (the index scan at construction is not counted: the proxy was reset after it). Each worker fetches
        # the blocks its batches draw from, and every worker's batches draw from every block: about once per
        # worker (one fetch per node needs a cache: cache_dir=); reading each batch's samples alone was 5-9x
        assert fault_proxy.stats()["bytes"] <= 1.05 * max(1, workers) * stored, (epoch, fault_proxy.stats())
    # with workers and no lanes, the workers' warning names the fix, once
    assert len(said) == (1 if workers else 0), said
    assert all("pass Mix(..., lanes=2, batch_size=the Loader's batch size)" in m and "'a', 'b'" in m for m in said)


@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_with_lanes_each_worker_fetches_blocks_of_its_own(
    s3_server: Any, s3_bucket: str, fault_proxy: Any, workers: int, context: str | None
) -> None:
    # Mix(lanes=2, batch_size=8) read by 2 workers in batches of 8: each block of a source is fetched by the one
    # worker whose batches draw from it, so each stored byte about once per epoch (without lanes: once per worker)
    data = {f"s{i:02d}.tar": webdataset_shard(shard_samples(i)) for i in range(6)}
    urls = upload(s3_server, s3_bucket, data)
    stored = sum(map(len, data.values()))

    def source(part: list[str]) -> fd.TarShardDataset:
        return fd.TarShardDataset(part, shuffle=True, storage_options=via(fault_proxy), cache_dir=False)

    mix = fd.Mix({"a": source(urls[:3]), "b": source(urls[3:])}, seed=1, lanes=2, batch_size=8)
    loader = fd.Loader(mix, batch_size=8, num_workers=workers, multiprocessing_context=context)
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        fault_proxy.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error", EgressWarning)  # lanes match the workers: nothing to say
            keys = [k for batch in loader for k in batch["__key__"]]
        # every sample once per epoch (the epoch draws one pass of each source)
        assert sorted(keys) == sorted(f"s{i:02d}-{j:04d}" for i in range(6) for j in range(SAMPLES))
        assert fault_proxy.stats()["bytes"] <= 1.05 * stored, (epoch, fault_proxy.stats())
        orders.append(keys)
    assert orders[0] != orders[1]


def test_lanes_need_the_loaders_batch_size() -> None:
    with pytest.raises(fd.ConfigError, match=r"needs batch_size= \(the Loader's batch size\)"):
        fd.Mix({"a": list(range(4)), "b": list(range(4))}, lanes=2)
