"""TarShardDataset and IndexedTarDataset pass the shared conformance suite."""

from __future__ import annotations

import pytest

import fastdata as fd
from tests.conformance import Backend, Conformance
from tests.datagen import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    # 3 shards of 11: fewer shards than 2 ranks x 3 workers, and counts that do not divide evenly
    return make_shards(tmp_path_factory.mktemp("shards"), shards=3, per_shard=11, seed=1)


EXPECTED = [f"s{i:06d}" for i in range(33)]


def keys_of(batch: dict) -> list[str]:
    return list(batch["__key__"])


class TestTarShardDataset(Conformance):
    @pytest.fixture
    def backend(self, shards: list[str]) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.TarShardDataset:
            return fd.TarShardDataset(shards, seed=seed, shuffle=shuffle, shuffle_window=8, batch_size=4)

        return Backend(make, EXPECTED, keys_of, iterable=True)


class TestIndexedTarDataset(Conformance):
    @pytest.fixture
    def backend(self, shards: list[str]) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.IndexedTarDataset:
            return fd.IndexedTarDataset(shards, seed=seed)

        return Backend(make, EXPECTED, keys_of, iterable=False)
