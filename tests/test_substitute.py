"""``on_error="skip"`` never raises for bad samples and never yields None: a batch of only bad samples, and
``ds[i]`` of a bad one, get a substitute (fastdata/datasets/_substitute.py), through real DataLoader workers.

Every check counts: the substitute is the documented sample, counted in ``substituted``; the bad samples
are counted in ``skipped`` once each (never again by the search that steps over them); ranks keep equal
batch counts; data that is all bad raises ``TooManyBadSamples`` naming its files.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata import SubstituteWarning, TooManyBadSamples
from fastdata.core.errors import BadSampleWarning, DecodeFailed
from tests.datagen import make_shards
from tests.hdf5_datagen import make_h5
from tests.s3_server import MotoServer, upload_files
from tests.videogen import make_videos

BATCH = 4


class Refuse:
    """A decoder that refuses the samples with the given keys (a class, so that spawn workers get it)."""

    def __init__(self, bad: set[str] | None = None) -> None:
        self.bad = bad  # None: every sample

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        key = sample["__key__"]
        if self.bad is None or key in self.bad:
            raise DecodeFailed(f"{key}: the test decoder refuses it", key)
        return sample


@contextmanager
def quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)  # SubstituteWarning is one too
        yield


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("shards"), shards=2, per_shard=10, seed=3)


def keys_of(batches: list[Any]) -> list[list[str]]:
    return [list(b["__key__"]) for b in batches]


# --- TarShardDataset(batch_size=...) ----------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "context"), [("processes", "fork"), ("processes", "spawn"), ("threads", None)])
def test_tar_batch_of_only_bad_samples_is_the_next_good_sample_in_plan_order(
    shards: list[str], workers: str, context: str | None
) -> None:
    reference = keys_of(list(fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False)))
    # batch 1 all bad, and the first sample after it too: the substitute is the second sample of batch 2
    bad = {*reference[1], reference[2][0]}
    ds = fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False, on_error="skip", decode=Refuse(bad))
    extra = {"multiprocessing_context": context} if context else {}
    with quiet():
        got = keys_of(list(fd.Loader(ds, num_workers=2, workers=workers, **extra)))  # type: ignore[arg-type]
    expected = [[k for k in batch if k not in bad] for batch in reference]
    expected[1] = [reference[2][1]]
    assert got == expected
    # each bad sample counted once, in its own batch's turn (the search for the substitute met one too)
    assert ds.counters()["skipped"] == len(bad) == BATCH + 1
    assert ds.counters()["substituted"] == 1


def test_tar_remote_shards_batch_of_only_bad_samples(
    shards: list[str], s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]
) -> None:
    # s3:// shards take the windowed path (a background thread fetches the next window meanwhile)
    upload_files(s3_server.client(), s3_bucket, {os.path.basename(p): p for p in shards})
    url = f"s3://{s3_bucket}/train-{{000000..000001}}.tar"
    reference = keys_of(list(fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False)))
    bad = {*reference[1], reference[2][0]}
    ds = fd.TarShardDataset(
        url, batch_size=BATCH, shuffle=False, on_error="skip", decode=Refuse(bad), storage_options=s3_options
    )
    with quiet():
        got = keys_of(list(fd.Loader(ds, num_workers=2)))
    expected = [[k for k in batch if k not in bad] for batch in reference]
    expected[1] = [reference[2][1]]
    assert got == expected
    assert ds.counters()["skipped"] == len(bad) and ds.counters()["substituted"] == 1


def test_tar_substitute_wraps_to_the_start_of_the_rank_part_and_warns_once(shards: list[str]) -> None:
    reference = keys_of(list(fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False)))
    bad = {*reference[-1], *reference[-2]}  # the last two batches: nothing good after them but the start
    ds = fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False, on_error="skip", decode=Refuse(bad))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = keys_of(list(ds))
    assert got[-2:] == [[reference[0][0]], [reference[0][0]]]
    assert len(got) == len(reference) == len(ds)
    substitutes = [w for w in caught if issubclass(w.category, SubstituteWarning)]
    assert len(substitutes) == 1 and "counters()['substituted']" in str(substitutes[0].message)
    assert ds.counters()["substituted"] == 2 and ds.counters()["skipped"] == 2 * BATCH


def test_tar_ranks_keep_equal_batch_counts_when_one_rank_has_bad_samples(shards: list[str]) -> None:
    def build(rank: int, decode: Any = None) -> fd.TarShardDataset:
        return fd.TarShardDataset(
            shards, batch_size=BATCH, shuffle=True, seed=5, rank=rank, world_size=2, on_error="skip", decode=decode
        )

    clean = [keys_of(list(fd.Loader(build(r), num_workers=2))) for r in (0, 1)]
    bad = set(clean[0][1])  # a whole batch, on rank 0 only
    counts = []
    for rank in (0, 1):
        ds = build(rank, Refuse(bad))
        with quiet():
            counts.append(len(list(fd.Loader(ds, num_workers=2))))
        assert ds.counters()["substituted"] == (1 if rank == 0 else 0)
    assert counts == [len(clean[0]), len(clean[1])] and counts[0] == counts[1]


def test_tar_all_bad_raises_too_many_bad_samples_naming_the_shards(shards: list[str]) -> None:
    ds = fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False, on_error="skip", decode=Refuse())
    with quiet(), pytest.raises(TooManyBadSamples, match=r"train-000000\.tar.*fastdata inspect"):
        next(iter(ds))
    assert ds.counters()["substituted"] == 0


def test_tar_on_error_raise_is_unchanged(shards: list[str]) -> None:
    reference = keys_of(list(fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False)))
    ds = fd.TarShardDataset(shards, batch_size=BATCH, shuffle=False, decode=Refuse(set(reference[1])))
    it = iter(ds)
    assert list(next(it)["__key__"]) == reference[0]
    with pytest.raises(DecodeFailed, match=reference[1][0]):
        next(it)
    assert ds.counters()["substituted"] == 0 and ds.counters()["skipped"] == 0


# --- map-style datasets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_indexed_tar_batch_size_none_never_yields_none(shards: list[str], context: str) -> None:
    keys = [f"s{i:06d}" for i in range(20)]
    bad = set(keys[4:9])  # ds[4] .. ds[8] bad: each stands in by ds[9], the first good index after them
    ds = fd.IndexedTarDataset(shards, on_error="skip", decode=Refuse(bad))
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    with quiet():
        got = [s["__key__"] for s in loader]
    assert got == keys[:4] + [keys[9]] * 5 + keys[9:]
    assert ds.counters()["skipped"] == 5  # once each: the searches stepped over them without counting
    assert ds.counters()["substituted"] == 5


def test_indexed_tar_batch_of_only_bad_samples_and_two_ranks(shards: list[str]) -> None:
    keys = [f"s{i:06d}" for i in range(20)]
    bad = set(keys[4:9])
    ds = fd.IndexedTarDataset(shards, on_error="skip", decode=Refuse(bad))
    with quiet():
        got = [list(b["__key__"]) for b in DataLoader(ds, batch_size=BATCH, num_workers=2)]
    assert got == [keys[0:4], [keys[9]], keys[9:12], keys[12:16], keys[16:20]]
    assert ds.counters()["skipped"] == 5 and ds.counters()["substituted"] == 1
    # two ranks through their samplers, bad samples only in rank 0's part (unshuffled: indices 0..9)
    counts = []
    for rank in (0, 1):
        ranked = fd.IndexedTarDataset(shards, on_error="skip", decode=Refuse(bad), rank=rank, world_size=2)
        with quiet():
            counts.append(len(list(fd.Loader(ranked, batch_size=BATCH, shuffle=False, num_workers=2))))
        assert ranked.counters()["substituted"] == (1 if rank == 0 else 0)
    assert counts[0] == counts[1] == 3  # 10 samples a rank, batches of 4, 4 and 2


def test_indexed_tar_all_bad_and_raise(shards: list[str]) -> None:
    ds = fd.IndexedTarDataset(shards, on_error="skip", decode=Refuse())
    with quiet(), pytest.raises(TooManyBadSamples, match=r"train-00000[01]\.tar.*fastdata inspect"):
        ds[3]
    with quiet(), pytest.raises(TooManyBadSamples, match=r"(?=.*train-000000\.tar)(?=.*train-000001\.tar)"):
        ds.__getitems__([9, 10])  # a batch across two shards names both
    raising = fd.IndexedTarDataset(shards, decode=Refuse({"s000003"}))
    with pytest.raises(DecodeFailed, match="s000003"):
        raising[3]
    with pytest.raises(DecodeFailed, match="s000003"):
        raising.__getitems__([2, 3])
    assert raising.counters()["substituted"] == 0


def damaged_h5(path: Path) -> str:
    """12 rows in gzip chunks of 4; the stored bytes of chunk 1 (rows 4..7) are garbage."""
    import h5py

    file = str(path / "damaged.h5")
    make_h5(file, 12, chunks=4, compression="gzip")
    with h5py.File(file, "r") as f:
        info = f["image"].id.get_chunk_info(1)
    with open(file, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    return file


def test_hdf5_bad_rows_get_substitutes_by_index_and_by_chunk(tmp_path: Path) -> None:
    path = damaged_h5(tmp_path)
    fields = ("image", "label", "key")
    ds = fd.HDF5Dataset(path, fields, on_error="skip")
    with quiet():
        single = [int(s["key"]) for s in DataLoader(ds, batch_size=None, num_workers=2)]
    assert single == [0, 1, 2, 3, 8, 8, 8, 8, 8, 9, 10, 11]
    assert ds.counters()["skipped"] == 4 and ds.counters()["substituted"] == 4
    chunked = fd.HDF5Dataset(path, fields, on_error="skip")
    sampler = chunked.chunk_sampler(BATCH, shuffle=False)
    with quiet():
        batches = [b["key"].tolist() for b in DataLoader(chunked, batch_sampler=sampler, num_workers=2)]
    assert batches == [[0, 1, 2, 3], [8], [8, 9, 10, 11]]
    assert chunked.counters()["skipped"] == 4 and chunked.counters()["substituted"] == 1
    with pytest.raises(Exception, match=r"damaged\.h5"):
        fd.HDF5Dataset(path, fields).__getitems__([4, 5])
    assert fd.HDF5Dataset(path, fields).counters()["substituted"] == 0


def test_hdf5_all_bad_raises_too_many_bad_samples(tmp_path: Path) -> None:
    path = str(tmp_path / "notjpeg.h5")
    make_h5(path, 5)  # 'blob' rows are random bytes, not images
    ds = fd.HDF5Dataset(path, ("blob", "key"), decode="numpy", on_error="skip")
    with quiet(), pytest.raises(TooManyBadSamples, match=r"notjpeg\.h5"):
        ds.__getitems__([0, 1])


def test_video_batch_size_one_of_a_bad_clip(tmp_path: Path) -> None:
    paths = make_videos(tmp_path, count=3, frames=[20, 20, 20], seed=1)
    ds = fd.VideoClipDataset(paths, clip_len=4, clips_per_video=2, on_error="skip", index_cache=False)
    os.remove(paths[1])  # clips 2 and 3: each stands in by clip 4, the first clip of the third video
    with quiet():
        got = [(int(b["video"][0]), int(b["frames"][0][0])) for b in DataLoader(ds, batch_size=1, num_workers=2)]
    reference = [(v, int(ds.frames_of(i)[1][0])) for i in range(6) for v in [ds.locate(i)[0]]]
    assert got == [reference[0], reference[1], reference[4], reference[4], reference[4], reference[5]]
    assert ds.counters()["skipped"] == 2 and ds.counters()["substituted"] == 2
    with quiet():
        assert ds[3]["video"] == 2


def test_video_all_bad_raises_too_many_bad_samples(tmp_path: Path) -> None:
    paths = make_videos(tmp_path, count=2, frames=[20, 20], seed=1)
    ds = fd.VideoClipDataset(paths, clip_len=4, clips_per_video=2, on_error="skip", index_cache=False)
    for p in paths:
        os.remove(p)
    with quiet(), pytest.raises(TooManyBadSamples, match=r"\.mp4|\.avi|\.mkv"):
        ds[0]


def test_s3_missing_objects_get_substitutes(s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]) -> None:
    rng = np.random.default_rng(4)
    files = {f"sub/{i:02d}.bin": rng.bytes(50) for i in range(6)}
    upload_files(s3_server.client(), s3_bucket, files)
    urls = [f"s3://{s3_bucket}/{k}" for k in sorted(files)]
    urls[2] = f"s3://{s3_bucket}/sub/02-gone.bin"  # never uploaded
    ds = fd.S3Dataset(urls, on_missing="skip", **s3_options)
    with quiet():
        got = [s["__key__"] for s in DataLoader(ds, batch_size=None, num_workers=2)]
    assert got == ["sub/00", "sub/01", "sub/03", "sub/03", "sub/04", "sub/05"]
    with quiet():
        batches = [list(b["__key__"]) for b in DataLoader(ds, batch_size=1, num_workers=2)]
    assert batches[2] == ["sub/03"] and len(batches) == 6
    assert ds.counters()["skipped"] == 2 and ds.counters()["substituted"] == 2
    gone = fd.S3Dataset([urls[2], f"s3://{s3_bucket}/sub/also-gone.bin"], on_missing="skip", **s3_options)
    with quiet(), pytest.raises(TooManyBadSamples, match=r"02-gone\.bin"):
        gone[0]


def test_a_dataset_reports_substituted_beside_skipped(shards: list[str]) -> None:
    ds = fd.IndexedTarDataset(shards, on_error="skip", decode=Refuse({"s000000"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ds[0]["__key__"] == "s000001"
        assert ds[0]["__key__"] == "s000001"
    assert sum(issubclass(w.category, SubstituteWarning) for w in caught) == 1
    assert ds.substituted == 2 and ds.skipped == 2
