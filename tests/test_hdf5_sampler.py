"""ChunkBatchSampler: exactly once per epoch, batches within chunks, per (seed, epoch), per rank, resumable."""

from __future__ import annotations

import itertools
import multiprocessing
import tracemalloc
from collections import Counter
from typing import Any

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import ConfigError, PlanError
from fastdata.loading._chunk_sampler import ChunkBatchSampler, block_sequence
from tests.hdf5_datagen import make_files

# blocks of uneven length, as files of different lengths and partial last chunks give
STARTS = np.array([0, 8, 16, 20, 28, 36, 37, 45])
N = 50


def blocks_of(batch: list[int]) -> set[int]:
    return set((np.searchsorted(STARTS, batch, side="right") - 1).tolist())


def test_every_index_once_in_sorted_batches_within_few_blocks() -> None:
    sampler = ChunkBatchSampler(STARTS, N, 6, seed=1, rank=0, world_size=1)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 9
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(N))
    assert all(b == sorted(b) for b in batches)
    # a batch of 6 from blocks of at most 8 spans at most 2 blocks, plus the odd block of 1
    assert max(len(blocks_of(b)) for b in batches) <= 3
    # whereas the same indices shuffled one by one scatter over many blocks
    scattered = np.random.default_rng(0).permutation(N)
    assert max(len(blocks_of(scattered[i : i + 6].tolist())) for i in range(0, N, 6)) > 3


def test_order_depends_on_seed_and_epoch_only() -> None:
    def order(seed: int, epoch: int) -> list[list[int]]:
        s = ChunkBatchSampler(STARTS, N, 5, seed=seed, rank=0, world_size=1)
        s.set_epoch(epoch)
        return list(s)

    assert order(3, 0) == order(3, 0)
    assert order(3, 1) != order(3, 0) and order(4, 0) != order(3, 0)
    assert sorted(i for b in order(3, 1) for i in b) == list(range(N))
    plain = ChunkBatchSampler(STARTS, N, 5, shuffle=False, rank=0, world_size=1)
    assert [i for b in plain for i in b] == list(range(N))


def test_mix_shuffles_indices_of_neighbouring_blocks_together() -> None:
    seq = block_sequence(STARTS, N, shuffle=True, seed=0, epoch=0, mix=3)
    assert sorted(seq.tolist()) == list(range(N))
    one = block_sequence(STARTS, N, shuffle=True, seed=0, epoch=0, mix=1)

    # mix=1 keeps every block in one stretch of the sequence; mix=3 interleaves neighbouring blocks
    def stretches(s: np.ndarray) -> int:
        b = np.searchsorted(STARTS, s, side="right") - 1
        return int((np.diff(b) != 0).sum()) + 1

    assert stretches(one) == len(STARTS)
    assert stretches(seq) > len(STARTS)


