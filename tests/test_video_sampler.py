"""``ClipBatchSampler`` (loading/video_sampler.py) and ``VideoClipDataset.clip_sampler``: every clip once
per epoch across ranks, each lane's videos read forward, batches that mix videos, the same batches for
any ``num_workers``, exact resume through ``fd.Loader``, and decoded frames that are the ones asked for
when readers read on without a seek (decord and PyAV)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pytest

import fastdata as fd
from fastdata.core.errors import ConfigError
from fastdata.loading._video_sampler import ClipBatchSampler, stream_cuts, stream_order
from tests.videogen import make_videos, read_stamp

# 23 videos of 8 clips, one of 5 and one without clips: 194 clips
COUNTS = [8] * 23 + [5, 0]


def synthetic(batch_size: int = 8, **kw: Any) -> ClipBatchSampler:
    """A sampler over videos of COUNTS clips, whose start frames are seeded by (epoch, clip)."""
    starts = np.concatenate([[0], np.cumsum(COUNTS)])
    n = int(starts[-1])
    holder: dict[str, ClipBatchSampler] = {}

    def clip_starts() -> list[int]:
        rng = np.random.default_rng([holder["s"].epoch, 11])
        return rng.integers(0, 300, n).tolist()

    sampler = ClipBatchSampler(starts[:-1], n, batch_size, clip_starts=clip_starts, **kw)
    holder["s"] = sampler
    return sampler


def video_of(i: int) -> int:
    return int(np.searchsorted(np.cumsum(COUNTS), i, side="right"))


def test_streams_are_cut_at_videos_and_dealt_by_step_lane_and_stream() -> None:
    for length in (0, 1, 7, 64, 101):
        videos = np.arange(length) // 5
        cuts = stream_cuts(videos, 12)
        assert cuts[0] == 0 and cuts[-1] == length and (np.diff(cuts) >= 0).all()
        assert sorted(stream_order(cuts, lanes=3, run=2).tolist()) == list(range(length))
    # videos of 3 clips: the cuts of 4 equal streams of 15 (3.75) move to video starts
    assert stream_cuts(np.arange(15) // 3, 4).tolist() == [0, 3, 6, 12, 15]
    # one long video: no video start near, equal cuts
    assert stream_cuts(np.zeros(16, np.int64), 4).tolist() == [0, 4, 8, 12, 16]
    # 16 positions, 2 lanes of 2 streams of 2 chunks of 2: lane 0 holds streams 0 and 2
    got = stream_order(np.array([0, 4, 8, 12, 16]), lanes=2, run=2).tolist()
    assert got == [0, 1, 8, 9, 4, 5, 12, 13, 2, 3, 10, 11, 6, 7, 14, 15]


@pytest.mark.parametrize("remainder", ["drop", "pad", "uneven"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_clip_once_per_epoch_across_ranks(world_size: int, remainder: str) -> None:
    n = sum(COUNTS)
    seen: Counter[int] = Counter()
    for rank in range(world_size):
        sampler = synthetic(lanes=2, rank=rank, world_size=world_size, remainder=remainder)  # type: ignore[arg-type]
        batches = list(sampler)
        assert all(len(b) == 8 for b in batches[:-1]) and len(batches) == len(sampler)
        seen.update(i for b in batches for i in b)
    if remainder == "uneven":
        assert seen == Counter(range(n))
    elif remainder == "drop":
        assert max(seen.values()) == 1 and len(seen) == n // world_size * world_size
    else:
        assert set(seen) == set(range(n)) and sum(seen.values()) == -(-n // world_size) * world_size


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_each_lane_reads_its_videos_forward_and_batches_mix_videos(lanes: int) -> None:
    sampler = synthetic(lanes=lanes, run=2)
    frames = sampler._clip_starts()
    batches = list(sampler)
    full = batches[: len(batches) - lanes]  # the last step's batches may straddle lanes
    # each batch draws from at least half as many videos as it has clips
    assert all(len({video_of(i) for i in b}) >= len(b) // 2 for b in full)
    for lane in range(lanes):
        read: dict[int, list[int]] = defaultdict(list)
        open_videos: set[int] = set()
        for b in full[lane::lanes]:  # what DataLoader worker ``lane`` of ``lanes`` is dealt
            for i in sorted(b, key=lambda i: (video_of(i), frames[i])):  # as the dataset reads a batch
                read[video_of(i)].append(frames[i])
            open_videos |= {video_of(i) for i in b}
        for video, starts in read.items():
            assert starts == sorted(starts), f"lane {lane} reads video {video} backwards: {starts}"
    # another epoch, another order of videos and batches
    first = batches
    sampler.set_epoch(1)
    assert sorted(i for b in sampler for i in b) == sorted(i for b in first for i in b) and list(sampler) != first


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="multiple of run"):
        synthetic(batch_size=6, run=4)
    with pytest.raises(ConfigError):
        synthetic(lanes=0)


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_videos(tmp_path_factory.mktemp("videos"), count=6, frames=[60, 40, 80, 50, 45, 70])


def clips_of(loader: Any) -> list[list[tuple[int, int]]]:
    """(video, first frame) of each clip, batch by batch; checks every frame is the one it names."""
    out = []
    for batch in loader:
        for clip, video, frames in zip(batch["clip"], batch["video"], batch["frames"]):
            stamps = [read_stamp(frame.numpy()) for frame in clip]
            assert stamps == [(int(video), int(f)) for f in frames], "a decoded frame is not the one asked for"
        out.append([(int(v), int(f[0])) for v, f in zip(batch["video"], batch["frames"])])
    return out


@pytest.mark.parametrize("decoder", ["pyav", "decord"])
def test_clip_sampler_reads_the_right_frames_the_same_for_any_worker_count(decoder: str, videos: list[str]) -> None:
    ds = fd.VideoClipDataset(videos, clip_len=4, frame_stride=2, clips_per_video=4, decoder=decoder, index_cache=False)
    sampler = ds.clip_sampler(4, num_workers=2)
    want = clips_of(fd.Loader(ds, batch_sampler=sampler))
    every = sorted((video, frames[0]) for video, frames in map(ds.frames_of, range(len(ds))))
    assert sorted(c for b in want for c in b) == every  # each clip once
    got = clips_of(fd.Loader(ds, batch_sampler=sampler, num_workers=2, multiprocessing_context="fork"))
    assert got == want


def test_clip_sampler_resumes_through_the_loader(videos: list[str]) -> None:
    ds = fd.VideoClipDataset(videos, clip_len=4, frame_stride=2, clips_per_video=4, index_cache=False)
    want = clips_of(fd.Loader(ds, batch_sampler=ds.clip_sampler(4, num_workers=2)))
    loader = fd.Loader(
        ds, batch_sampler=ds.clip_sampler(4, num_workers=2), num_workers=2, multiprocessing_context="fork"
    )
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    del it
    loader.close()
    resumed = fd.Loader(ds, batch_sampler=ds.clip_sampler(4, num_workers=2), num_workers=3, workers="threads")
    resumed.load_state_dict(state)
    assert clips_of(resumed) == want[2:]
    resumed.close()
    other = fd.Loader(ds, batch_sampler=ds.clip_sampler(4, num_workers=3))  # another layout: other batches
    with pytest.raises(ConfigError, match="lanes"):
        other.load_state_dict(state)
