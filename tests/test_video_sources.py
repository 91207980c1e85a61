"""Where ``VideoClipDataset`` finds its videos (issue 33, item 7): labels from class folders, as for images,
and videos in S3 read through the node-local cache (the moto server on loopback), with real DataLoader
workers. Small H.264 videos made here through PyAV, stamped with their video and frame numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import fastdata as fd
from fastdata.core.errors import ConfigError
from tests.s3_server import MotoServer, upload_files
from tests.videogen import frames_for, read_stamp, write_h264

CLASSES = ("run", "walk", "jump")


@pytest.fixture(scope="module")
def class_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/<class>/<video>.mp4: two videos per class; video number k = 2 * class + j, 12 frames each."""
    root = tmp_path_factory.mktemp("kinetics")
    for c, name in enumerate(CLASSES):
        (root / name).mkdir()
        for j in range(2):
            write_h264(root / name / f"v{j}.mp4", frames_for(2 * c + j, 12), gop=4)
    return root


def _label_of(sample: dict) -> str:
    return Path(sample["path"]).parent.name


def test_class_folders_give_labels_and_classes(class_folders: Path) -> None:
    ds = fd.VideoClipDataset(str(class_folders), clip_len=4, index_cache=False)
    assert ds.classes == sorted(CLASSES)
    seen = {}
    for i in range(len(ds)):
        s = ds[i]
        assert ds.classes[s["label"]] == _label_of(s)
        seen[s["path"]] = s["label"]
    assert sorted(seen.values()) == [0, 0, 1, 1, 2, 2]
    batch = next(iter(DataLoader(ds, batch_size=6, num_workers=2)))
    assert batch["label"].dtype == torch.int64 and sorted(batch["label"].tolist()) == [0, 0, 1, 1, 2, 2]


def test_no_labels_without_class_folders_and_labels_true_refuses(class_folders: Path) -> None:
    flat = fd.VideoClipDataset(str(class_folders / "run"), clip_len=4, index_cache=False)
    assert flat.classes == [] and "label" not in flat[0]
    off = fd.VideoClipDataset(str(class_folders), clip_len=4, labels=False, index_cache=False)
    assert off.classes == [] and "label" not in off[0]
    with pytest.raises(ConfigError, match=r"labels=True.*class folders"):
        fd.VideoClipDataset(str(class_folders / "run"), clip_len=4, labels=True, index_cache=False)


@pytest.fixture(scope="module")
def moto(s3_server: MotoServer) -> MotoServer:
    return s3_server  # the session's server (tests/conftest.py)


@pytest.fixture(scope="module")
def s3_videos(moto: MotoServer, class_folders: Path) -> str:
    client = moto.client()
    client.create_bucket(Bucket="video-sources")
    upload_files(
        client, "video-sources", {str(p.relative_to(class_folders)): p for p in sorted(class_folders.rglob("*.mp4"))}
    )
    return "s3://video-sources/"


def _options(moto: MotoServer) -> dict:
    from tests.s3_server import CREDENTIALS, REGION

    return {"endpoint_url": moto.endpoint_url, "region_name": REGION, **CREDENTIALS}


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_s3_videos_read_through_the_cache_as_local_ones(
    s3_videos: str, moto: MotoServer, class_folders: Path, tmp_path: Path, start: str
) -> None:
    local = fd.VideoClipDataset(str(class_folders), clip_len=4, clips_per_video="all", index_cache=False)
    ds = fd.VideoClipDataset(
        s3_videos,
        clip_len=4,
        clips_per_video="all",
        storage_options=_options(moto),
        cache_dir=tmp_path / "cache",
        index_cache=tmp_path / "index.json",
    )
    assert ds.paths == [f"s3://video-sources/{Path(p).relative_to(class_folders)}" for p in local.paths]
    assert ds.classes == local.classes and len(ds) == len(local) == 6 * 3
    probed = ds.counters()["cache_misses"]
    assert probed == 6  # each video downloaded once, to be probed; the workers read those copies
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=start)
    got = {}
    for batch in loader:
        for k, path in enumerate(batch["path"]):
            got[(path, tuple(batch["frames"][k].tolist()))] = (batch["clip"][k], int(batch["label"][k]))
    assert len(got) == len(ds)
    for i in range(len(local)):
        want = local[i]
        url = f"s3://video-sources/{Path(want['path']).relative_to(class_folders)}"
        clip, label = got[(url, tuple(want["frames"].tolist()))]
        assert torch.equal(clip, want["clip"]) and label == want["label"]  # the same pixels and label
        assert read_stamp(clip[0].numpy())[1] == int(want["frames"][0])
    counts = ds.counters()
    assert counts["cache_misses"] == probed and counts["cache_hits"] >= 6  # no second download
    again = fd.VideoClipDataset(
        s3_videos,
        clip_len=4,
        storage_options=_options(moto),
        cache_dir=tmp_path / "cache",
        index_cache=tmp_path / "index.json",
    )
    assert again.index.probed == 0 and again.counters()["cache_misses"] == 0  # the index knows every video


def test_s3_videos_refuse_no_cache_and_name_the_url_of_a_bad_one(
    s3_videos: str, moto: MotoServer, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"cache_dir=False cannot work"):
        fd.VideoClipDataset(s3_videos, clip_len=4, storage_options=_options(moto), cache_dir=False, index_cache=False)
    upload_files(moto.client(), "video-sources", {"bad/broken.mp4": b"\x00not a video" * 100})
    with pytest.raises(fd.BadSample, match=r"s3://video-sources/bad/broken\.mp4: PyAV cannot open it") as e:
        fd.VideoClipDataset(
            ["s3://video-sources/bad/broken.mp4"],
            clip_len=4,
            storage_options=_options(moto),
            cache_dir=tmp_path,
            index_cache=False,
        )
    assert str(tmp_path) not in str(e.value)  # the URL, not the cached copy
