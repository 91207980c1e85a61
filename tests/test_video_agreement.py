"""The same clip from every decoder: each decoder's frames equal a sequential PyAV decode of the stream
FFmpeg picks, turned by the display matrix, on files where decoders used to disagree; where a decoder
cannot be exact on a file it refuses it, naming the decoder that can, and never returns other frames.

Each generated file holds frames stamped with their frame number and with a stream number
(``tests/videogen.py``): the stamp, read after undoing the display turn, proves the frame is the one
asked for, from the stream asked for, turned the right way; the pixels are then compared with the
reference decode within a small tolerance (decoders convert to RGB with different FFmpeg builds).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest

import fastdata as fd
from fastdata.formats.video import VideoUnsupported, open_video
from tests.test_video_readers import DECODERS, need
from tests.videogen import frames_for, read_stamp, write_pyav

N = 40  # frames per file


def _vfr_ms(slow_first: bool) -> list[int]:
    """Timestamps of frames at 12.5 fps for the first half and 25 fps for the second (or the reverse):
    OpenCV, which numbers frames by time after a seek, lands up to 3 frames early (late) there."""
    gaps = [80 if (i < N // 2) == slow_first else 40 for i in range(N - 1)]
    return [0, *np.cumsum(gaps).tolist()]


# how a file's frames are displayed, and back: (stored -> displayed, displayed -> stored)
Turn = Callable[[np.ndarray], np.ndarray]
AS_STORED: tuple[Turn, Turn] = (lambda f: f, lambda f: f)
QUARTER_TURN: tuple[Turn, Turn] = (lambda f: np.rot90(f, 1), lambda f: np.rot90(f, -1))  # counter-clockwise
MIRROR: tuple[Turn, Turn] = (lambda f: f[:, ::-1], lambda f: f[:, ::-1])

# name -> (how to write it, the stream FFmpeg picks (its stamp number), how it is displayed)
FILES: dict[str, tuple[Callable[[Path], str], int, tuple[Turn, Turn]]] = {
    "h264-bframes": (lambda p: write_pyav(p, [frames_for(0, N)]), 0, AS_STORED),
    "hevc-open-gop": (lambda p: write_pyav(p, [frames_for(0, N)], codec="libx265", bframes=4), 0, AS_STORED),
    "vfr-slow-then-fast": (lambda p: write_pyav(p, [frames_for(0, N)], pts_ms=_vfr_ms(True)), 0, AS_STORED),
    "vfr-fast-then-slow": (lambda p: write_pyav(p, [frames_for(0, N)], pts_ms=_vfr_ms(False)), 0, AS_STORED),
    "rotated": (lambda p: write_pyav(p, [frames_for(0, N)], rotation=90), 0, QUARTER_TURN),
    "mirrored": (lambda p: write_pyav(p, [frames_for(0, N)], hflip=True), 0, MIRROR),
    # both streams "default" (as in a file with two renditions): FFmpeg picks the larger one, stream 1
    "two-streams": (
        lambda p: write_pyav(p, [frames_for(0, N), frames_for(1, N + 10, size=(128, 80))], default=[True, True]),
        1,
        AS_STORED,
    ),
    # only the first "default": FFmpeg picks it; older FFmpeg builds (decord's) pick the larger one
    "two-streams-first-default": (
        lambda p: write_pyav(p, [frames_for(0, N), frames_for(1, N + 10, size=(128, 80))], default=[True, False]),
        0,
        AS_STORED,
    ),
    "av1": (lambda p: write_pyav(p, [frames_for(0, N)], codec="libsvtav1"), 0, AS_STORED),
}
ENCODERS = {"hevc-open-gop": "libx265", "av1": "libsvtav1"}

# (decoder, file) -> what its refusal says: the decoders that cannot be exact on these files
REFUSED = {
    ("decord", "hevc-open-gop"): r"keyframes are frames .* other frames than asked after a seek",
    ("decord", "two-streams-first-default"): r"decord counts 50 frames, video stream 0 holds 40",
    ("opencv", "two-streams"): r"OpenCV reads only the first, fastdata reads stream 1",
    ("decord", "av1"): r"decord cannot open this av1 video",
    ("opencv", "av1"): r"opencv cannot decode frames 0\.\.0 of this av1 video",
}
# the refusals that depend on how the decoder was built: OpenCV's FFmpeg decodes AV1 where it has dav1d or
# libaom (its wheels differ by version and platform), so there it must return the reference frames instead
BUILD_DEPENDENT = {("opencv", "av1")}

CLIPS = [  # read in this order from one reader: some continue the read before, some seek
    [0, 1, 2, 3, 4],
    [5, 6, 7, 8, 9],  # up to a keyframe
    [8, 9, 10, 11, 12],  # back a little, across a keyframe
    [12, 14, 16, 18, 20, 22],  # strided, across one
    [N - 4, N - 3, N - 2, N - 1],  # the end
    [30, 31, 32, 33],  # back
    [34, 35, 36, 37],  # continues the clip before
    [3, 4, 5, 6],  # back to the start
    [21, 27, 7, 39],  # scattered, unsorted
    [26, 27, 28, 29],  # back
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("agreement")
    out = {}
    for name, (write, _, _) in FILES.items():
        if ENCODERS.get(name, "libx264") in av.codecs_available:
            out[name] = write(root / f"{name}.mp4")
    return out


def reference(path: str) -> list[np.ndarray]:
    """Every frame of the stream FFmpeg picks, decoded in order from the start (no seek), as stored."""
    with av.open(path) as container:
        stream = container.streams.best("video")
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize("decoder", DECODERS)
def test_every_decoder_returns_the_reference_frames_or_refuses(files: dict[str, str], decoder: str, name: str) -> None:
    need(decoder)
    if name not in files:
        pytest.skip(f"this PyAV build cannot encode {ENCODERS[name]}")  # the file cannot be made here
    path = files[name]
    _, stream, (turn, undo) = FILES[name]
    refused = REFUSED.get((decoder, name))
    if refused is not None:
        refusal = re.escape(Path(path).name) + ".*" + refused + ".*decoder='pyav'"
        if (decoder, name) not in BUILD_DEPENDENT:
            with pytest.raises(VideoUnsupported, match=refusal):
                open_video(path, decoder).get_frames([0])
            return
        try:
            with open_video(path, decoder) as probe:
                probe.get_frames([0])
        except VideoUnsupported as e:
            assert re.search(refusal, str(e)), str(e)
            return
        # this build decodes it: then every frame must be the reference's, as for any decoder
    stored = reference(path)
    assert [read_stamp(f) for f in stored] == [(stream, i) for i in range(len(stored))]  # the reference is right
    shown = [np.ascontiguousarray(turn(f)) for f in stored]
    with open_video(path, decoder) as reader:
        assert reader.frame_count == len(stored)
        assert reader.out_size == shown[0].shape[:2]
        for clip in CLIPS:
            got = reader.get_frames(clip)
            stamps = [read_stamp(np.ascontiguousarray(undo(f))) for f in got]
            assert stamps == [(stream, i) for i in clip], f"{decoder} on {name}, frames {clip}"
            diff = np.abs(got.astype(np.int16) - np.stack([shown[i] for i in clip])).mean()
            assert diff < 3, f"{decoder} on {name}, frames {clip}: mean pixel difference {diff:.1f}"
            reader.pause()  # as the reader pool does between batches


@pytest.mark.parametrize("decoder", DECODERS)
def test_the_dataset_reads_the_chosen_stream_turned(files: dict[str, str], tmp_path: Path, decoder: str) -> None:
    """Through VideoClipDataset (probe, index, reader pool): a turned video comes out turned, at its
    displayed size, from every decoder."""
    need(decoder)
    ds = fd.VideoClipDataset(files["rotated"], clip_len=4, clips_per_video="all", decoder=decoder, index_cache=False)
    assert len(ds) == N // 4
    for i in range(len(ds)):
        sample = ds[i]
        assert tuple(sample["clip"].shape) == (4, 96, 64, 3)
        stamps = [read_stamp(np.rot90(f, -1)) for f in sample["clip"].numpy()]
        assert stamps == [(0, int(f)) for f in sample["frames"]]
