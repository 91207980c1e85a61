"""The OpenCV reader: a kept-open ``cv2.VideoCapture`` that seeks only when it must.

``VideoCapture.set(CAP_PROP_POS_FRAMES, i)`` is frame-exact but costly: OpenCV seeks to the keyframe
before ``i - 16`` and decodes forward from there. So a read that starts a little ahead of where the
capture stands grabs forward instead, and only the frames asked for are converted (``grab`` decodes,
``retrieve`` converts).

OpenCV reports the frame count the container declares, which can be more than the frames present
(a truncated AVI, a damaged MP4); reading past the real end raises :class:`FramesMissing`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.formats.video.base import Size, VideoMeta, VideoReader, check_exists, resize_into, unreadable

# Grabbing forward beats seeking when the target is fewer frames ahead than OpenCV's seek decodes
# (16 frames back from the target, then back to a keyframe).
GRAB_AHEAD = 24


class OpenCVReader(VideoReader):
    """Reads frames through ``cv2.VideoCapture`` (FFmpeg backend); see the module docstring."""

    name = "opencv"

    def __init__(self, path: str, *, threads: int = 1, size: Size | None = None, meta: VideoMeta | None = None) -> None:
        super().__init__(path, threads=threads, size=size, meta=meta)
        import cv2

        check_exists(path)
        self._cap: Any = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, threads])
        if not self._cap.isOpened():
            self._cap.release()
            self._cap = None
            raise unreadable(path, "OpenCV", OSError("VideoCapture did not open"))
        self._pos = 0  # the frame the next grab() returns
        if meta is None:
            frames = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
            if frames <= 0:  # no count in the container: count by decoding (slow, but only at probe)
                frames = self._count_frames()
            height, width = int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT)), int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH))
            meta = VideoMeta(frames, float(self._cap.get(cv2.CAP_PROP_FPS)), height, width)
        self._meta = meta

    def _count_frames(self) -> int:
        n = 0
        while self._cap.grab():
            n += 1
        self._seek(0)
        return n

    @property
    def meta(self) -> VideoMeta:
        return self._meta

    def _seek(self, i: int) -> None:
        import cv2

        self._cap.set(cv2.CAP_PROP_POS_FRAMES, i)
        self._pos = i

    def _read(self, wanted: list[int]) -> np.ndarray:
        import cv2

        cap = self._cap
        first = wanted[0]
        if not self._pos <= first < self._pos + GRAB_AHEAD:
            self._seek(first)
        h, w = self.out_size
        out = np.empty((len(wanted), h, w, 3), np.uint8)
        resize = (h, w) != (self._meta.height, self._meta.width)
        k = 0
        while k < len(wanted):
            if not cap.grab():
                got = self._pos - 1 if self._pos > 0 else None
                self._pos = 1 << 62  # unknown position: the next read seeks
                raise self.missing(wanted[k:], got)
            i = self._pos
            self._pos += 1
            if i != wanted[k]:
                continue
            ok, bgr = cap.retrieve()
            if not ok:
                self._pos = 1 << 62
                raise self.missing(wanted[k:], i - 1)
            if resize:
                resize_into(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), out[k])
            else:
                cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB, dst=out[k])
            k += 1
        return out

    def close(self) -> None:
        cap, self._cap = getattr(self, "_cap", None), None
        if cap is not None:
            cap.release()
