"""Videos encoded by the ``ffmpeg`` command line, where decoders went wrong: an MPEG-4 Part 2 AVI with
B-frames (torchcodec returned the frame before the one asked for after every seek, with no error),
H.264 in MPEG-TS with open and closed GOPs (PyAV and OpenCV refused it as damaged, FFmpeg's timestamp
search landing a keyframe group late; decord returned frame 12 as frame 0). Every decoder returns the
frames a sequential decode gives under each number, or refuses the file naming ``decoder='pyav'``;
PyAV, the default, reads them all."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

import av
import numpy as np
import pytest

import fastdata as fd
from fastdata.formats.video import VideoUnsupported, open_video, reader_class
from tests.test_video_readers import DECODERS, need
from tests.videogen import frames_for, read_stamp

N = 60
GOP = 12
# name -> (suffix, ffmpeg output options)
FILES = {
    "mpeg4-bframes-avi": (".avi", ["-c:v", "mpeg4", "-q:v", "2", "-bf", "2", "-g", str(GOP)]),
    "h264-open-gop-ts": (
        ".ts",
        [
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-x264-params",
            f"open-gop=1:keyint={GOP}:bframes=3",
            "-f",
            "mpegts",
        ],
    ),
    "h264-closed-gop-ts": (
        ".ts",
        ["-c:v", "libx264", "-preset", "ultrafast", "-x264-params", f"keyint={GOP}:bframes=3", "-f", "mpegts"],
    ),
}
CLIPS = [[0, 1, 2, 3], [13, 14, 15], [30, 31, 32], [5, 6], [N - 5, N - 4, N - 3, N - 2, N - 1], [24, 26, 28], [2, 3]]
# the refusals seen here, by decoder: each names the decoder that reads the file
REFUSED = {
    ("torchcodec", "mpeg4-bframes-avi"),
    ("decord", "mpeg4-bframes-avi"),
    ("opencv", "mpeg4-bframes-avi"),  # its last frame (OpenCV's timestamps end one frame early)
    ("torchcodec", "h264-open-gop-ts"),
    ("torchcodec", "h264-closed-gop-ts"),
    ("decord", "h264-open-gop-ts"),
    ("decord", "h264-closed-gop-ts"),
    ("opencv", "h264-open-gop-ts"),
    ("opencv", "h264-closed-gop-ts"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    ffmpeg = shutil.which("ffmpeg")
    assert ffmpeg, "these tests encode with Debian's ffmpeg: run tools/system_deps.sh"
    root = tmp_path_factory.mktemp("ffmpeg")
    frames = frames_for(0, N)
    h, w = frames.shape[1:3]
    out = {}
    for name, (suffix, options) in FILES.items():
        path = str(root / f"{name}{suffix}")
        command = [ffmpeg, "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}"]
        subprocess.run([*command, "-r", "25", "-i", "-", *options, path], input=frames.tobytes(), check=True)
        out[name] = path
    return out


def sequential(path: str) -> list[int]:
    """The frame stamps of a decode from the start, without a seek: what frame i is."""
    with av.open(path) as container:
        return [read_stamp(f.to_ndarray(format="rgb24"))[1] for f in container.decode(video=0)]


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("decoder", DECODERS)
def test_every_decoder_is_exact_or_refuses_naming_pyav(files: dict[str, str], decoder: str, name: str) -> None:
    need(decoder)
    path = files[name]
    assert sequential(path) == list(range(N))  # the file is sound: a sequential decode reads every frame
    got: list[list[int]] = []
    try:
        reader_class(decoder).probe(path)  # what the video index does at construction
        with open_video(path, decoder) as reader:
            assert reader.frame_count == N
            for clip in CLIPS:
                got.append([read_stamp(f)[1] for f in reader.get_frames(clip)])
                reader.pause()
    except VideoUnsupported as e:
        assert (decoder, name) in REFUSED, f"{decoder} refused {name}: {e}"
        assert re.search(r"use decoder='pyav'", str(e)) and Path(path).name in str(e)
        assert got == CLIPS[: len(got)]  # whatever came out before the refusal was exact
        return
    assert got == CLIPS, f"{decoder} on {name}"
    assert (decoder, name) not in REFUSED or decoder == "pyav", f"{decoder} now reads {name}: update REFUSED"


def test_pyav_reads_an_mpeg_ts_file_from_its_first_frame_after_any_seek(files: dict[str, str]) -> None:
    rng = np.random.default_rng(0)
    with open_video(files["h264-open-gop-ts"], "pyav") as reader:
        for _ in range(30):
            start = int(rng.integers(0, N - 4))
            clip = list(range(start, start + 4))
            assert [read_stamp(f)[1] for f in reader.get_frames(clip)] == clip
        assert [read_stamp(f)[1] for f in reader.get_frames([0, 1])] == [0, 1]


def test_torchcodec_is_refused_at_construction_on_the_b_frame_avi(files: dict[str, str], tmp_path: Path) -> None:
    need("torchcodec")
    path = files["mpeg4-bframes-avi"]
    with pytest.raises(VideoUnsupported, match=r"torchcodec returns other frames than asked.*decoder='pyav'"):
        fd.VideoClipDataset(path, clip_len=4, decoder="torchcodec", fallback=None, index_cache=False)
    # by default the file is read by the fallback decoder instead: counted, listed, warned about, exact
    with pytest.warns(UserWarning, match=r"1 of 1 videos are read with decoder='pyav'.*torchcodec returns other"):
        ds = fd.VideoClipDataset(path, clip_len=4, decoder="torchcodec", index_cache=False)
    assert ds.fallback_videos == [path] and ds.counters()["fallbacks"] == 1
    assert [read_stamp(f)[1] for f in ds[0]["clip"].numpy()] == ds[0]["frames"].tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = fd.VideoClipDataset([path, files["h264-open-gop-ts"]], clip_len=4, decoder="pyav", index_cache=False)
    assert len(ds) == 2 and [read_stamp(f)[1] for f in ds[0]["clip"].numpy()] == ds[0]["frames"].tolist()
