"""Interoperability with upstream webdataset, both ways: shards written by its ``ShardWriter`` and
``TarWriter`` read by our datasets; shards written by fastdata read by ``webdataset.WebDataset``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.convert import convert
from fastdata.formats.tar_writer import TarShardWriter
from tests.datagen import jpeg_bytes, make_image_folder


def samples(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"__key__": f"k{i:05d}", "jpg": jpeg_bytes(rng), "cls": str(i % 5).encode(), "json": b'{"i": %d}' % i}
        for i in range(n)
    ]


def as_bytes(sample: dict) -> tuple:
    return (sample["__key__"], *((e, bytes(sample[e])) for e in ("jpg", "cls", "json")))


def read_ours(urls: list[str], iterable: bool) -> list[tuple]:
    if iterable:
        ds = fd.TarShardDataset(urls, shuffle=True, seed=1)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    else:
        ds = fd.IndexedTarDataset(urls)
        loader = DataLoader(
            ds, batch_size=4, sampler=ds.sampler(), num_workers=2, multiprocessing_context="fork", collate_fn=list
        )
    out = []
    for item in loader:
        out.extend(item if isinstance(item, list) else [item])
    return sorted(as_bytes(s) for s in out)


@pytest.mark.parametrize("iterable", [True, False], ids=["TarShardDataset", "IndexedTarDataset"])
def test_webdataset_shardwriter_shards_read_by_our_datasets(tmp_path: Path, iterable: bool) -> None:
    written = samples(23)
    # ShardWriter goes through tarfile's default PAX format: a PAX header before every member
    with wds.ShardWriter(str(tmp_path / "wds-%06d.tar"), maxcount=7, verbose=0) as sink:
        for s in written:
            sink.write(dict(s))
    urls = sorted(str(p) for p in tmp_path.glob("wds-*.tar"))
    assert len(urls) == 4
    assert read_ours(urls, iterable) == sorted(as_bytes(s) for s in written)


def test_webdataset_tarwriter_shard_read_by_ours(tmp_path: Path) -> None:
    written = samples(9, seed=2)
    with wds.TarWriter(str(tmp_path / "one.tar")) as sink:
        for s in written:
            sink.write(dict(s))
    got = [as_bytes(s) for s in fd.TarShardDataset(str(tmp_path / "one.tar"))]
    assert got == [as_bytes(s) for s in written]  # same order too


def test_our_shards_read_by_webdataset(tmp_path: Path) -> None:
    written = samples(20, seed=3)
    long_key = "deep/" + "x" * 120  # a PAX path record
    written.append({"__key__": long_key, "jpg": b"long", "cls": b"1", "json": b"{}"})
    urls = []
    for shard in range(4):
        urls.append(str(tmp_path / f"ours-{shard:06d}.tar"))
        with TarShardWriter(urls[-1], fsync=False) as w:
            for s in written[shard::4]:
                w.write_sample(s)
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    assert sorted(as_bytes(s) for s in dataset) == sorted(as_bytes(s) for s in written)
    # and through DataLoader workers, each worker taking its own shards
    loader = DataLoader(
        wds.WebDataset(urls, shardshuffle=False), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    assert sorted(as_bytes(s) for s in loader) == sorted(as_bytes(s) for s in written)


def test_converted_corpus_read_by_webdataset_with_decoding(tmp_path: Path) -> None:
    files = make_image_folder(tmp_path / "src", classes=2, per_class=5)
    manifest = convert(tmp_path / "src", tmp_path / "out", shard_count=2, progress=False, fsync=False)
    urls = [str(tmp_path / "out" / s["name"]) for s in manifest["shards"]]
    got = {s["__key__"]: (s["jpg"].shape, s["cls"]) for s in wds.WebDataset(urls, shardshuffle=False).decode("rgb8")}
    assert got == {rel[:-4]: ((24, 32, 3), label) for rel, label in files}
