"""Shards whose samples store their image under different extensions (some ``.jpg``, some ``.png``, as
web-scraped sets do): ``fields=`` picks each field from its alternatives (webdataset's ``"jpg;png"``) for
``TarShardDataset``, ``IndexedTarDataset``, ``fastdata bench -o`` and ``Mix``; without it a batch of
unlike samples raises ``CannotBatch`` naming the samples, the shard and the fix, not ``KeyError: 'jpg'``."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

import fastdata as fd
from fastdata.bench._command import parse_option
from fastdata.bench.backends import _tar as bench_tar
from fastdata.core.errors import BadSample, CannotBatch, ConfigError

N = 12
FIELDS = {"image": "jpg;jpeg;png;webp", "label": "cls"}


def _image(i: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), i * 10, np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def _shard(path: Path, exts: list[str]) -> str:
    """A shard written by webdataset's ``TarWriter``: sample ``i`` stores its image as ``exts[i % len]``."""
    with wds.TarWriter(str(path)) as sink:
        for i in range(N):
            ext = exts[i % len(exts)]
            sink.write(
                {"__key__": f"s{i:04d}", ext: _image(i, "PNG" if ext == "png" else "JPEG"), "cls": b"%d" % (i % 3)}
            )
    return str(path)


def test_a_batch_of_jpg_and_png_samples_names_the_keys_the_shard_and_fields(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "mixed.tar", ["jpg", "png"])
    ds = fd.TarShardDataset(shard, batch_size=4, decode="torch")
    with pytest.raises(CannotBatch) as caught:
        next(iter(ds))
    message = str(caught.value)
    assert "'s0000'" in message and "'s0001'" in message and shard in message
    assert "fields=" in message and "jpg;png" in message


@pytest.mark.parametrize("indexed", [False, True])
def test_fields_pick_whichever_image_each_sample_has(tmp_path: Path, indexed: bool) -> None:
    shard = _shard(tmp_path / "mixed.tar", ["jpg", "png", "jpeg"])
    if indexed:
        ds: object = fd.IndexedTarDataset(shard, decode="torch", fields=FIELDS)
        loader = fd.Loader(ds, batch_size=4, num_workers=0)
    else:
        ds = fd.TarShardDataset(shard, batch_size=4, decode="torch", fields=FIELDS)
        loader = fd.Loader(ds, num_workers=2)
    keys, labels = [], []
    for batch in loader:
        assert set(batch) == {"__key__", "__url__", "image", "label"}
        assert batch["image"].shape[1:] == (3, 8, 8) or batch["image"].shape[-3:] == (8, 8, 3)
        keys += list(batch["__key__"])
        labels += batch["label"].tolist()
    assert sorted(keys) == [f"s{i:04d}" for i in range(N)]
    assert [labels[keys.index(f"s{i:04d}")] for i in range(N)] == [i % 3 for i in range(N)]


def test_a_sample_without_any_alternative_is_a_bad_sample_named_with_its_shard(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "gif.tar", ["jpg", "gif"])
    with pytest.raises(BadSample, match=r"sample 's0001' has none of \.jpg, \.png for field 'image'"):
        list(fd.TarShardDataset(shard, fields={"image": "jpg;png"}))
    with pytest.warns(UserWarning):
        ds = fd.TarShardDataset(shard, fields={"image": ["jpg", "png"]}, on_error="skip")
        got = list(ds)
    assert [s["__key__"] for s in got] == [f"s{i:04d}" for i in range(0, N, 2)]
    assert ds.skipped == N // 2
    with pytest.raises(ConfigError, match="at least one extension"):
        fd.TarShardDataset(shard, fields={"image": ""})


def test_bench_option_fields_reaches_the_dataset(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "mixed.tar", ["jpg", "png"])
    key, value = parse_option('fields={"image": "jpg;png", "label": "cls"}')
    ds = bench_tar.open(shard, **{key: value, "decode": "raw", "batch_size": 4, "shuffle": False})
    first = next(iter(ds))
    assert set(first) == {"__key__", "__url__", "image", "label"} and len(first["image"]) == 4


def test_mix_of_a_jpg_source_and_a_png_source_batches_with_fields(tmp_path: Path) -> None:
    jpg = fd.IndexedTarDataset(_shard(tmp_path / "jpg.tar", ["jpg"]), decode="torch", fields=FIELDS)
    png = fd.TarShardDataset(_shard(tmp_path / "png.tar", ["png"]), decode="torch", fields="image=jpg;png,label=cls")
    mix = fd.Mix([jpg, png], [1, 1], epoch_size=16, seed=1)
    batches = list(fd.Loader(mix, batch_size=8, num_workers=0))
    assert sum(len(b["label"]) for b in batches) == 16
    assert all(set(b) >= {"image", "label"} and "jpg" not in b and "png" not in b for b in batches)
    urls = {u for b in batches for u in b["__url__"]}
    assert urls == {str(tmp_path / "jpg.tar"), str(tmp_path / "png.tar")}
