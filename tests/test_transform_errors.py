"""A user's ``transform=`` that fails names where: the shard or file, the sample's key and index, the
exception (chained), and the keys the sample has; raised from DataLoader workers as ``TransformFailed``,
and under ``on_error="skip"`` counted and left out like a failed decode, on every backend."""

from __future__ import annotations

import multiprocessing
import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import TransformFailed
from tests.datagen import make_shards
from tests.hdf5_datagen import make_h5
from tests.s3_server import MotoServer, upload_files
from tests.stop_workers import stop_workers
from tests.videogen import make_videos


def wrong_member(sample: dict[str, Any]) -> Any:
    return sample["png"]  # the shards hold "jpg": the user's typo


def every_third(sample: dict[str, Any]) -> Any:
    key = sample.get("__key__") or str(sample.get("__index__"))
    if int(key.lstrip("s")) % 3 == 0:
        raise ValueError("too dark")
    return sample


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("shards"), shards=2, per_shard=6, jpeg=True)


def test_tar_through_workers_names_the_shard_sample_and_key(shards: list[str]) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4, decode="torch", transform=wrong_member)
    with pytest.raises(TransformFailed) as caught, fd.Loader(ds, num_workers=2) as loader:
        list(loader)
    message = str(caught.value)
    assert "train-00000" in message and ".tar: sample " in message and "(key 's0000" in message
    assert "transform wrong_member raised KeyError: 'png'" in message and "'jpg'" in message


def test_closing_after_a_worker_error_stops_the_workers_at_once(shards: list[str]) -> None:
    # the error's traceback keeps the pass's iterator alive: the workers must stop when the Loader closes,
    # not when the garbage collector finds the iterator (then each waited out torch's 5 s and was killed)
    ds = fd.TarShardDataset(shards, batch_size=4, decode="torch", transform=wrong_member)
    with pytest.raises(TransformFailed) as caught, fd.Loader(ds, num_workers=2) as loader:
        list(loader)
    assert caught.value.__traceback__ is not None
    assert multiprocessing.active_children() == []


def test_indexed_tar_names_the_sample_number_in_its_shard(shards: list[str]) -> None:
    ds = fd.IndexedTarDataset(shards, transform=wrong_member)
    with pytest.raises(TransformFailed, match=r"train-000001\.tar: sample 2 \(key 's000008'\): transform") as caught:
        ds[8]
    assert isinstance(caught.value.__cause__, KeyError)


def test_under_skip_failures_are_counted_like_bad_decodes(shards: list[str]) -> None:
    ds = fd.TarShardDataset(shards, batch_size=4, transform=every_third, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fd.Loader(ds, num_workers=2) as loader:
            keys = sorted(k for b in loader for k in b["__key__"])
    assert keys == [f"s{i:06d}" for i in range(12) if i % 3]
    assert ds.skipped == 4


def test_hdf5_names_the_file_row_and_index(tmp_path: Path) -> None:
    make_h5(tmp_path / "a.h5", 5, first_key=0)
    make_h5(tmp_path / "b.h5", 5, first_key=5, seed=1)
    ds = fd.HDF5Dataset([tmp_path / "a.h5", tmp_path / "b.h5"], ("image", "label"), transform=lambda s: s["img"])
    batches = iter(DataLoader(ds, batch_size=2, sampler=[7, 1], collate_fn=ds.collate, num_workers=1))
    with pytest.raises(TransformFailed, match=r"b\.h5: row 2 \(dataset index 7\): transform .* KeyError: 'img'"):
        next(batches)
    stop_workers(batches)  # (a 5 s wait in a later test otherwise: see tests/stop_workers.py)
    skipping = fd.HDF5Dataset(tmp_path / "a.h5", ("image", "label"), transform=every_third, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [s["__index__"] for s in skipping.__getitems__(list(range(5)))]
    assert got == [1, 2, 4] and skipping.skipped == 2


def test_video_names_the_file_and_frames(tmp_path: Path) -> None:
    videos = make_videos(tmp_path / "v", count=1, frames=20)
    ds = fd.VideoClipDataset(
        videos, clip_len=4, clip_sampling="uniform", transform=lambda s: s["frame"], index_cache=False
    )
    with pytest.raises(
        TransformFailed, match=r"v000\.mp4: sample \(frames \d+\.\.\d+\): transform .*KeyError: 'frame'"
    ):
        ds[0]


def test_s3_objects_name_the_url(s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]) -> None:
    upload_files(s3_server.client(), s3_bucket, {"img/a.jpg": b"x", "img/b.jpg": b"y"})
    ds = fd.S3Dataset(f"s3://{s3_bucket}/img/", transform=wrong_member, **s3_options)
    with pytest.raises(TransformFailed, match=rf"s3://{s3_bucket}/img/a\.jpg: sample \(key '.*a'\): transform"):
        ds[0]
