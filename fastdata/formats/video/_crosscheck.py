"""Telling a decoder's own limits from a damaged file: ask PyAV.

When decord, OpenCV or torchcodec cannot open a file or decode some of its frames, the file may be
damaged, or the decoder may lack what the file needs (decord's and OpenCV's wheels cannot decode AV1,
for one). PyAV's FFmpeg decodes nearly everything, so the same frames are tried there: if PyAV decodes
them, the error says that this decoder cannot, and to use ``decoder='pyav'``, instead of calling a
sound file damaged. Only on the error path, so it costs nothing on reads that work.

A decoder can also be wrong without an error: decord read an MPEG-TS file's frame 12 as frame 0 (and
every frame after it 12 late), torchcodec an AVI with B-frames one frame early after every seek. So when
such a decoder probes a video for the index (once per video: the result is cached), :func:`checked_probe`
decodes the first frame and one after a seek with it and with PyAV, and refuses the file
(:class:`~fastdata.formats.video.VideoUnsupported`, naming ``decoder='pyav'``) when the pixels
differ by more than the decoders' own conversions do (:data:`LIMIT`). A frame whose neighbours look
alike (a still shot) cannot be told from them this way; the other checks (the frame table, timestamps)
still apply there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastdata.formats.video._base import VideoMeta, VideoReader, VideoUnsupported
from fastdata.formats.video._pyav import PyAVReader

# mean absolute difference (of 255) above which two decodes of one frame are different frames: the
# decoders' RGB conversions differ by about 1 on the test videos, neighbouring frames of moving content
# by tens
LIMIT = 12.0


def unsupported(
    reader: VideoReader, codec: str, what: str, error: object, frames: Sequence[int] = (0,)
) -> VideoUnsupported | None:
    """The error for ``frames`` that ``reader`` failed on (``what``: "open", "decode frames 3..5 of"),
    when PyAV decodes them; None when PyAV fails too (the file is bad: the caller says so)."""
    try:
        with PyAVReader(reader.path, meta=getattr(reader, "meta", None)) as pyav:
            pyav.get_frames(frames)
    except Exception:  # noqa: BLE001 - any failure means the file itself is bad
        return None
    return VideoUnsupported(
        f"{reader.path}: {reader.name} cannot {what} this {codec} video ({error}), which PyAV decodes: "
        "use decoder='pyav'",
        reader.path,
    )


def check_points(reader: Any) -> list[int]:
    """Frames a probe reads: the first, and one that needs a seek (the frame after the second keyframe,
    which B-frames may precede in decode order; the last frame of a one-keyframe video); and where the
    decoder lists fewer keyframes than the stream holds (decord, on x264's scene-cut I-frames), the
    first keyframe it leaves out and the frame after it, reached by a seek to an earlier one."""
    table = reader.info.table
    later = [k for k in table.keys if k > table.keys[0]]
    after_seek = later[0] + 1 if later and later[0] + 1 < table.n else table.n - 1
    points = [0, after_seek]
    for key in getattr(reader, "unlisted_keys", [])[:1]:
        points += [min(key + 1, table.n - 1), key]  # the second one after the first: a seek back
    return [0, *(p for p in points[1:] if p > 0)]


def checked_probe(cls: type[VideoReader], path: str, threads: int = 1) -> VideoMeta:
    """Probe ``path`` with ``cls`` (a decoder other than PyAV), checking its frames against PyAV's
    (see the module docstring).

    Raises:
        VideoUnsupported: the decoder returns other frames than PyAV at the points checked.
    """
    with cls(path, threads=threads) as reader:
        points = check_points(reader)
        got = [reader.get_frames([f])[0] for f in points]  # one by one: the second read seeks
        meta = reader.meta
        name = reader.name
        codec = getattr(getattr(reader, "info", None), "codec", "?")
    try:
        with PyAVReader(path, meta=meta) as pyav:
            reference = [pyav.get_frames([f])[0] for f in points]
    except Exception:  # noqa: BLE001 - PyAV cannot read it either: nothing to hold the decoder to
        return meta
    for f, a, b in zip(points, got, reference):
        diff = float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()) if a.shape == b.shape else 255.0
        if diff > LIMIT:
            raise VideoUnsupported(
                f"{path}: {name} returns another frame than FFmpeg's decode as frame {f} of this {codec} "
                f"video (it differs from PyAV's frame {f} by {diff:.0f} of 255 on average), so its clips "
                "would hold other frames than their numbers say: use decoder='pyav'",
                path,
            )
    return meta
