"""A video index damaged on disk is never trusted: each entry carries a digest of itself, and an entry
that does not check (or does not parse) is probed again, warned once. Before, an entry was trusted as
soon as the file's size and time matched: a bare ``KeyError``, clips whose pixels were other frames than
their numbers, or a sound video called damaged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fastdata as fd
from fastdata.formats.video._meta_cache import VideoIndex
from tests.videogen import make_videos, read_stamp

Entry = dict[str, Any]


def _wrong_frame_table(e: Entry) -> None:
    e["meta"]["extra"]["pts"]["start"] += 3 * e["meta"]["extra"]["pts"]["step"]  # frames 3 later


def _drop_meta(e: Entry) -> None:
    del e["meta"]


def _called_damaged(e: Entry) -> None:
    e["error"] = "v000.mp4: PyAV cannot open it as a video"


def _more_frames(e: Entry) -> None:
    e["meta"]["frames"] = 400


DAMAGE: dict[str, Callable[[Entry], None]] = {
    "frame table shifted": _wrong_frame_table,
    "meta removed": _drop_meta,
    "sound video called damaged": _called_damaged,
    "frame count raised": _more_frames,
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_entry_is_probed_again(tmp_path: Path, how: str) -> None:
    videos = make_videos(tmp_path / "videos", count=2, frames=24)
    index = tmp_path / "index.json"
    first = fd.VideoClipDataset(videos, clip_len=4, clips_per_video="all", index_cache=index)
    expected = [first[i]["frames"].tolist() for i in range(len(first))]
    data = json.loads(index.read_text())
    entry = data["videos"][str(Path(videos[0]).resolve())]
    DAMAGE[how](entry)
    index.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match=r"1 entry of the video index did not check .*probing those videos again"):
        again = fd.VideoClipDataset(videos, clip_len=4, clips_per_video="all", index_cache=index)
    assert len(again) == len(first)
    for i in range(len(again)):
        sample = again[i]
        assert sample["frames"].tolist() == expected[i]
        assert [read_stamp(f)[1] for f in sample["clip"].numpy()] == expected[i]  # the pixels are those frames
    rewritten = VideoIndex(index, "pyav")
    rewritten.build(videos, lambda p: pytest.fail(f"{p} probed a third time"))  # the index was repaired
    assert rewritten.probed == 0
