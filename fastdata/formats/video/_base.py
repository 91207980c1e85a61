"""The decoder interface every video backend implements, and the errors it raises.

A :class:`VideoReader` opens one file, knows its frame count, frame rate and size, and returns any set
of frames as one ``uint8`` array ``[T, H, W, 3]`` (RGB) in the order asked. Backends implement
``_read`` for sorted, distinct frame numbers at the size displayed; the base class validates,
deduplicates, reorders, and resizes (:func:`resize_into`, the one resize for every decoder: each
decoder's own scaler gave other pixels, up to 142 levels apart at 112x112).

No decoder object made in one process is ever finalised in a process forked from it: decord's
destructor deadlocks in a forked child (its decoder thread does not exist there), and the garbage
collector may run it there for a reader the parent no longer holds: one that failed half-way through
its constructor (the exception's traceback holds it), one in a reference cycle, one kept by user code.
So every reader, and every native decoder object inside one, is registered with :func:`native` when
it is made (a weak set: the parent frees them as usual); just before a fork the set is copied into a
strong list, so that nothing in it can be finalised during the fork, and the child keeps that list
for its whole life (:func:`fastdata.core.process.abandon`), while the parent drops it right after.
"""

from __future__ import annotations

import errno
import os
import resource
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from fastdata.core import process
from fastdata.core.errors import BadSample, DecodeFailed, FastdataError, SourceNotFound, SourceUnreadable

T = TypeVar("T")

Size = tuple[int, int]


class VideoUnreadable(DecodeFailed):
    """The file exists but is not a video any decoder can open (zero bytes, truncated, not a video)."""


class VideoUnsupported(VideoUnreadable):
    """A sound video that the chosen decoder cannot read exactly: a codec its build lacks, a stream it
    cannot choose, frames it numbers wrongly after a seek. The message names the decoder that can."""


class DecoderUnavailable(FastdataError, ImportError):
    """The decoder's library is missing, or is installed but cannot load here (torchcodec wheels that
    link CUDA libraries on a CPU-only machine). The message names the install and the decoder to use."""


class DecoderFallbackWarning(UserWarning):
    """Some videos are read by the fallback decoder, because the chosen one cannot read them exactly."""


class FramesMissing(DecodeFailed):
    """Frames that the container announces could not be decoded (damaged or over-reported length)."""


class VideoTooShort(BadSample):
    """The video has fewer frames than one clip spans."""


class DecodeTimeout(DecodeFailed, TimeoutError):
    """Opening or decoding took longer than the watchdog allows; the reader was abandoned."""


@dataclass(frozen=True)
class VideoMeta:
    """What the clip index needs to know about one video, as one decoder sees it.

    Attributes:
        frames (int): frames the decoder can address, ``0 .. frames - 1``.
        fps (float): average frame rate, frames per second.
        height, width (int): frame size in pixels as displayed (the display matrix applied; before
            any resize).
        extra (dict): decoder-specific facts worth caching (JSON types only), given back to the
            decoder when it opens the file again so that it need not rediscover them.
    """

    frames: int
    fps: float
    height: int
    width: int
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"frames": self.frames, "fps": self.fps, "height": self.height, "width": self.width, "extra": self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VideoMeta:
        return cls(
            int(data["frames"]),
            float(data["fps"]),
            int(data["height"]),
            int(data["width"]),
            dict(data.get("extra") or {}),
        )


def check_exists(path: str) -> None:
    """Raise :class:`SourceNotFound` / :class:`SourceUnreadable` / :class:`VideoUnreadable` early, with
    a message naming the file, instead of the decoder's own (often cryptic) error."""
    if path.startswith("subfile,"):  # FFmpeg's byte range of a file (a video inside a tar shard)
        path = path.rpartition(",:")[2]
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise SourceNotFound(f"{path}: no such video file; check the path") from None
    except PermissionError:
        raise SourceUnreadable(f"{path}: permission denied") from None
    if size == 0 and os.path.isfile(path):
        raise VideoUnreadable(f"{path}: the file is empty (0 bytes); re-copy or re-encode it", path)


_natives: weakref.WeakSet[Any] = weakref.WeakSet()
_held_over_fork: list[Any] = []


def native(obj: T) -> T:
    """Register ``obj`` (a reader, or a library's decoder object) so that no process forked after now
    ever finalises it (see the module docstring); returns ``obj``. Objects that take no weak reference
    (PyAV containers, ``cv2.VideoCapture``) are covered by registering the reader that holds them."""
    try:
        _natives.add(obj)
    except TypeError:
        pass
    return obj


def _hold_natives() -> None:
    _held_over_fork[:] = list(_natives)


def _release_natives() -> None:
    _held_over_fork.clear()


def _abandon_inherited_natives() -> None:
    for obj in _held_over_fork:
        process.abandon(obj)
    _held_over_fork.clear()


process.at_fork(before=_hold_natives, after_in_parent=_release_natives, after_in_child=_abandon_inherited_natives)


class TooManyOpenFiles(FastdataError, OSError):
    """The process ran out of file descriptors: a setting to fix, not bad input (never skipped)."""


