"""``on_error="skip"`` names every bad file: each distinct missing or unreadable file, shard or key gets a
warning of its own (once per process) and every skip is counted, in every backend."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.core.errors import BadSampleWarning
from tests.datagen import make_shards
from tests.hdf5_datagen import make_h5
from tests.s3_server import MotoServer, upload_files
from tests.videogen import make_videos


def skip_warnings(build: Callable[[], Any]) -> tuple[Any, list[str]]:
    """What ``build()`` returns, and the message of every BadSampleWarning it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = build()
    return out, [str(w.message) for w in caught if issubclass(w.category, BadSampleWarning)]


def bad_pair(tmp_path: Path, suffix: str) -> tuple[str, str]:
    """A file that does not exist and one that cannot be read (a folder under a file's name)."""
    unreadable = tmp_path / f"unreadable{suffix}"
    unreadable.mkdir()
    return str(tmp_path / f"missing{suffix}"), str(unreadable)


def assert_each_named_once(messages: list[str], bad: tuple[str, ...]) -> None:
    assert len(messages) == len(bad), messages
    for path in bad:
        assert sum(path in m for m in messages) == 1, (path, messages)


@pytest.mark.parametrize("kind", ["TarShardDataset", "IndexedTarDataset"])
def test_tar_names_each_missing_and_unreadable_shard(tmp_path: Path, kind: str) -> None:
    good = make_shards(tmp_path / "ok", shards=1, per_shard=3)
    bad = bad_pair(tmp_path, ".tar")
    ds, messages = skip_warnings(lambda: getattr(fd, kind)([*good, *bad], on_error="skip"))
    assert_each_named_once(messages, bad)
    assert ds.skipped == 2  # one per shard whose sample count is unknown
    samples = list(ds) if kind == "TarShardDataset" else [ds[i] for i in range(len(ds))]
    assert len(samples) == 3


def test_hdf5_names_each_missing_and_unreadable_file(tmp_path: Path) -> None:
    good = str(tmp_path / "good.h5")
    make_h5(good, 4)
    bad = bad_pair(tmp_path, ".h5")
    ds, messages = skip_warnings(lambda: fd.HDF5Dataset([bad[0], good, bad[1]], ("key",), on_error="skip"))
    assert_each_named_once(messages, bad)
    assert ds.skipped == 2 and len(ds) == 4


def test_video_names_each_missing_and_undecodable_file(tmp_path: Path) -> None:
    good = make_videos(tmp_path / "v", count=1, frames=8)
    junk = tmp_path / "junk.mp4"  # a folder is a folder of videos here: bytes no decoder can open instead
    junk.write_bytes(b"not a video at all" * 50)
    bad = (str(tmp_path / "missing-1.mp4"), str(tmp_path / "missing-2.mp4"), str(junk))
    options = {"clip_len": 4, "index_cache": False, "on_error": "skip"}
    ds, messages = skip_warnings(lambda: fd.VideoClipDataset([*good, *bad], **options))
    assert_each_named_once(messages, bad)
    assert ds.skipped == 3 and len(ds) >= 1


def test_s3_names_each_missing_key(s3_server: MotoServer, s3_bucket: str, s3_options: dict[str, Any]) -> None:
    (good,) = upload_files(s3_server.client(), s3_bucket, {"a.bin": b"a" * 100})
    bad = (f"s3://{s3_bucket}/gone-1.bin", f"s3://{s3_bucket}/gone-2.bin")
    ds = fd.S3Dataset([bad[0], good, bad[1]], on_missing="skip", **s3_options)
    got, messages = skip_warnings(lambda: ds.__getitems__([0, 1, 2]) + ds.__getitems__([2, 1]))
    assert_each_named_once(messages, bad)  # gone-2 asked twice: counted twice, warned once
    assert [s["__url__"] for s in got] == [good, good] and ds.skipped == 3
