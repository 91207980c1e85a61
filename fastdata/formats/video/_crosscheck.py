"""Telling a decoder's own limits from a damaged file: ask PyAV.

When decord, OpenCV or torchcodec cannot open a file or decode some of its frames, the file may be
damaged, or the decoder may lack what the file needs (decord's and OpenCV's wheels cannot decode AV1,
for one). PyAV's FFmpeg decodes nearly everything, so the same frames are tried there: if PyAV decodes
them, the error says that this decoder cannot, and to use ``decoder='pyav'``, instead of calling a
sound file damaged. Only on the error path, so it costs nothing on reads that work.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastdata.formats.video._base import VideoReader, VideoUnsupported
from fastdata.formats.video._pyav import PyAVReader


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
