"""The OpenCV reader: a kept-open ``cv2.VideoCapture`` that seeks only when it must, and checks every
frame's number against the stream's frame table.

``VideoCapture.set(CAP_PROP_POS_FRAMES, i)`` is costly: OpenCV seeks to the keyframe before ``i - 16``
and decodes forward from there. So a read that starts a little ahead of where the capture stands grabs
forward instead, and only the frames asked for are converted (``grab`` decodes, ``retrieve`` converts).

OpenCV's own frame numbers cannot be trusted: after a seek it derives them from the timestamp and the
average frame rate, which on a variable-frame-rate file lands a frame early (or late). So each frame
grabbed is identified by its timestamp (``CAP_PROP_POS_MSEC``, relative to the stream's start) in the
frame table (:mod:`fastdata.formats.video`); a seek that landed after the first frame wanted is
retried from further back, and a frame the decoder skipped is :class:`FramesMissing`, never replaced
by its neighbour. OpenCV reads the first video stream of a file and turns frames by the display
matrix's angle; a file whose best stream is another one is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.formats.video._base import (
    FramesMissing,
    Size,
    VideoMeta,
    VideoUnsupported,
    native,
    unreadable,
)
from fastdata.formats.video._crosscheck import checked_probe, unsupported
from fastdata.formats.video._stream import ProbedReader

# Grabbing forward beats seeking when the target is fewer frames ahead than OpenCV's seek decodes
# (16 frames back from the target, then back to a keyframe).
GRAB_AHEAD = 24
# Seeks retried from further back when OpenCV lands after the first frame wanted; the last one seeks
# to the start of the file, from where every frame is reached by decoding forward.
SEEK_RETRIES = 3


class OpenCVReader(ProbedReader):
    """Reads frames through ``cv2.VideoCapture`` (FFmpeg backend); see the module docstring."""

    name = "opencv"

    def __init__(self, path: str, *, threads: int = 1, size: Size | None = None, meta: VideoMeta | None = None) -> None:
        super().__init__(path, threads=threads, size=size, meta=meta)
        import cv2

        self._cap: Any = None
        info = self._probe(meta)
        if not info.first:
            raise VideoUnsupported(
                f"{path}: holds {info.streams} video streams; OpenCV reads only the first, fastdata reads "
                f"stream {info.index} (FFmpeg's choice, which the other decoders read): use decoder='pyav'",
                path,
            )
        self._cap = native(cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, threads]))
        if not self._cap.isOpened():
            self.close()
            error = OSError("VideoCapture did not open")
            raise unsupported(self, info.codec, "open", error) or unreadable(path, "OpenCV", error)
        table = info.table
        self._pos_msec = cv2.CAP_PROP_POS_MSEC
        # CAP_PROP_POS_MSEC is (pts - stream start) * time base, in ms: back to the table's units
        self._ms_to_pts = 1 / (1000 * float(info.time_base))
        self._tolerance = self._ms_to_pts  # within 1 ms: frames are at least ~4 ms apart
        self._table = table
        self._pos = 0  # the frame the next grab() returns (as far as we know)

    def _seek(self, i: int) -> None:
        import cv2

        self._cap.set(cv2.CAP_PROP_POS_FRAMES, i)
        self._pos = i  # OpenCV's idea; the next grab() says where it really is

    def _grabbed(self) -> int | None:
        """The frame number of the frame just grabbed, from its timestamp (None: no such frame)."""
        ms = self._cap.get(self._pos_msec)
        return self._table.nearest(self.info.start + ms * self._ms_to_pts, self._tolerance)

    def _read(self, wanted: list[int]) -> np.ndarray:
        import cv2

        cap = self._cap
        first = wanted[0]
        if not self._pos <= first < self._pos + GRAB_AHEAD:
            self._seek(first)
        h, w = self.shown_size  # OpenCV turns frames by the matrix's angle itself; the base class resizes
        out = np.empty((len(wanted), h, w, 3), np.uint8)
        retries = 0
        k = 0
        while k < len(wanted):
            if not cap.grab():
                self._pos = 1 << 62  # unknown position: the next read seeks
                raise self._failed(wanted[k:], "grab() found no frame")
            i = self._grabbed()
            if i is None:
                self._pos = 1 << 62
                raise self._failed(wanted[k:], "a frame at a time the stream has no frame at")
            self._pos = i + 1
            if i < wanted[k]:
                continue
            if i > wanted[k]:
                if k > 0 or retries == SEEK_RETRIES:  # the decoder skipped a frame wanted
                    self._pos = 1 << 62
                    # OpenCV's own limit where PyAV decodes the frames (an MPEG-TS file, whose first
                    # frames no OpenCV seek reaches), else damage
                    why = f"it skipped frame {wanted[k]}, landing at frame {i}"
                    what = f"decode frames {wanted[k]}..{wanted[-1]} of"
                    raise unsupported(self, self.info.codec, what, why, wanted[k:]) or self.missing(
                        wanted[k:], i, f" (frame {wanted[k]} was skipped)"
                    )
                # the seek landed after the frame wanted: seek from further back
                retries += 1
                back = 0 if retries == SEEK_RETRIES else max(0, first - (i - first) - GRAB_AHEAD * retries)
                self._seek(back)
                continue
            ok, bgr = cap.retrieve()
            if not ok:
                self._pos = 1 << 62
                raise self._failed(wanted[k:], "retrieve() failed")
            cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB, dst=out[k])
            k += 1
        return self.info.display.after_rotation(out)

    def _failed(self, frames: list[int], error: str) -> FramesMissing | VideoUnsupported:
        what = f"decode frames {frames[0]}..{frames[-1]} of"
        return unsupported(self, self.info.codec, what, error, frames) or self.missing(frames, None, f" ({error})")

    @classmethod
    def probe(cls, path: str, *, threads: int = 1) -> VideoMeta:
        """As :meth:`VideoReader.probe`, reading a frame after a seek too and holding both to PyAV's
        (``checked_probe``)."""
        return checked_probe(cls, path, threads)

    def close(self) -> None:
        cap, self._cap = getattr(self, "_cap", None), None
        if cap is not None:
            cap.release()
