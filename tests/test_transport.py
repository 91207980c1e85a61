"""SharedMemoryCollate: batches through a per-worker shared-memory ring arrive equal to batches through
the pipe, in order, under fork and spawn, when the ring wraps around and when it is too small."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.loading import transport
from fastdata.loading.transport import SharedMemoryCollate
from tests.datagen import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    # bin members of 10..2000 bytes: values under 1 KiB stay in the pipe, the others use the ring
    return make_shards(tmp_path_factory.mktemp("tr"), shards=4, per_shard=40, seed=7)


def batches(shards: list[str], collate: Any, num_workers: int, context: str = "fork") -> list[dict]:
    ds = fd.TarShardDataset(shards, shuffle=True, seed=2, batch_size=8, collate_fn=collate)
    loader = DataLoader(
        ds, batch_size=None, num_workers=num_workers, multiprocessing_context=context if num_workers else None
    )
    return list(loader)


def test_batches_through_shared_memory_equal_batches_through_the_pipe(shards: list[str]) -> None:
    plain = batches(shards, None, 2)
    shared = batches(shards, SharedMemoryCollate(), 2)
    assert shared == plain and len(plain) == 20
    assert all(type(v) is bytes for b in shared for v in b["bin"])
    assert transport._received, "no batch came through a ring"


@pytest.mark.parametrize("capacity", [6000, 1 << 20])  # 6000: wraps around; some values wait or use the pipe
def test_a_small_ring_wraps_around_and_falls_back_to_the_pipe(shards: list[str], capacity: int) -> None:
    collate = SharedMemoryCollate(capacity=capacity, wait_s=0.01)
    assert batches(shards, collate, 2) == batches(shards, None, 0)


def test_map_style_and_the_main_process(shards: list[str], tmp_path: Path) -> None:
    ids = fd.IndexedTarDataset(shards)

    def load(num_workers: int, collate: Any) -> list[Any]:
        return list(
            DataLoader(
                ids,
                batch_size=6,
                sampler=ids.sampler(),
                num_workers=num_workers,
                multiprocessing_context="fork" if num_workers else None,
                collate_fn=collate,
            )
        )

    assert load(2, SharedMemoryCollate()) == load(0, SharedMemoryCollate()) == load(0, None)


@pytest.mark.slow
def test_spawned_workers(shards: list[str]) -> None:
    assert batches(shards, SharedMemoryCollate(), 2, "spawn") == batches(shards, None, 0)