def unreadable(path: str, backend: str, error: BaseException) -> VideoUnreadable | TooManyOpenFiles:
    """The error for a file that ``backend`` cannot open: :class:`TooManyOpenFiles` when the process is
    out of file descriptors (decord and OpenCV do not say so themselves), else :class:`VideoUnreadable`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # non-blocking: a FIFO must not block here
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            return TooManyOpenFiles(
                f"{path}: cannot open: too many open files in this process (ulimit -n is {soft}); lower "
                "max_open (readers kept open per worker) or num_workers, or raise the limit (ulimit -n)"
            )
    else:
        os.close(fd)
    return VideoUnreadable(
        f"{path}: {backend} cannot open it as a video ({type(error).__name__}: {error}); the file is "
        "truncated, damaged or not a video: check it with ffprobe, or pass on_error='skip'",
        path,
    )


class VideoReader(ABC):
    """One open video file.

    Args:
        path (str): the video file.
        threads (int): decoder threads (FFmpeg ``thread_count``). Defaults to 1: with one reader per
            DataLoader worker, more threads per reader only oversubscribe the cores.
        size ((height, width) | None): resize every frame to this size. Defaults to None (as stored).
        meta (VideoMeta | None): what an earlier probe of this file found (skips rediscovery).

    Raises:
        SourceNotFound: no such file.
        VideoUnreadable: the file cannot be opened as a video.
    """

    name: ClassVar[str] = "?"

    def __init__(self, path: str, *, threads: int = 1, size: Size | None = None, meta: VideoMeta | None = None) -> None:
        native(self)  # first of all: a constructor that fails later leaves a half-built reader behind
        self.path = path
        self.threads = threads
        self.size = size
        check_exists(path)
        self._meta: VideoMeta

    @property
    def meta(self) -> VideoMeta:
        """Frame count, frame rate and size of the video."""
        return self._meta

    @property
    def frame_count(self) -> int:
        return self.meta.frames

    @property
    def fps(self) -> float:
        return self.meta.fps

    @property
    def out_size(self) -> Size:
        """``(height, width)`` of the frames :meth:`get_frames` returns."""
        return self.size or self.shown_size

    @property
    def shown_size(self) -> Size:
        """``(height, width)`` of the frames as displayed, before any resize: what ``_read`` returns."""
        return (self.meta.height, self.meta.width)

    def get_frames(self, indices: Sequence[int]) -> np.ndarray:
        """Frames ``indices`` (any order, repeats allowed) as ``uint8 [T, H, W, 3]`` RGB.

        Raises:
            IndexError: a frame number outside ``[0, frame_count)``.
            FramesMissing: frames the container announced could not be decoded.
            DecodeFailed: the decoder rejected the data.
        """
        n = self.frame_count
        wanted = sorted(set(int(i) for i in indices))
        if not wanted:
            h, w = self.out_size
            return np.empty((0, h, w, 3), np.uint8)
        if wanted[0] < 0 or wanted[-1] >= n:
            raise IndexError(f"{self.path}: frames {wanted[0]}..{wanted[-1]} requested, the video has {n}")
        frames = self._read(wanted)
        if self.size is not None and frames.shape[1:3] != self.size:
            frames = resize(frames, self.size)
        if len(wanted) == len(indices) and all(a == b for a, b in zip(wanted, indices)):
            return frames
        where = {f: k for k, f in enumerate(wanted)}
        return frames[[where[int(i)] for i in indices]]

    @abstractmethod
    def _read(self, wanted: list[int]) -> np.ndarray:
        """Frames ``wanted`` (sorted, distinct, in range) as ``uint8 [len(wanted), H, W, 3]``, at
        :attr:`shown_size` (the base class resizes)."""

    def pause(self) -> None:
        """The caller will not read from this reader for a while: stop any work the decoder does in
        the background (decord decodes ahead in a thread until its next seek). Defaults to nothing."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the file and the decoder. Idempotent."""

    @classmethod
    def probe(cls, path: str, *, threads: int = 1) -> VideoMeta:
        """Open ``path``, decode its first frame (so that a file that opens but does not decode is
        caught now), and return its :class:`VideoMeta`."""
        with cls(path, threads=threads) as reader:
            reader.get_frames([0])
            return reader.meta

    def missing(self, wanted: Sequence[int], got: int | None, detail: str = "") -> FramesMissing:
        """The error for frames ``wanted`` that did not come out of the decoder (``got``: the last
        frame number it produced, None if none)."""
        seen = "no frame" if got is None else f"frames up to {got}"
        return FramesMissing(
            f"{self.path}: frames {list(wanted)} could not be decoded ({self.name} produced {seen}; the "
            f"container announces {self.frame_count}){detail}; the file is damaged or its frame count is "
            "over-reported: re-encode it, or pass on_error='skip'",
            self.path,
        )

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


def resize(frames: np.ndarray, size: Size) -> np.ndarray:
    """Frames ``[T, H, W, 3]`` resized to ``size`` (height, width) by :func:`resize_into`."""
    out = np.empty((len(frames), *size, 3), np.uint8)
    for k in range(len(frames)):
        resize_into(frames[k], out[k])
    return out


def resize_into(frame: np.ndarray, out: np.ndarray) -> None:
    """Resize an ``[H, W, 3]`` RGB frame into ``out`` (area averaging when shrinking, bilinear otherwise).

    The one resize of every decoder's frames (``size=``), after decode, so that the same clip comes out
    of every decoder: the decoders' own scalers (FFmpeg's swscale in PyAV and decord, with other filters
    and from YUV) differed from this by up to 142 levels of 255. OpenCV's is used: it comes with every
    decoder in the ``video`` extra."""
    import cv2

    h, w = out.shape[:2]
    shrink = h < frame.shape[0] or w < frame.shape[1]
    cv2.resize(frame, (w, h), dst=out, interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
