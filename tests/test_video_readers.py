"""Every decoder returns exactly the frames asked for, on every codec, and names the file when it cannot.

Test videos carry their video and frame numbers in their pixels (``tests/videogen.py``), so a wrong
seek shows up as a wrong number, not as a slightly different image.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastdata as fd
from fastdata.core.errors import BadSampleWarning, ConfigError, SourceNotFound
from fastdata.formats.video import FramesMissing, VideoUnreadable, open_video, reader_class
from tests.videogen import CODECS, frames_for, make_videos, read_stamp, write_h264


@functools.cache
def _available(decoder: str) -> str | None:
    """None when the decoder's library imports here, else why not."""
    try:
        reader_class(decoder)
        if decoder == "torchcodec":
            importlib.import_module("torchcodec.decoders")  # loads the system FFmpeg libraries
    except Exception as e:  # noqa: BLE001 - any failure to load means the decoder cannot be tested here
        return f"{decoder} cannot be imported here: {type(e).__name__}: {str(e)[:200]}"
    return None


DECODERS = ["pyav", "decord", "opencv", "torchcodec"]


def need(decoder: str) -> None:
    """Fail the test, saying why, when the decoder's library cannot be loaded here: the test set-up
    installs every decoder (the [test] extra, and the system's FFmpeg for torchcodec through
    tools/system_deps.sh), so a missing one is a broken set-up, not a reason to pass quietly."""
    reason = _available(decoder)
    if reason:
        pytest.fail(f"{reason} (the test set-up installs it: pip install -e '.[test]' and tools/system_deps.sh)")


FRAMES = 40


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("codecs")
    return {codec: make_videos(root / codec, count=2, frames=FRAMES, codec=codec, seed=3) for codec in CODECS}


def stamps(frames: np.ndarray) -> list[tuple[int, int]]:
    return [read_stamp(f) for f in frames]


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("decoder", DECODERS)
def test_exactly_the_frames_asked_for(videos: dict[str, list[str]], decoder: str, codec: str) -> None:
    need(decoder)
    path = videos[codec][1]
    rng = np.random.default_rng(7)
    with open_video(path, decoder) as reader:
        assert reader.frame_count == FRAMES
        assert reader.fps == pytest.approx(25.0, rel=0.01)
        assert reader.out_size == (64, 96)
        requests = [
            [0, 1, 2, 3],  # the start
            list(range(FRAMES - 8, FRAMES, 2)),  # the end, strided
            [17, 3, 39, 3, 22],  # unsorted, repeated, backwards jumps
            list(range(5, 36, 5)),  # strided across several keyframes
            *[sorted(rng.choice(FRAMES, 6, replace=False).tolist()) for _ in range(6)],
            *[list(range(s, s + 8)) for s in (8, 16, 24)],  # sequential clips: the reader moves forward
        ]
        for wanted in requests:
            got = reader.get_frames(wanted)
            assert got.dtype == np.uint8 and got.shape == (len(wanted), 64, 96, 3)
            assert stamps(got) == [(1, i) for i in wanted], f"{decoder} on {codec}, frames {wanted}"


@pytest.mark.parametrize("decoder", DECODERS)
def test_resize(videos: dict[str, list[str]], decoder: str) -> None:
    need(decoder)
    with open_video(videos["mp4v"][0], decoder, size=(128, 192)) as reader:
        got = reader.get_frames([4, 11])
    assert got.shape == (2, 128, 192, 3)
    assert stamps(got[:, ::2, ::2]) == [(0, 4), (0, 11)]  # upscaled 2x: halving it reads back


@pytest.mark.parametrize("decoder", DECODERS)
def test_out_of_range_is_an_index_error_naming_the_file(videos: dict[str, list[str]], decoder: str) -> None:
    need(decoder)
    path = videos["mjpg"][0]
    with open_video(path, decoder) as reader, pytest.raises(IndexError, match=re.escape(Path(path).name)):
        reader.get_frames([FRAMES])


@pytest.mark.parametrize("decoder", DECODERS)
def test_missing_empty_and_not_a_video(tmp_path: Path, decoder: str) -> None:
    need(decoder)
    with pytest.raises(SourceNotFound, match=r"nope.mp4"):
        open_video(str(tmp_path / "nope.mp4"), decoder)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(VideoUnreadable, match=r"empty.mp4"):
        open_video(str(empty), decoder)
    text = tmp_path / "notes.mp4"
    text.write_text("these are not the frames you are looking for\n" * 100)
    with pytest.raises(VideoUnreadable, match=r"notes.mp4"):
        open_video(str(text), decoder)


@pytest.mark.parametrize("decoder", DECODERS)
def test_truncated_file(videos: dict[str, list[str]], tmp_path: Path, decoder: str) -> None:
    """An MP4 cut short loses its index (OpenCV writes it last): nothing can open it."""
    need(decoder)
    data = Path(videos["mp4v"][0]).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(VideoUnreadable, match=r"cut.mp4"):
        open_video(str(cut), decoder)


@pytest.mark.parametrize("decoder", DECODERS)
def test_frame_count_over_reported(tmp_path: Path, decoder: str) -> None:
    """An AVI whose header announces 40 frames but holds 25: frames the container announces and the
    file does not hold are an error naming the file, for every decoder (not a shorter video)."""
    need(decoder)
    path = make_videos(tmp_path, count=1, frames=25, codec="mjpg")[0]
    _patch_avi_frame_count(path, 40)
    with pytest.raises(FramesMissing, match=re.escape(Path(path).name) + r".*announces 40 frames, the file holds 25"):
        open_video(path, decoder)


@pytest.mark.parametrize("decoder", DECODERS)
def test_truncated_file_with_its_index_in_front(tmp_path: Path, decoder: str) -> None:
    """An MP4 written with its index first (``+faststart``) and cut inside its frame data still opens:
    the index announces 60 frames, the file holds 36. Every decoder refuses it, naming the file; under
    on_error="skip" the dataset leaves it out and counts it (PyAV used to read it as 36 frames)."""
    need(decoder)
    full = write_h264(tmp_path / "full.mp4", frames_for(0, 60), faststart=True)
    data = Path(full).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 6 // 10])
    with pytest.raises(FramesMissing, match=r"cut\.mp4: the container announces 60 frames"):
        open_video(str(cut), decoder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        ds = fd.VideoClipDataset([full, str(cut)], clip_len=4, decoder=decoder, on_error="skip", index_cache=False)
    assert ds.paths == [full, str(cut)] and len(ds) == 1 and ds.skipped == 1


def _patch_avi_frame_count(path: str, frames: int) -> None:
    """Rewrite the total-frames fields of an AVI's main header and video stream header."""
    data = bytearray(Path(path).read_bytes())
    avih = data.index(b"avih")
    data[avih + 8 + 16 : avih + 8 + 20] = frames.to_bytes(4, "little")  # dwTotalFrames
    strh = data.index(b"strh")
    data[strh + 8 + 32 : strh + 8 + 36] = frames.to_bytes(4, "little")  # dwLength
    Path(path).write_bytes(bytes(data))


def test_unknown_decoder_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="'pyav', 'decord', 'opencv', 'torchcodec'"):
        reader_class("ffmpeg")
