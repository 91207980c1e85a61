"""The torchcodec reader (optional: ``pip install 'fastdata[torchcodec]'``).

On CPU machines only torchcodec 0.13.0 works (later wheels link CUDA libraries), and it loads the
system's FFmpeg libraries (Debian: ``apt-get install ffmpeg``). ``seek_mode="exact"`` scans the file's
packets when it opens, so frame numbers are exact and the frame count is the real one; its
``get_frames_at`` seeks only when the next frame lies in another keyframe group.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.core.errors import DecodeFailed
from fastdata.formats.video.base import Size, VideoMeta, VideoReader, check_exists, resize_into, unreadable


class TorchCodecReader(VideoReader):
    """Reads frames through ``torchcodec.decoders.VideoDecoder``."""

    name = "torchcodec"

    def __init__(self, path: str, *, threads: int = 1, size: Size | None = None, meta: VideoMeta | None = None) -> None:
        super().__init__(path, threads=threads, size=size, meta=meta)
        from torchcodec.decoders import VideoDecoder

        check_exists(path)
        try:
            self._dec: Any = VideoDecoder(path, dimension_order="NHWC", num_ffmpeg_threads=threads, seek_mode="exact")
            info = self._dec.metadata
            frames = int(info.num_frames or 0)
            if frames < 1:
                raise ValueError("no video frames")
        except Exception as e:
            self._dec = None
            raise unreadable(path, "torchcodec", e) from e
        self._meta = meta or VideoMeta(
            frames, float(info.average_fps or 0.0), int(info.height or 0), int(info.width or 0)
        )

    @property
    def meta(self) -> VideoMeta:
        return self._meta

    def _read(self, wanted: list[int]) -> np.ndarray:
        try:
            frames = self._dec.get_frames_at(wanted).data.numpy()
        except Exception as e:
            raise DecodeFailed(
                f"{self.path}: torchcodec cannot decode frames {wanted[0]}..{wanted[-1]} "
                f"({type(e).__name__}: {e}); the file is damaged: re-encode it, or pass "
                "on_error='skip'",
                self.path,
            ) from e
        if self.size is not None and frames.shape[1:3] != self.size:
            out = np.empty((len(wanted), *self.size, 3), np.uint8)
            for k in range(len(wanted)):
                resize_into(frames[k], out[k])
            return out
        return frames  # type: ignore[no-any-return]

    def close(self) -> None:
        # torchcodec has no close(); the last reference going away frees the decoder and the file
        self._dec = None
