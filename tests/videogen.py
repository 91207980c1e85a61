"""Small, seeded test videos whose pixels say which video and which frame they are.

Each frame carries two rows of 8-pixel-wide black/white stripes: the frame number (top row) and the
video number (second row), in binary, most significant bit first; the rest of the frame is a seeded
texture that moves, so that P-frames carry real motion. Stripes survive any codec's compression, so
:func:`read_stamp` recovers both numbers from a decoded RGB frame.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

BITS = 10  # frame numbers up to 1023
STRIPE = 8
ROW = 16
WIDTH, HEIGHT = 96, 64  # even sizes (yuv420), stripes fit in BITS * STRIPE = 80 pixels


def _stamp(frame: np.ndarray, row: int, value: int) -> None:
    for b in range(BITS):
        bit = (value >> (BITS - 1 - b)) & 1
        frame[row * ROW : (row + 1) * ROW, b * STRIPE : (b + 1) * STRIPE] = 255 * bit


def frames_for(video: int, n: int, *, seed: int = 0, size: tuple[int, int] = (WIDTH, HEIGHT)) -> np.ndarray:
    """``n`` RGB frames ``[n, H, W, 3]`` for video number ``video``."""
    w, h = size
    rng = np.random.default_rng([seed, video])
    texture = rng.integers(0, 256, (h, 2 * w, 3), dtype=np.uint8)
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        frame = out[i]
        frame[:] = np.roll(texture, 3 * i, axis=1)[:, :w]
        _stamp(frame, 0, i)
        _stamp(frame, 1, video)
    return out


def read_stamp(frame: np.ndarray) -> tuple[int, int]:
    """``(video number, frame number)`` read back from a decoded RGB frame ``[H, W, 3]``."""

    def row(r: int) -> int:
        value = 0
        for b in range(BITS):
            cell = frame[r * ROW + 4 : (r + 1) * ROW - 4, b * STRIPE + 2 : (b + 1) * STRIPE - 2]
            value = value << 1 | int(cell.mean() > 127)
        return value

    return row(1), row(0)


def write_opencv(path: str | os.PathLike[str], frames: np.ndarray, *, fourcc: str = "mp4v", fps: float = 25.0) -> str:
    """Write RGB frames with OpenCV (``mp4v`` in .mp4, ``MJPG``/``XVID`` in .avi)."""
    import cv2

    h, w = frames.shape[1:3]
    writer = cv2.VideoWriter(os.fspath(path), cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {fourcc} to {path}")
    for frame in frames:
        writer.write(np.ascontiguousarray(frame[:, :, ::-1]))
    writer.release()
    return os.fspath(path)


def write_h264(
    path: str | os.PathLike[str],
    frames: np.ndarray,
    *,
    fps: int = 25,
    gop: int = 10,
    bframes: int = 2,
    faststart: bool = False,
) -> str:
    """Write RGB frames as H.264 with B-frames through PyAV (OpenCV's wheel cannot write H.264)."""
    import av

    h, w = frames.shape[1:3]
    options = {"movflags": "+faststart"} if faststart else {}
    with av.open(os.fspath(path), "w", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.options = {"g": str(gop), "bf": str(bframes), "preset": "ultrafast", "crf": "18"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return os.fspath(path)


CODECS = {
    "mp4v": lambda path, frames: write_opencv(f"{path}.mp4", frames, fourcc="mp4v"),
    "mjpg": lambda path, frames: write_opencv(f"{path}.avi", frames, fourcc="MJPG"),
    "h264": lambda path, frames: write_h264(f"{path}.mp4", frames),
}


def make_videos(
    folder: str | os.PathLike[str],
    *,
    count: int = 4,
    frames: int | list[int] = 40,
    codec: str = "mp4v",
    seed: int = 0,
    prefix: str = "v",
) -> list[str]:
    """``count`` videos ``folder/vNNN.<ext>``, video ``k`` stamped with number ``k``."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    lengths = frames if isinstance(frames, list) else [frames] * count
    return [
        CODECS[codec](Path(folder) / f"{prefix}{k:03d}", frames_for(k, n, seed=seed)) for k, n in enumerate(lengths)
    ]


def damage(path: str | os.PathLike[str], out: str | os.PathLike[str], *, start: float = 0.4, stop: float = 0.6) -> str:
    """Copy an MP4 to ``out`` with the bytes from ``start`` to ``stop`` (fractions) of its frame data
    (the ``mdat`` box) zeroed: the index is intact, so decoders open it; the frames there do not decode."""
    data = bytearray(Path(path).read_bytes())
    mdat = data.index(b"mdat") + 4
    end = len(data) if data.rfind(b"moov") < mdat else data.rindex(b"moov") - 4
    lo, hi = mdat + int((end - mdat) * start), mdat + int((end - mdat) * stop)
    data[lo:hi] = bytes(hi - lo)
    Path(out).write_bytes(bytes(data))
    return os.fspath(out)
