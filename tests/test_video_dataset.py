"""VideoClipDataset: the shared conformance suite, the clip plan, the index cache, options, bad input."""

from __future__ import annotations

import multiprocessing
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data._utils.collate import default_collate

import fastdata as fd
from fastdata.core.errors import BadSampleWarning, ConfigError, SourceNotFound
from fastdata.formats.video import VideoMeta, VideoTooShort, VideoUnreadable
from fastdata.formats.video._pyav import PyAVReader
from tests.conformance import Backend, Conformance
from tests.videogen import make_videos, read_stamp

LENGTHS = [40, 33, 27]
CLIP_LEN, STRIDE = 4, 2
SPAN = (CLIP_LEN - 1) * STRIDE + 1
STEP = CLIP_LEN * STRIDE  # the default clip_step: the next clip continues the frame grid
EXPECTED = [(v, s) for v, n in enumerate(LENGTHS) for s in range(0, n - SPAN + 1, STEP)]


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # the default index file lives in the user's cache folder: keep tests out of $HOME
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fastdata-cache"))


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_videos(tmp_path_factory.mktemp("videos"), frames=LENGTHS, count=len(LENGTHS), seed=1)


def check_sample(clip: torch.Tensor, video: int, frames: list[int]) -> None:
    """The pixels say which video and frames they are: they must be the ones the sample names."""
    assert [read_stamp(f) for f in clip.numpy()] == [(video, f) for f in frames]


def keys_of(batch: dict[str, Any]) -> list[tuple[int, int]]:
    keys = []
    for clip, video, frames in zip(batch["clip"], batch["video"].tolist(), batch["frames"].tolist()):
        check_sample(clip, video, frames)
        keys.append((video, frames[0]))
    return keys


class TestVideoClipDataset(Conformance):
    @pytest.fixture
    def backend(self, videos: list[str]) -> Backend:
        def make(seed: int, shuffle: bool) -> fd.VideoClipDataset:
            return fd.VideoClipDataset(videos, clip_len=CLIP_LEN, frame_stride=STRIDE, clips_per_video="all", seed=seed)

        return Backend(make, EXPECTED, keys_of, iterable=False)


def test_sample(videos: list[str]) -> None:
    with fd.VideoClipDataset(videos, clip_len=CLIP_LEN, frame_stride=STRIDE, clips_per_video="all") as ds:
        assert len(ds) == len(EXPECTED)
        sample = ds[6]
        assert set(sample) == {"clip", "video", "path", "frames", "fps"}
        assert sample["clip"].dtype == torch.uint8 and sample["clip"].shape == (CLIP_LEN, 64, 96, 3)
        assert sample["frames"].dtype == torch.int64
        video, start = EXPECTED[6]
        assert sample["video"] == video and sample["path"] == videos[video] and sample["fps"] == pytest.approx(25)
        assert sample["frames"].tolist() == list(range(start, start + SPAN, STRIDE))
        check_sample(sample["clip"], video, sample["frames"].tolist())


def test_random_starts_follow_seed_and_epoch_in_every_worker(videos: list[str]) -> None:
    def make(seed: int) -> fd.VideoClipDataset:
        return fd.VideoClipDataset(videos, clip_len=CLIP_LEN, frame_stride=STRIDE, clips_per_video=3, seed=seed)

    ds = make(5)
    assert len(ds) == 3 * len(videos)
    plan = [ds.frames_of(i) for i in range(len(ds))]
    assert plan == [make(5).frames_of(i) for i in range(len(ds))]
    assert plan != [make(6).frames_of(i) for i in range(len(ds))]
    for video, frames in plan:
        assert frames[0] >= 0 and frames[-1] < LENGTHS[video]
    ds.set_epoch(1)
    assert [ds.frames_of(i) for i in range(len(ds))] != plan
    # the workers (forked before or after set_epoch) draw the same starts as the main process
    loader = DataLoader(
        ds,
        batch_size=2,
        sampler=ds.sampler(shuffle=True),
        num_workers=2,
        multiprocessing_context=multiprocessing.get_context("fork"),
        persistent_workers=True,
    )
    for epoch in (1, 2):
        ds.set_epoch(epoch)
        want = {(v, tuple(f)) for v, f in (ds.frames_of(i) for i in range(len(ds)))}
        got = set()
        for batch in loader:
            keys_of(batch)
            got |= {(v, tuple(f)) for v, f in zip(batch["video"].tolist(), batch["frames"].tolist())}
        assert got == want


