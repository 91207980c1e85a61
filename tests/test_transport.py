"""SlotCollate given to a plain DataLoader (or as a dataset's collate_fn): batches through reused slots arrive
equal to batches through the pipe, in order, under fork and spawn, and fall back to the pipe when the
slots' budget is too small for a batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.loading import transport as slots
from fastdata.loading.transport import SlotCollate
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
    slots.reset_counts()
    shared = batches(shards, SlotCollate(), 2)
    assert shared == plain and len(plain) == 20
    assert all(type(v) is bytes for b in shared for v in b["bin"])
    assert slots.stats()["slots"] == 20, "not every batch came through a slot"


def test_a_budget_too_small_for_a_batch_falls_back_to_the_pipe(shards: list[str]) -> None:
    # 8 bin members of 10..2000 bytes: most batches need more than 1 KiB of slot, none fits in 1 KiB
    slots.reset_counts()
    got = batches(shards, SlotCollate(max_bytes=1024, wait_s=0.01), 1)  # warns in the worker
    assert got == batches(shards, None, 0)
    assert slots.stats()["pipe"] == 20 and slots.stats()["slots"] == 0


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

    assert load(2, SlotCollate()) == load(0, SlotCollate()) == load(0, None)


@pytest.mark.slow
def test_spawned_workers(shards: list[str]) -> None:
    assert batches(shards, SlotCollate(), 2, "spawn") == batches(shards, None, 0)