@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
def test_ranks_split_each_epoch(remainder: Any) -> None:
    world = 3
    per_rank = [
        [i for b in ChunkBatchSampler(STARTS, N, 4, seed=2, remainder=remainder, rank=r, world_size=world) for i in b]
        for r in range(world)
    ]
    counts = Counter(i for part in per_rank for i in part)
    sizes = [len(p) for p in per_rank]
    if remainder == "drop":
        assert sizes == [N // world] * world and max(counts.values()) == 1
    elif remainder == "pad":
        assert sizes == [-(-N // world)] * world and set(counts) == set(range(N))
        assert max(counts.values()) == 2  # the padding: a few indices read a second time, none a third
    else:
        assert sorted(counts) == list(range(N)) and max(counts.values()) == 1 and max(sizes) - min(sizes) <= 1


def test_resume_mid_epoch_continues_with_the_next_batch() -> None:
    sampler = ChunkBatchSampler(STARTS, N, 4, seed=5, rank=0, world_size=1)
    sampler.set_epoch(2)
    full = list(sampler)
    state = sampler.state_dict(consumed=12)
    assert (state["epoch"], state["unit"], state["position"]) == (2, "samples", 12)
    resumed = ChunkBatchSampler(STARTS, N, 4, seed=5, rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert list(resumed) == full[3:]
    assert list(resumed) == full  # only the first iteration after loading skips
    with pytest.raises(ConfigError, match="not a whole number of batches"):
        resumed.load_state_dict({**state, "position": 5})
    with pytest.raises(ConfigError, match="outside this rank's epoch"):
        resumed.load_state_dict({**state, "position": 51})


def test_drop_last_and_bad_arguments() -> None:
    assert [len(b) for b in ChunkBatchSampler(STARTS, N, 8, drop_last=True, rank=0, world_size=1)] == [8] * 6
    with pytest.raises(ConfigError, match="batch_size=0 must be > 0"):
        ChunkBatchSampler(STARTS, N, 0)
    with pytest.raises(ConfigError, match="block starts must increase from 0"):
        ChunkBatchSampler([0, 9, 9], N, 4)
    with pytest.raises(ConfigError, match="block starts must increase from 0"):
        ChunkBatchSampler([1, 9], N, 4)
    with pytest.raises(PlanError):
        ChunkBatchSampler(STARTS, N, 4, rank=0, world_size=N + 1)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    paths, _ = make_files(tmp_path_factory.mktemp("h5"), (11, 13, 9))
    return paths


def test_blocks_follow_each_files_chunks(files: list[str]) -> None:
    ds = fd.HDF5Dataset(files, ("image", "key"))
    # image chunks: 4 rows (file 0), contiguous 13 rows (file 1: one ~1 MiB block), 3 rows (file 2)
    assert ds.block_starts().tolist() == [0, 4, 8, 11, 24, 27, 30]
    # variable-length rows lie in write order in HDF5's heap: blocks of 64 rows, within each file
    with_blob = fd.HDF5Dataset(files, ("image", "blob"))
    assert with_blob.block_starts().tolist() == [0, 11, 24]


def test_dataloader_reads_every_sample_once_in_the_same_batches_for_any_workers(files: list[str]) -> None:
    # (the sampler runs in the main process; the dataset under spawn is covered by the conformance suite)
    ds = fd.HDF5Dataset(files, ("image", "key"), seed=4)

    def batches(num_workers: int) -> list[list[int]]:
        ctx = multiprocessing.get_context("fork") if num_workers else None
        loader = DataLoader(
            ds,
            batch_sampler=ds.chunk_sampler(5),
            num_workers=num_workers,
            multiprocessing_context=ctx,
            collate_fn=ds.collate,
        )
        return [b["key"].tolist() for b in loader]

    first = batches(2)
    assert sorted(k for b in first for k in b) == list(range(33))
    assert batches(0) == first
    ds.set_epoch(1)  # the sampler follows the dataset's epoch
    assert batches(0) != first


# -- a dataset of 2^31 rows: the sampler must not build the epoch's order up front ------------------


def test_sampler_over_2_31_rows_takes_memory_of_a_batch_not_of_the_epoch(tmp_path: Any) -> None:
    # 2^31 rows that were never written: a chunked dataset of fill values costs a few KiB of file
    n = 1 << 31
    path = str(tmp_path / "huge.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("label", (n,), dtype=np.int16, chunks=(1 << 20,), fillvalue=7)
    tracemalloc.start()
    try:
        ds = fd.HDF5Dataset(path, ("label",))
        assert len(ds) == n
        sampler = ds.sampler(shuffle=True)
        loader = DataLoader(ds, batch_size=64, sampler=sampler, collate_fn=ds.collate)
        batch = next(iter(loader))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, (
        f"{peak / 2**20:.0f} MiB to build the dataset and start an epoch of 2^31 rows"
    )  # the full order: 16 GiB
    assert batch["label"].tolist() == [7] * 64
    indices = batch["__index__"]
    assert len(set(indices.tolist())) == 64 and int(indices.max()) > n // 64  # shuffled over the whole range
    with h5py.File(path, "r") as f:
        assert int(f["label"][int(indices[0])]) == 7
    again = ds.sampler(shuffle=True)
    assert list(itertools.islice(iter(again), 64)) == indices.tolist()  # same seed and epoch, same order
    ds.set_epoch(1)
    assert list(itertools.islice(iter(again), 64)) != indices.tolist()
