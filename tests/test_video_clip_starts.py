"""Where VideoClipDataset's clips start (fastdata.datasets.video._plan): by default distinct random starts
within a video in each epoch, as far as the video allows; the old independent draws as an option."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import fastdata as fd
from fastdata.core.errors import ConfigError
from fastdata.datasets.video._plan import ClipStarts
from tests.videogen import make_videos


def starts(plan: ClipStarts, epoch: int, video: int, k: int, room: int) -> list[int]:
    return [plan.start(epoch, video, clip, room) for clip in range(k)]


def test_random_starts_are_distinct_within_a_video_and_new_each_epoch() -> None:
    plan = ClipStarts(seed=0, clips_per_video=8, clip_step=1, clip_sampling="random")
    by_epoch = [starts(plan, epoch, video=3, k=8, room=19) for epoch in range(5)]
    for got in by_epoch:
        assert len(set(got)) == 8 and all(0 <= s <= 19 for s in got)
    assert len({tuple(got) for got in by_epoch}) == 5, "new starts every epoch"
    again = ClipStarts(seed=0, clips_per_video=8, clip_step=1, clip_sampling="random")
    assert starts(again, 2, video=3, k=8, room=19) == by_epoch[2], "a pure function of (seed, epoch, video)"
    assert starts(plan, 2, video=4, k=8, room=19) != by_epoch[2]


def test_more_clips_than_starts_use_every_start_before_any_twice() -> None:
    plan = ClipStarts(seed=1, clips_per_video=7, clip_step=1, clip_sampling="random")
    counts = Counter(starts(plan, 0, video=0, k=7, room=2))  # 3 possible starts for 7 clips
    assert set(counts) == {0, 1, 2} and max(counts.values()) - min(counts.values()) <= 1


def test_random_replace_draws_each_clip_on_its_own() -> None:
    # 12 clips among 16 starts: independent draws coincide (here, for this seed); "random" never does
    old = ClipStarts(seed=0, clips_per_video=12, clip_step=1, clip_sampling="random-replace")
    new = ClipStarts(seed=0, clips_per_video=12, clip_step=1, clip_sampling="random")
    collisions = sum(len(set(starts(old, e, 0, 12, 15))) < 12 for e in range(10))
    assert collisions > 0
    assert all(len(set(starts(new, e, 0, 12, 15))) == 12 for e in range(10))


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_videos(tmp_path_factory.mktemp("videos"), count=2, frames=[14, 9], seed=5)


def test_dataset_clips_of_a_video_start_apart(videos: list[str], tmp_path: Any) -> None:
    ds = fd.VideoClipDataset(videos, clip_len=2, frame_stride=2, clips_per_video=5, index_cache=tmp_path / "i.json")
    for epoch in range(3):
        ds.set_epoch(epoch)
        plan = [ds.frames_of(i) for i in range(len(ds))]
        for video in (0, 1):
            firsts = [frames[0] for v, frames in plan if v == video]
            assert len(firsts) == 5 and len(set(firsts)) == 5, (epoch, video, firsts)


def test_a_misspelled_clip_sampling_fails_at_construction(videos: list[str], tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="'random', 'uniform', 'random-replace'"):
        fd.VideoClipDataset(videos, clip_sampling="random_replace", index_cache=tmp_path / "i.json")  # type: ignore[arg-type]
