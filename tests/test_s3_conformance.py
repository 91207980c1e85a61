"""S3Dataset, and TarShardDataset and IndexedTarDataset on tar shards in S3, pass the shared
conformance suite against a real S3 server (moto, over HTTP on 127.0.0.1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata as fd
from tests.conformance import Backend, Conformance
from tests.datagen import make_shards
from tests.s3_server import MotoServer, upload_files

EXPECTED = [f"s{i:06d}" for i in range(33)]
SHARD_DIR: list[str] = []  # where shard_urls wrote the shards it uploaded


def keys_of(batch: dict) -> list[str]:
    return [k.rsplit("/", 1)[-1] for k in batch["__key__"]]


@pytest.fixture(scope="module")
def objects_prefix(s3_server: MotoServer) -> str:
    client = s3_server.client()
    client.create_bucket(Bucket="conformance-objects")
    rng = np.random.default_rng(5)
    upload_files(
        client, "conformance-objects", {f"set/{k}.bin": rng.bytes(int(rng.integers(10, 3000))) for k in EXPECTED}
    )
    return "s3://conformance-objects/set/"


@pytest.fixture(scope="module")
def shard_urls(s3_server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    # 3 shards of 11, as in the local tar conformance: fewer shards than workers, uneven splits
    folder = tmp_path_factory.mktemp("shards")
    SHARD_DIR[:] = [str(folder)]
    paths = make_shards(folder, shards=3, per_shard=11, seed=1)
    client = s3_server.client()
    client.create_bucket(Bucket="conformance-shards")
    upload_files(client, "conformance-shards", {f"tar/{os.path.basename(p)}": p for p in paths})
    return "s3://conformance-shards/tar/train-{000000..000002}.tar"


class TestS3Dataset(Conformance):
    @pytest.fixture
    def backend(self, objects_prefix: str, s3_options: dict[str, Any]) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.S3Dataset:
            return fd.S3Dataset(objects_prefix, seed=seed, **s3_options)

        return Backend(make, EXPECTED, keys_of, iterable=False)


class TestTarShardDatasetOnS3(Conformance):
    @pytest.fixture
    def backend(self, shard_urls: str, s3_env: dict[str, str]) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.TarShardDataset:
            return fd.TarShardDataset(shard_urls, seed=seed, shuffle=shuffle, shuffle_window=8, batch_size=4)

        return Backend(make, EXPECTED, keys_of, iterable=True)


class TestIndexedTarDatasetOnS3(Conformance):
    # Workers under fork only: the spawn path (TarSource pickled without readers, a client built in the
    # spawned worker from the environment) is the one TestTarShardDatasetOnS3 proves, and two more
    # spawn runs would cost ~20 s of this project's test budget.
    @pytest.mark.parametrize("context", ["fork"])
    @pytest.mark.parametrize("num_workers", [0, 2, 3])
    def test_every_sample_exactly_once(self, backend: Backend, num_workers: int, context: str) -> None:
        super().test_every_sample_exactly_once(backend, num_workers, context)

    @pytest.fixture
    def backend(self, shard_urls: str, s3_env: dict[str, str]) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.IndexedTarDataset:
            return fd.IndexedTarDataset(shard_urls, seed=seed)

        return Backend(make, EXPECTED, keys_of, iterable=False)


class TestTarShardDatasetThroughACache(Conformance):
    """Remote shards read from a node-local cache, with a limit of two of the three shards (each worker
    holds at most two open: eviction and pins under every mode of the suite)."""

    @pytest.fixture
    def backend(self, shard_urls: str, s3_env: dict[str, str], tmp_path: Path) -> Backend:
        limit = 3 * max(p.stat().st_size for p in Path(SHARD_DIR[0]).glob("*.tar"))

        def make(seed: int, shuffle: bool) -> fd.TarShardDataset:
            return fd.TarShardDataset(
                shard_urls,
                seed=seed,
                shuffle=shuffle,
                shuffle_window=8,
                batch_size=4,
                cache_dir=tmp_path / "cache",
                cache_limit=limit,
            )

        return Backend(make, EXPECTED, keys_of, iterable=True)


class TestS3DatasetThroughACache(Conformance):
    @pytest.mark.parametrize("context", ["fork"])
    @pytest.mark.parametrize("num_workers", [0, 2, 3])
    def test_every_sample_exactly_once(self, backend: Backend, num_workers: int, context: str) -> None:
        super().test_every_sample_exactly_once(backend, num_workers, context)

    @pytest.fixture
    def backend(self, objects_prefix: str, s3_options: dict[str, Any], tmp_path: Path) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.S3Dataset:
            return fd.S3Dataset(objects_prefix, seed=seed, cache_dir=tmp_path / "cache", **s3_options)

        return Backend(make, EXPECTED, keys_of, iterable=False)
