"""The video backend of ``fastdata bench``: :class:`~fastdata.VideoClipDataset` over local videos.

SPEC: a folder of videos (searched recursively, as the dataset does), one video, or a glob or brace
pattern of them (``videos/*.mp4``, ``clips/v{000..099}.mkv``). Options (``-o KEY=VALUE``): the
dataset's, ``clip_len`` (default 16), ``frame_stride``, ``clips_per_video``, ``clip_step``,
``clip_sampling``, ``size`` (``[h, w]``), ``decoder`` ("pyav", "decord", "opencv", "torchcodec"),
``stagger`` (``[low, high]`` seconds), ``stagger_each_open``, ``max_open``, ``decode_threads``,
``decode_timeout``, ``on_error``, ``index_cache``, ``seed``, ``labels``, and for ``s3://`` videos
``storage_options``, ``cache_dir``, ``cache_limit``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from braceexpand import braceexpand

from fastdata.bench.backends import require
from fastdata.core.errors import ConfigError

require("av", extra="video")  # the default decoder's library, and the demo's encoder

NAME = "video"
PRIORITY = 30
EXTRA = "video"
DEMO_BATCH_SIZE = 8
# 8-frame clips, every second frame, at random places: the usual input of a video classifier
DEMO_OPTIONS: dict[str, Any] = {"clip_len": 8, "frame_stride": 2, "clips_per_video": 16}
DEMO_VIDEOS = 24
DEMO_FRAMES = 150  # 6 s at 25 fps
DEMO_SIZE = (128, 128)  # (height, width)
DEMO_GOP = 25  # a keyframe every second, as cameras and web encoders commonly write

# entries looked at in a folder (and in each of its first subfolders) before deciding it holds no videos
DETECT_ENTRIES = 1000

_OPTIONS = {
    "clip_len",
    "frame_stride",
    "clips_per_video",
    "clip_step",
    "clip_sampling",
    "size",
    "decoder",
    "stagger",
    "stagger_each_open",
    "max_open",
    "decode_threads",
    "decode_timeout",
    "on_error",
    "index_cache",
    "seed",
    "labels",
    "storage_options",
    "cache_dir",
    "cache_limit",
}


def _extensions() -> frozenset[str]:
    from fastdata.formats.video import VIDEO_EXTENSIONS

    return VIDEO_EXTENSIONS


def _holds_videos(folder: str) -> bool:
    """Whether a video file lies in ``folder`` or one of its subfolders (class folders); looks at a bounded
    number of entries, so that detecting a huge tree stays cheap."""
    exts = _extensions()
    subfolders = []
    with os.scandir(folder) as it:
        for entry in itertools.islice(it, DETECT_ENTRIES):
            if entry.is_file() and os.path.splitext(entry.name)[1].lower() in exts:
                return True
            if entry.is_dir():
                subfolders.append(entry.path)
    for sub in subfolders[:8]:
        with os.scandir(sub) as it:
            if any(
                e.is_file() and os.path.splitext(e.name)[1].lower() in exts
                for e in itertools.islice(it, DETECT_ENTRIES)
            ):
                return True
    return False


def detect(spec: str) -> bool:
    """A name with a video extension (``.mp4``, ``.mkv``, ``.avi`` ...; after brace expansion; also on
    ``s3://``, read through the node-local cache), or a local folder with video files in it or in its
    subfolders."""
    first = next(iter(braceexpand(spec)), spec)
    if os.path.splitext(first)[1].lower() in _extensions():
        return True
    return "://" not in spec and os.path.isdir(spec) and _holds_videos(spec)


def open(spec: str, **options: Any) -> Any:
    """A :class:`~fastdata.VideoClipDataset` over the videos of ``spec``."""
    import fastdata as fd

    unknown = set(options) - _OPTIONS
    if unknown:
        raise ConfigError(
            f"video backend: unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_OPTIONS))}"
        )
    for name in ("size", "stagger"):  # JSON lists from -o size=[224,224]
        if isinstance(options.get(name), list):
            options[name] = tuple(options[name])
    return fd.VideoClipDataset(spec, **options)


def demo_frames(video: int, n: int, size: tuple[int, int], rng: np.random.Generator) -> Iterator[np.ndarray]:
    """``n`` RGB frames of a textured scene panning sideways: real motion for the encoder's P-frames,
    made cheaply (one texture per video, shifted)."""
    h, w = size
    texture = rng.integers(0, 256, (h // 8, (2 * w) // 8, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    texture = texture // 2 + np.uint8(40 * (video % 4))
    for i in range(n):
        yield np.ascontiguousarray(np.roll(texture, 2 * i, axis=1)[:, :w])


def write_demo_videos(
    folder: Path,
    *,
    videos: int = DEMO_VIDEOS,
    frames: int = DEMO_FRAMES,
    size: tuple[int, int] = DEMO_SIZE,
    gop: int = DEMO_GOP,
    seed: int = 0,
) -> list[str]:
    """``videos`` H.264 videos (``folder/vNNN.mp4``, 25 fps, yuv420p) of ``frames`` frames each."""
    import av

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(videos):
        path = folder / f"v{k:03d}.mp4"
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=25)
            stream.width, stream.height, stream.pix_fmt = size[1], size[0], "yuv420p"
            stream.codec_context.options = {"g": str(gop), "bf": "2", "preset": "ultrafast", "crf": "23"}
            for frame in demo_frames(k, frames, size, rng):
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        paths.append(str(path))
    return paths


@contextlib.contextmanager
def demo(folder: Path, scale: float = 1.0) -> Iterator[tuple[str, dict[str, Any]]]:
    """24 H.264 videos of 150 frames (128x128, a keyframe a second), about 1 MB (``scale`` times as many
    videos); swept as 8-frame clips (every second frame), 16 at random places per video. The probe
    results go to an index file in ``folder``, so that no point of the sweep probes the videos again
    (and the user's cache is left alone)."""
    folder = Path(folder)
    write_demo_videos(folder / "videos", videos=max(2, round(DEMO_VIDEOS * scale)))
    yield str(folder / "videos"), {"index_cache": str(folder / "video-index.json")}