def test_uniform_and_all_with_a_step(videos: list[str]) -> None:
    ds = fd.VideoClipDataset(videos, clip_len=CLIP_LEN, frame_stride=STRIDE, clips_per_video=3, clip_sampling="uniform")
    assert [ds.frames_of(i)[1][0] for i in range(3)] == [0, (40 - SPAN) // 2, 40 - SPAN]
    ds = fd.VideoClipDataset(videos, clip_len=CLIP_LEN, frame_stride=STRIDE, clips_per_video="all", clip_step=3)
    assert len(ds) == sum((n - SPAN) // 3 + 1 for n in LENGTHS)
    assert [ds.frames_of(i)[1][0] for i in range(3)] == [0, 3, 6]


def test_size_and_transform(videos: list[str]) -> None:
    def halve_clip(sample: dict[str, Any]) -> dict[str, Any]:
        sample["clip"] = sample["clip"][:, ::2, ::2]
        return sample

    ds = fd.VideoClipDataset(videos, clip_len=CLIP_LEN, frame_stride=STRIDE, size=(128, 192), transform=halve_clip)
    sample = ds[0]
    assert sample["clip"].shape == (CLIP_LEN, 64, 96, 3)
    check_sample(sample["clip"], 0, sample["frames"].tolist())


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"clip_sampling": "randon"}, "'random', 'uniform'"),
        ({"decoder": "ffmpg"}, "'pyav', 'decord', 'opencv', 'torchcodec'"),
        ({"clip_len": 0}, "clip_len"),
        ({"clips_per_video": "every"}, "clips_per_video"),
        ({"stagger": (0.1, 0.0)}, "stagger"),
        ({"size": (64,)}, "size"),
        ({"decode_timeout": 0}, "decode_timeout"),
        ({"on_error": "ignore"}, "'raise', 'skip'"),
    ],
)
def test_options_fail_at_construction(videos: list[str], option: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fd.VideoClipDataset(videos, **option)


class CountingReader(PyAVReader):
    """PyAV, counting how many videos it probes (in this process)."""

    probes = 0

    @classmethod
    def probe(cls, path: str, *, threads: int = 1) -> VideoMeta:
        CountingReader.probes += 1
        return super().probe(path, threads=threads)


def test_second_start_probes_only_new_or_changed_videos(videos: list[str], tmp_path: Path) -> None:
    index = tmp_path / "beside-the-videos.json"

    def build() -> int:
        before = CountingReader.probes
        ds = fd.VideoClipDataset(videos, clip_len=CLIP_LEN, decoder=CountingReader, index_cache=index)
        assert ds.index.probed == CountingReader.probes - before
        return ds.index.probed

    assert build() == len(videos)
    assert index.exists()
    assert build() == 0
    st = os.stat(videos[1])
    os.utime(videos[1], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert build() == 1
    # the default: an index file in the user's cache folder, found again by the next start
    fd.VideoClipDataset(videos, clip_len=CLIP_LEN, decoder=CountingReader)
    again = fd.VideoClipDataset(videos, clip_len=CLIP_LEN, decoder=CountingReader)
    assert again.index.probed == 0
    assert again.index.file is not None
    assert again.index.file.parent == Path(os.environ["FASTDATA_CACHE_DIR"]) / "video-index"


@pytest.fixture
def bad_set(videos: list[str], tmp_path: Path) -> list[str]:
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    text = tmp_path / "readme.mp4"
    text.write_text("not a video\n" * 50)
    short = make_videos(tmp_path, count=1, frames=5, prefix="short")[0]
    return [videos[0], str(tmp_path / "missing.mp4"), str(empty), str(text), short, videos[2]]


@pytest.mark.parametrize(
    ("bad", "error", "name"),
    [
        (1, SourceNotFound, "missing.mp4"),
        (2, VideoUnreadable, "empty.mp4"),
        (3, VideoUnreadable, "readme.mp4"),
        (4, VideoTooShort, "short000.mp4"),
    ],
)
def test_bad_video_at_construction_names_the_file(bad_set: list[str], bad: int, error: type, name: str) -> None:
    with pytest.raises(error, match=re.escape(name)):
        fd.VideoClipDataset([bad_set[0], bad_set[bad]], clip_len=CLIP_LEN, frame_stride=STRIDE, index_cache=False)


def test_bad_videos_at_construction_are_skipped_and_counted(bad_set: list[str]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = fd.VideoClipDataset(
            bad_set, clip_len=CLIP_LEN, frame_stride=STRIDE, clips_per_video="all", on_error="skip"
        )
    assert ds.skipped == 4
    warned = [str(w.message) for w in caught if issubclass(w.category, BadSampleWarning)]
    assert len(warned) == 4
    for name in ("missing.mp4", "empty.mp4", "readme.mp4", "short000.mp4"):
        assert sum(name in w for w in warned) == 1
    keys = []
    for batch in DataLoader(ds, batch_size=4, sampler=ds.sampler(shuffle=False)):
        for clip, path, frames in zip(batch["clip"], batch["path"], batch["frames"].tolist()):
            stamped = bad_set.index(path) // 5 * 2  # bad_set[0] is video 0, bad_set[5] is video 2
            check_sample(clip, stamped, frames)
            keys.append((stamped, frames[0]))
    assert sorted(keys) == sorted((v, s) for v, s in EXPECTED if v in (0, 2))


def test_video_damaged_after_indexing(tmp_path: Path) -> None:
    paths = make_videos(tmp_path, count=3, frames=LENGTHS, seed=1)
    options: dict[str, Any] = {
        "clip_len": CLIP_LEN,
        "frame_stride": STRIDE,
        "clips_per_video": "all",
        "index_cache": False,
    }
    skipping = fd.VideoClipDataset(paths, on_error="skip", **options)
    strict = fd.VideoClipDataset(paths, **options)
    data = Path(paths[1]).read_bytes()
    Path(paths[1]).write_bytes(data[: len(data) // 3])  # cut short after the index was built
    with pytest.raises(VideoUnreadable, match=re.escape(Path(paths[1]).name)):
        strict[EXPECTED.index((1, 0))]
    loader = DataLoader(
        skipping,
        batch_size=4,
        sampler=skipping.sampler(shuffle=True),
        num_workers=2,
        multiprocessing_context=multiprocessing.get_context("fork"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        keys = [k for batch in loader for k in keys_of(batch)]
    assert sorted(keys) == sorted((v, s) for v, s in EXPECTED if v != 1)
    assert skipping.skipped == sum(v == 1 for v, _ in EXPECTED)  # counted in the workers, seen here


def _collate_with_worker(batch: list[dict[str, Any]]) -> tuple[Any, int, float]:
    info = get_worker_info()
    assert info is not None
    return default_collate(batch), info.id, info.dataset.stagger_delay  # type: ignore[attr-defined]


def test_stagger_is_seeded_per_worker_and_skipped_alone(videos: list[str]) -> None:
    def delays(seed: int) -> dict[int, float]:
        ds = fd.VideoClipDataset(
            videos, clip_len=CLIP_LEN, frame_stride=STRIDE, clips_per_video="all", seed=seed, stagger=(0.0, 0.05)
        )
        loader = DataLoader(
            ds,
            batch_size=2,
            num_workers=3,
            collate_fn=_collate_with_worker,
            multiprocessing_context=multiprocessing.get_context("fork"),
        )
        return {worker: delay for _, worker, delay in loader}

    first = delays(0)
    assert sorted(first) == [0, 1, 2]
    assert all(0.0 <= d < 0.05 for d in first.values()) and len(set(first.values())) == 3
    assert delays(0) == first
    assert delays(1) != first
    alone = fd.VideoClipDataset(videos, clip_len=CLIP_LEN, stagger=(1.0, 2.0))
    alone[0]  # one reader, no workers: nothing to spread, no delay
    assert alone.stagger_delay == 0.0


def test_batch_of_only_bad_clips_gets_a_substitute(videos: list[str], tmp_path: Path) -> None:
    paths = make_videos(tmp_path, count=2, frames=[20, 20], seed=1)
    ds = fd.VideoClipDataset(paths, clip_len=CLIP_LEN, clips_per_video=2, on_error="skip", index_cache=False)
    os.remove(paths[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        assert ds[0]["video"] == 1  # clip 2, the first good one after it, stands in
        assert [s["video"] for s in ds.__getitems__([0, 1])] == [1]
        assert len(ds.__getitems__([0, 2, 3])) == 2
    assert ds.skipped == 4 and ds.counters()["substituted"] == 2
