"""Small, seeded test videos whose pixels say which video and which frame they are.

Each frame carries two rows of 8-pixel-wide black/white stripes: the frame number (top row) and the
video number (second row), in binary, most significant bit first; the rest of the frame is a seeded
texture that moves, so that P-frames carry real motion. Stripes survive any codec's compression, so
:func:`read_stamp` recovers both numbers from a decoded RGB frame.
"""

from __future__ import annotations

import os
from fractions import Fraction
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
    return write_pyav(path, [frames], fps=fps, gop=gop, bframes=bframes, faststart=faststart)


def write_pyav(
    path: str | os.PathLike[str],
    streams: list[np.ndarray],
    *,
    codec: str = "libx264",
    fps: int = 25,
    gop: int = 10,
    bframes: int = 2,
    faststart: bool = False,
    pts_ms: list[int] | None = None,
    rotation: int = 0,
    hflip: bool = False,
    default: list[bool] | None = None,
) -> str:
    """Write one video stream per array of RGB frames through PyAV (FFmpeg's encoders).

    Args:
        codec (str): ``"libx264"``, ``"libx265"`` (open GOPs, x265's default), ``"libsvtav1"`` ...
        gop, bframes (int): keyframe interval and B-frames between references.
        faststart (bool): put the MP4 index (``moov``) in front of the frames.
        pts_ms (list[int] | None): each frame's timestamp in ms (variable frame rate), first stream.
        rotation, hflip: the display matrix of the first stream (counter-clockwise degrees, mirror).
        default (list[bool] | None): each stream's "default" disposition. Defaults to the muxer's.
    """
    import av

    options = {"movflags": "+faststart"} if faststart else {}
    with av.open(os.fspath(path), "w", options=options) as container:
        out = []
        for k, frames in enumerate(streams):
            stream = container.add_stream(codec, rate=fps)
            stream.height, stream.width = frames.shape[1:3]
            stream.pix_fmt = "yuv420p"
            stream.codec_context.options = _encoder_options(codec, gop, bframes)
            if pts_ms is not None and k == 0:
                stream.codec_context.time_base = stream.time_base = Fraction(1, 1000)
            if (rotation or hflip) and k == 0:
                stream.set_display_rotation(rotation, hflip=hflip)
            if default is not None:
                stream.disposition = av.stream.Disposition.default if default[k] else av.stream.Disposition(0)
            out.append(stream)
        for i in range(max(len(frames) for frames in streams)):  # interleaved, as a camera writes
            for k, (stream, frames) in enumerate(zip(out, streams)):
                if i < len(frames):
                    frame = av.VideoFrame.from_ndarray(frames[i], format="rgb24")
                    if pts_ms is not None and k == 0:
                        frame.pts, frame.time_base = pts_ms[i], Fraction(1, 1000)
                    container.mux(stream.encode(frame))
        for stream in out:
            container.mux(stream.encode())
    return os.fspath(path)


def _encoder_options(codec: str, gop: int, bframes: int) -> dict[str, str]:
    if codec == "libx264":
        return {"g": str(gop), "bf": str(bframes), "preset": "ultrafast", "crf": "18"}
    if codec == "libx265":
        params = f"keyint={gop}:min-keyint={gop}:bframes={bframes}:log-level=error"
        return {"preset": "ultrafast", "crf": "18", "x265-params": params}
    if codec == "libsvtav1":
        return {"g": str(gop), "preset": "12", "crf": "30", "svtav1-params": "lp=1"}
    return {"g": str(gop)}


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


def write_scene_cuts(path: str | os.PathLike[str], n: int = 60, *, cuts: tuple[int, ...] = (20, 40)) -> str:
    """H.264 from x264 with scene-cut detection on (as its presets other than ultrafast have it) and no
    B-frames: the texture (not the stamps, video 0) changes at each frame of ``cuts``, where x264 puts an
    I-frame that is not always an IDR frame (decord's keyframe list leaves such frames out)."""
    import av

    scenes = [frames_for(0, n), frames_for(0, n, seed=5)]
    frames = scenes[0].copy()
    for k, start in enumerate(cuts):
        stop = cuts[k + 1] if k + 1 < len(cuts) else n
        frames[start:stop] = scenes[(k + 1) % 2][start:stop]
    with av.open(os.fspath(path), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        params = f"keyint={4 * n}:min-keyint={n}:scenecut=40:bframes=0"  # cuts closer than min-keyint: not IDR
        stream.codec_context.options = {"preset": "veryfast", "crf": "18", "x264-params": params}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return os.fspath(path)
