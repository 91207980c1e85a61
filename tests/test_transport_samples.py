"""Per-sample datasets through a plain DataLoader: their batches (the default collate's dict of lists of
bytes) travel through the workers' reused slots instead of being pickled value by value, and arrive as
the plain dicts of bytes the stock way gives; ``fd.Loader(transport="stock")`` keeps the stock way."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.loading.transport import _registry
from fastdata.loading.transport._samples import SlotSample
from tests.datagen import write_tar


def _shards(tmp_path: Path) -> tuple[list[str], dict[str, bytes]]:
    rng = np.random.default_rng(0)
    shards, payloads = [], {}
    for s in range(2):
        samples = []
        for i in range(40):
            key = f"{s}-{i:02d}"
            payloads[key] = rng.bytes(int(rng.integers(2_000, 40_000)))
            samples.append({"__key__": key, "bin": payloads[key], "cls": str(i % 3).encode()})
        shards.append(str(tmp_path / f"s-{s}.tar"))
        write_tar(shards[-1], samples)
    return shards, payloads


def _read(loader: DataLoader, payloads: dict[str, bytes]) -> int:
    """Batches read, each checked."""
    _registry.reset_counts()
    keys, batches = [], 0
    for batch in loader:
        batches += 1
        assert type(batch) is dict  # what the stock way gives: a plain dict of lists
        assert all(type(v) is bytes for v in batch["bin"]) and all(type(v) is bytes for v in batch["cls"])
        for key, data in zip(batch["__key__"], batch["bin"]):
            assert data == payloads[key]
        keys += batch["__key__"]
    assert sorted(keys) == sorted(payloads)  # every sample once
    return batches


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_plain_dataloader_batches_tar_samples_through_slots(tmp_path: Path, context: str) -> None:
    shards, payloads = _shards(tmp_path)
    for ds in (fd.TarShardDataset(shards), fd.IndexedTarDataset(shards)):
        loader = DataLoader(
            ds, batch_size=16, num_workers=2, multiprocessing_context=multiprocessing.get_context(context)
        )
        batches = _read(loader, payloads)
        counts = _registry.stats()
        assert counts["slots"] == batches and counts["pipe"] == 0, (type(ds).__name__, counts)
        ds.close()
        _registry.release()


def test_the_stock_transport_of_fd_loader_stays_the_stock_way(tmp_path: Path) -> None:
    shards, payloads = _shards(tmp_path)
    ds = fd.IndexedTarDataset(shards)
    with fd.Loader(ds, batch_size=16, num_workers=2, transport="stock") as loader:
        _read(loader, payloads)  # type: ignore[arg-type]
    assert _registry.stats()["slots"] == 0
    with fd.Loader(ds, batch_size=16, num_workers=2, transport="slots") as loader:
        batches = _read(loader, payloads)  # type: ignore[arg-type]
    assert _registry.stats()["slots"] == batches


def test_a_slot_sample_is_a_plain_dict_outside_workers() -> None:
    sample = SlotSample({"__key__": "k", "bin": b"x" * 5000})
    assert type(pickle.loads(pickle.dumps(sample))) is dict
    assert pickle.loads(pickle.dumps(sample)) == sample
    clone = copy.copy(sample)  # what default_collate does to make the batch
    assert type(clone) is SlotSample and clone == sample and clone is not sample
    assert copy.deepcopy(sample) == sample
