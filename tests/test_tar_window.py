"""TarShardDataset's shuffle windows (fastdata.datasets.tar._epoch_reader): bounded by bytes as well as by count,
samples decoded only as they leave the window, per-sample workers that read whole shards, every sample
once per epoch in per-sample mode too; on S3, each shard's bytes fetched about once."""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import EgressWarning
from fastdata.datasets.tar._epoch_reader import WindowWarning, worker_span
from fastdata.formats._decode import make_decoder
from tests.datagen import make_shards
from tests.s3_server import MotoServer, upload_files
from tests.worker_probe import printing, tag_worker

SHARDS, PER_SHARD = 4, 24
EXPECTED = [f"s{i:06d}" for i in range(SHARDS * PER_SHARD)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("shards"), shards=SHARDS, per_shard=PER_SHARD, seed=6)


class CountingDecoder:
    """Decodes like ``decode="numpy"`` and counts its calls (in this process)."""

    def __init__(self) -> None:
        self.inner = make_decoder("numpy")
        self.calls = 0

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return self.inner(sample)  # type: ignore[misc]


def test_the_window_is_cut_to_shuffle_bytes(shards: list[str]) -> None:
    per_sample = max(os.path.getsize(p) for p in shards) / PER_SHARD
    ds = fd.TarShardDataset(shards, shuffle=True, shuffle_bytes=int(10 * per_sample) + 1)
    assert ds.window == 10, "ten samples' worth of the largest shard's mean"
    assert fd.TarShardDataset(shards, shuffle=True).window == min(4096, int(64 * 2**20 // per_sample))
    assert fd.TarShardDataset(shards, shuffle=True, shuffle_bytes=None).window == 4096
    assert fd.TarShardDataset(shards, shuffle=False).window == 1
    with pytest.warns(WindowWarning, match="shuffle_window=50 is cut to 10 samples"):
        fd.TarShardDataset(shards, shuffle=True, shuffle_window=50, shuffle_bytes=int(10 * per_sample) + 1)


def test_per_sample_mode_decodes_samples_as_they_leave_the_window(shards: list[str]) -> None:
    decoder = CountingDecoder()
    ds = fd.TarShardDataset(shards, shuffle=True, shuffle_window=len(EXPECTED), shuffle_bytes=None, decode=decoder)
    it = iter(ds)
    next(it)
    assert decoder.calls == 1, "one window of raw bytes, one sample decoded"
    rest = list(it)
    assert decoder.calls == len(EXPECTED) == len(rest) + 1


def test_worker_ranges_snap_to_shard_boundaries() -> None:
    boundaries = np.array([10, 20, 30])
    assert [worker_span(40, w, 2, boundaries) for w in range(2)] == [(0, 20), (20, 40)]
    assert [worker_span(40, w, 2, np.array([19])) for w in range(2)] == [(0, 19), (19, 40)]  # within a tenth
    # 3 workers over 4 shards of 10: 13.3 and 26.7 are too far from 10, 20, 30 (balance goes first)
    assert [worker_span(40, w, 3, boundaries) for w in range(3)] == [(0, 13), (13, 27), (27, 40)]
    assert worker_span(40, 0, 2, np.array([], dtype=np.int64)) == (0, 20)


@pytest.mark.parametrize(("num_workers", "context"), [(0, None), (2, "fork"), (3, "fork")])
def test_per_sample_mode_reads_every_sample_once_and_whole_shards_per_worker(
    shards: list[str], num_workers: int, context: str | None
) -> None:
    ds = fd.TarShardDataset(shards, shuffle=True, shuffle_window=16, transform=tag_worker)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers, multiprocessing_context=context)
    first = list(loader)
    assert sorted(k for k, _, _ in first) == EXPECTED
    if num_workers == 2:  # 4 shards, 2 workers: each shard is read by one worker only
        readers = {url: {w for _, u, w in first if u == url} for url in shards}
        assert all(len(w) == 1 for w in readers.values()), readers
    ds.set_epoch(1)
    second = [k for k, _, _ in loader]
    assert sorted(second) == EXPECTED and second != [k for k, _, _ in first]


@pytest.fixture(scope="module")
def remote(s3_server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """8 shards of 20 samples (~20 KB each) on S3 with their sidecars and manifest, as fastdata convert
    writes them; returns the brace pattern and the shards' bytes."""
    from fastdata.formats.tar._reader import scan
    from fastdata.storage._local import LocalReader

    folder = tmp_path_factory.mktemp("remote")
    paths = make_shards(folder, shards=8, per_shard=20, seed=7)
    files: dict[str, Any] = {}
    listed = []
    for p in paths:
        with LocalReader(p) as reader:
            index = scan(reader)
        idx = p + ".idx"
        with open(idx, "wb") as f:
            f.write(index.to_bytes())
        name = os.path.basename(p)
        files[name], files[name + ".idx"] = p, idx
        listed.append({"name": name, "samples": len(index), "bytes": os.path.getsize(p)})
    files["manifest.json"] = json.dumps({"format": "tar", "version": 1, "shards": listed}).encode()
    client = s3_server.client()
    client.create_bucket(Bucket="windows")
    upload_files(client, "windows", {f"t/{k}": v for k, v in files.items()})
    return "s3://windows/t/train-{000000..000007}.tar", sum(os.path.getsize(p) for p in paths)


def fetched(ds: fd.TarShardDataset, loader: Any) -> tuple[list[str], int, int]:
    before = ds.counters()
    keys: list[str] = []
    for batch in loader:
        key = batch["__key__"]
        keys.extend(key if isinstance(key, list) else [key])
    after = ds.counters()
    return keys, after["s3_requests"] - before["s3_requests"], after["s3_bytes"] - before["s3_bytes"]


@pytest.mark.parametrize(("batch_size", "num_workers"), [(None, 0), (None, 2), (5, 0), (5, 1)])
def test_remote_shuffle_fetches_each_shard_about_once(
    remote: tuple[str, int], s3_env: dict[str, str], batch_size: int | None, num_workers: int
) -> None:
    spec, nbytes = remote
    ds = fd.TarShardDataset(spec, shuffle=True, batch_size=batch_size)
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
        collate_fn=fd.as_is if batch_size else None,
    )
    keys, requests, got = fetched(ds, loader)
    assert sorted(keys) == [f"s{i:06d}" for i in range(160)]
    assert got <= 1.2 * nbytes, f"{got} bytes fetched for {nbytes} of shards"
    assert requests <= 2 * 8, f"{requests} requests for 8 shards (their sidecars included)"
    ds.set_epoch(1)
    again, _, _ = fetched(ds, loader)
    assert sorted(again) == sorted(keys) and again != keys, "a new order every epoch"


def test_remote_batches_dealt_to_several_workers_warn_of_the_egress(
    remote: tuple[str, int], s3_env: dict[str, str], capfd: pytest.CaptureFixture[str]
) -> None:
    spec, nbytes = remote
    ds = fd.TarShardDataset(spec, shuffle=True, batch_size=5)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", collate_fn=fd.as_is)
    with printing():
        _, _, got = fetched(ds, loader)
    err = capfd.readouterr().err
    assert err.count("EgressWarning") == 1 and "about 2x" in err, err
    assert got <= 2.2 * nbytes
    # shuffled within batches only, every byte is fetched once
    narrow = fd.TarShardDataset(spec, shuffle=True, batch_size=5, shuffle_window=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EgressWarning)
        keys, _, got = fetched(narrow, DataLoader(narrow, batch_size=None, num_workers=2, collate_fn=fd.as_is))
    assert len(keys) == 160 and got <= 1.2 * nbytes
    assert Counter(keys) == Counter(f"s{i:06d}" for i in range(160))


def test_the_egress_warning_of_a_worker_reaches_the_training_process_once_naming_cache_dir(
    remote: tuple[str, int], s3_env: dict[str, str]
) -> None:
    spec, _ = remote
    ds = fd.TarShardDataset(spec, shuffle=True, batch_size=5)
    with pytest.warns(EgressWarning) as caught, fd.Loader(ds, num_workers=2, multiprocessing_context="fork") as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sum(len(b["__key__"]) for b in loader) == 160
    egress = [w for w in caught if issubclass(w.category, EgressWarning)]
    assert len(egress) == 1 and "cache_dir=" in str(egress[0].message)
