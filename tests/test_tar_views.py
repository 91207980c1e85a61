"""TarShardDataset's raw batches through worker slots: a worker reads the members as views of the mapped
shard and the slot's copy is the only one (read_views), yet the main process gets the same ``bytes`` as
without workers; a batch that takes the pipe instead carries ``bytes``; a decoder, transform or collate
function of the user's never sees a view."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.loading import transport as slots
from fastdata.loading.transport import SlotCollate
from fastdata.loading.transport import _layout as layout
from fastdata.storage._local import LocalReader
from tests.datagen import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("views"), shards=4, per_shard=40, seed=11)


@pytest.fixture
def packed_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every worker (forked: it inherits the patch) notes the types of each batch's ``bin`` values as the
    batch is packed into its slot, one JSON line per batch."""
    log = tmp_path / "packed.jsonl"
    pack = slots.WorkerRing.pack

    def noting(self: Any, batch: Any, wait_s: float, options: tuple[Any, ...]) -> Any:
        with open(log, "a") as f:
            f.write(json.dumps(sorted({type(v).__name__ for v in batch["bin"]})) + "\n")
        return pack(self, batch, wait_s, options)

    monkeypatch.setattr(slots.WorkerRing, "pack", noting)
    return log


def in_process(shards: list[str], **kw: Any) -> list[dict[str, Any]]:
    return list(fd.Loader(fd.TarShardDataset(shards, shuffle=True, seed=3, batch_size=8, **kw)))


def test_workers_pack_views_of_the_shard_and_the_main_process_gets_the_same_bytes(
    shards: list[str], packed_types: Path
) -> None:
    ds = fd.TarShardDataset(shards, shuffle=True, seed=3, batch_size=8)
    with fd.Loader(ds, num_workers=2, transport="slots", multiprocessing_context="fork") as loader:
        got = list(loader)
    assert got == in_process(shards) and len(got) == 20
    assert all(type(v) is bytes for b in got for v in b["bin"] + b["cls"])
    packed = [json.loads(line) for line in packed_types.read_text().splitlines()]
    assert len(packed) == 20
    # a worker's first batch is read before its slot collate has been called once: bytes; then views
    assert packed.count(["memoryview"]) >= 16, packed


def test_a_batch_that_takes_the_pipe_carries_bytes(shards: list[str], packed_types: Path) -> None:
    # 8 bin members of 10..2000 bytes do not fit in 1 KiB of slots: every batch goes the stock way
    ds = fd.TarShardDataset(shards, shuffle=True, seed=3, batch_size=8)
    collate = SlotCollate(prebatched=True, max_bytes=1024, wait_s=0.01)
    slots.reset_counts()
    loader = DataLoader(ds, batch_size=None, num_workers=1, collate_fn=collate, multiprocessing_context="fork")
    got = list(loader)  # (the worker warns that max_bytes is too small: in its own process)
    assert slots.stats()["pipe"] == 20 and slots.stats()["slots"] == 0
    assert got == in_process(shards)
    assert all(type(v) is bytes for b in got for v in b["bin"])
    assert ["memoryview"] in [json.loads(line) for line in packed_types.read_text().splitlines()]


def _bytes_only(sample: dict[str, Any]) -> dict[str, Any]:
    bad = {k: type(v).__name__ for k, v in sample.items() if not k.startswith("__") and type(v) is not bytes}
    if bad:
        raise TypeError(f"the transform got {bad} in pid {os.getpid()}")
    return sample


def _collate_bytes_only(samples: list[dict[str, Any]]) -> dict[str, Any]:
    for s in samples:
        _bytes_only(s)
    return {k: [s[k] for s in samples] for k in samples[0]}


@pytest.mark.parametrize("user_code", ["transform", "collate_fn"])
def test_user_code_in_the_worker_never_sees_a_view(shards: list[str], user_code: str) -> None:
    kw: dict[str, Any] = {"transform": _bytes_only} if user_code == "transform" else {"collate_fn": _collate_bytes_only}
    ds = fd.TarShardDataset(shards, shuffle=True, seed=3, batch_size=8, **kw)
    with fd.Loader(ds, num_workers=2, transport="slots", multiprocessing_context="fork") as loader:
        got = list(loader)
    assert got == in_process(shards, **kw) and len(got) == 20


def test_views_are_laid_out_as_bytes_and_made_bytes_for_the_pipe(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 40)
    reader = LocalReader(str(path))
    views = reader.read_views([(0, 3000), (5000, 2000)])
    small = [b"\x01\x02", *reader.read_views([(7, 3)])]  # bytes and a view in one list (two kinds of shard)
    assert all(type(v) is memoryview and v.readonly for v in views)
    batch = {"big": views, "small": small, "one": views[0]}
    p = layout.plan(batch)
    assert isinstance(p.skeleton["big"], layout.BytesListRef)
    assert p.skeleton["small"] == [b"\x01\x02", b"\x07\x08\x09"]  # inlined, as bytes: it is pickled
    assert all(type(v) is bytes for v in p.skeleton["small"])
    assert isinstance(p.skeleton["one"], layout.BytesRef)
    slot = bytearray(p.nbytes)
    array = np.frombuffer(slot, np.uint8)
    layout.write(p, torch.from_numpy(array), array, memoryview(slot))
    back = layout.rebuild(p.skeleton, array, "bytes", False)
    data = path.read_bytes()
    assert back == {"big": [data[:3000], data[5000:7000]], "small": [b"\x01\x02", b"\x07\x08\x09"], "one": data[:3000]}
    piped = layout.materialise(batch)
    assert piped["big"] == [data[:3000], data[5000:7000]] and all(type(v) is bytes for v in piped["big"])
    assert type(piped["one"]) is bytes
    reader.close()  # the views are still alive: the mapping goes with them
    assert bytes(views[1]) == data[5000:7000]
