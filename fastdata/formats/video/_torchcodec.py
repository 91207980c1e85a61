"""The torchcodec reader (optional: ``pip install 'fastdata[torchcodec]'``).

On CPU machines only torchcodec 0.13.0 works (later wheels link CUDA libraries), and it loads the
system's FFmpeg libraries (Debian: ``apt-get install ffmpeg``). ``seek_mode="exact"`` scans the file's
packets when it opens, so frame numbers are exact and the frame count is the real one; its
``get_frames_at`` seeks only when the next frame lies in another keyframe group. It is told the stream
to read (FFmpeg's best, as every decoder reads; :mod:`fastdata.formats.video`), and from 0.11 on
turns frames by the display matrix's angle (a mirror is added here). Not installed on the machine
where fastdata's decoder-agreement test was first written: a frame count that differs from the stream's
frame table is refused rather than trusted.

Every frame torchcodec returns is checked against the frame table by its timestamp (arithmetic on what
``get_frames_at`` returns anyway): on an MPEG-4 Part 2 AVI with B-frames (FFmpeg's ``mpeg4`` encoder
with ``-bf``, DivX/Xvid files) torchcodec 0.13 returns, after every seek, the frame before the one asked
for under its number (44 frames of 60 in a sequential check), with no error. Such a file is refused
(:class:`~fastdata.formats.video.VideoUnsupported`, naming ``decoder='pyav'``), at probe time:
the probe reads a frame after a seek as well as the first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.core.errors import DecodeFailed
from fastdata.formats.video._base import (
    Size,
    VideoMeta,
    VideoUnsupported,
    native,
    unreadable,
)
from fastdata.formats.video._crosscheck import checked_probe, unsupported
from fastdata.formats.video._stream import ProbedReader


class TorchCodecReader(ProbedReader):
    """Reads frames through ``torchcodec.decoders.VideoDecoder``."""

    name = "torchcodec"

    def __init__(self, path: str, *, threads: int = 1, size: Size | None = None, meta: VideoMeta | None = None) -> None:
        super().__init__(path, threads=threads, size=size, meta=meta)
        from torchcodec.decoders import VideoDecoder

        self._dec: Any = None
        info = self._probe(meta)
        try:
            self._dec = native(
                VideoDecoder(
                    path,
                    stream_index=info.index,
                    dimension_order="NHWC",
                    num_ffmpeg_threads=threads,
                    seek_mode="exact",
                )
            )
            frames = int(self._dec.metadata.num_frames or 0)
        except Exception as e:
            self._dec = None
            raise unsupported(self, info.codec, "open", e) or unreadable(path, "torchcodec", e) from e
        if frames != info.table.n:
            self._dec = None
            raise VideoUnsupported(
                f"{path}: torchcodec counts {frames} frames, video stream {info.index} holds {info.table.n}: "
                "use decoder='pyav'",
                path,
            )

    @classmethod
    def probe(cls, path: str, *, threads: int = 1) -> VideoMeta:
        """As :meth:`VideoReader.probe`, reading a frame after a seek too and holding both to PyAV's
        (``checked_probe``), so that a file whose frames
        torchcodec misnumbers is refused now, not mid-epoch."""
        return checked_probe(cls, path, threads)

    def _check_times(self, wanted: list[int], seconds: Any) -> None:
        """Refuse the file when a frame torchcodec returned is not the one asked for, by its timestamp."""
        info = self.info
        base = float(info.time_base)
        tolerance = 0.3 / info.fps if info.fps > 0 else 1e-3  # under a third of a frame
        got = np.asarray(seconds, dtype=np.float64)
        expected = np.array([info.table.pts(i) for i in wanted], dtype=np.float64) * base
        off = np.flatnonzero(np.abs(got - expected) > tolerance)
        if len(off):
            k = int(off[0])
            raise VideoUnsupported(
                f"{self.path}: torchcodec returns other frames than asked on this {info.codec} video (frame "
                f"{wanted[k]} comes with the time {got[k]:.3f} s, the stream's frame {wanted[k]} is at "
                f"{expected[k]:.3f} s: its frame numbers slip on this file, as on AVI files with B-frames and "
                "MPEG-TS files); "
                "use decoder='pyav'",
                self.path,
            )

    def _read(self, wanted: list[int]) -> np.ndarray:
        try:
            batch = self._dec.get_frames_at(wanted)
            frames = batch.data.numpy()
        except Exception as e:
            raise unsupported(
                self, self.info.codec, f"decode frames {wanted[0]}..{wanted[-1]} of", e, wanted
            ) or DecodeFailed(
                f"{self.path}: torchcodec cannot decode frames {wanted[0]}..{wanted[-1]} "
                f"({type(e).__name__}: {e}); the file is damaged: re-encode it, or pass "
                "on_error='skip'",
                self.path,
            ) from e
        self._check_times(wanted, batch.pts_seconds.numpy())
        return self.info.display.after_rotation(frames)  # type: ignore[no-any-return]

    def close(self) -> None:
        # torchcodec has no close(); the last reference going away frees the decoder and the file
        self._dec = None
