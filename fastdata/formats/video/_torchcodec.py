"""The torchcodec reader (optional: ``pip install 'fastdata[torchcodec]'``).

On CPU machines only torchcodec 0.13.0 works (later wheels link CUDA libraries), and it loads the
system's FFmpeg libraries (Debian: ``apt-get install ffmpeg``). ``seek_mode="exact"`` scans the file's
packets when it opens, so frame numbers are exact and the frame count is the real one; its
``get_frames_at`` seeks only when the next frame lies in another keyframe group. It is told the stream
to read (FFmpeg's best, as every decoder reads; :mod:`fastdata.formats.video._stream`), and from 0.11 on
turns frames by the display matrix's angle (a mirror is added here). Not installed on the machine
where fastdata's decoder-agreement test runs: a frame count that differs from the stream's frame table
is refused rather than trusted.
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
    resize_into,
    unreadable,
)
from fastdata.formats.video._crosscheck import unsupported
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

    def _read(self, wanted: list[int]) -> np.ndarray:
        try:
            frames = self._dec.get_frames_at(wanted).data.numpy()
        except Exception as e:
            raise unsupported(
                self, self.info.codec, f"decode frames {wanted[0]}..{wanted[-1]} of", e, wanted
            ) or DecodeFailed(
                f"{self.path}: torchcodec cannot decode frames {wanted[0]}..{wanted[-1]} "
                f"({type(e).__name__}: {e}); the file is damaged: re-encode it, or pass "
                "on_error='skip'",
                self.path,
            ) from e
        frames = self.info.display.after_rotation(frames)
        if self.size is not None and frames.shape[1:3] != self.size:
            out = np.empty((len(wanted), *self.size, 3), np.uint8)
            for k in range(len(wanted)):
                resize_into(frames[k], out[k])
            return out
        return frames  # type: ignore[no-any-return]

    def close(self) -> None:
        # torchcodec has no close(); the last reference going away frees the decoder and the file
        self._dec = None
