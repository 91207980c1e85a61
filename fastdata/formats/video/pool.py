"""Per-process video readers: opened on first use through the watchdog, kept in a bounded LRU.

The rules of :mod:`fastdata.worker` apply: nothing is opened before it is needed, nothing opened in
one process is used in another (readers inherited through ``fork`` are abandoned, never used or
closed: decord hangs in both cases), pickling drops every reader, and at most ``max_open`` readers
(so file descriptors) are open per process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from fastdata.errors import BadSample
from fastdata.formats.video import reader_class
from fastdata.formats.video.base import DecodeTimeout, Size, VideoMeta, VideoReader
from fastdata.formats.video.watchdog import Watchdog
from fastdata.worker import HandleCache, ProcessLocal

_STUCK_ATTR = "_fastdata_stuck"
# Readers given up on by the watchdog: another thread may still be inside them, so they are kept
# referenced (never closed or destroyed) for the life of the process.
_stuck_readers: list[VideoReader] = []


def _close_reader(reader: VideoReader) -> None:
    if getattr(reader, _STUCK_ATTR, False):
        _stuck_readers.append(reader)
    else:
        reader.close()


def _get_frames(reader: VideoReader, frames: Sequence[int], pause: bool) -> np.ndarray:
    try:
        return reader.get_frames(frames)
    finally:
        if pause:
            reader.pause()


def _close_watchdog(watchdog: Watchdog) -> None:
    watchdog.close()


class ReaderPool:
    """Open readers of one dataset's videos, per process.

    Args:
        decoder (str | type[VideoReader]): decoder name or class.
        threads (int): decoder threads per reader.
        size ((height, width) | None): resize frames to this size.
        max_open (int | None): readers open at once per process.
        timeout (float | None): watchdog limit per open or read, seconds; None: no watchdog.
        metas (dict[str, VideoMeta]): what the probe found per path, handed to the readers.
        before_open (Callable[[], object] | None): called before each reader is opened (stagger).
    """

    def __init__(self, decoder: str | type[VideoReader], *, threads: int, size: Size | None,
                 max_open: int | None, timeout: float | None, metas: dict[str, VideoMeta] | None = None,
                 before_open: Callable[[], object] | None = None) -> None:
        self.decoder = decoder
        self.threads, self.size, self.timeout = threads, size, timeout
        self.metas = metas or {}
        self.before_open = before_open
        self._readers: HandleCache[str, VideoReader] = HandleCache(
            self._open, _close_reader, max_open=max_open, close_inherited=False)
        self._watchdog: ProcessLocal[Watchdog] = ProcessLocal(
            functools.partial(Watchdog, timeout), _close_watchdog, close_inherited=False)

    @property
    def watchdog(self) -> Watchdog:
        return self._watchdog.get()

    @property
    def open_count(self) -> int:
        """Readers open now in this process."""
        return len(self._readers)

    def _open(self, path: str) -> VideoReader:
        cls = reader_class(self.decoder)
        if self.before_open is not None:
            self.before_open()
        return self.watchdog.call(cls, path, threads=self.threads, size=self.size, meta=self.metas.get(path),
                                  what="opening the video", source=path)

    def probe(self, path: str) -> VideoMeta:
        """The file's :class:`VideoMeta`, found by opening it under the watchdog (then closing it)."""
        cls = reader_class(self.decoder)
        return self.watchdog.call(cls.probe, path, threads=self.threads, what="probing the video", source=path)

    def read(self, path: str, frames: Sequence[int], *, pause: bool = True) -> np.ndarray:
        """Frames ``frames`` of ``path`` as ``uint8 [T, H, W, 3]``.

        Args:
            pause (bool): no read of this file follows right away (let the reader stop background
                work); False when the caller reads on from where this read ends. Defaults to True.

        Raises:
            SourceNotFound, VideoUnreadable, FramesMissing, DecodeFailed, DecodeTimeout: bad input,
                for the dataset's error policy.
        """
        reader = self._readers.get(path)
        try:
            return self.watchdog.call(_get_frames, reader, frames, pause, source=path,
                                      what=f"decoding frames {min(frames)}..{max(frames)}")
        except DecodeTimeout:
            setattr(reader, _STUCK_ATTR, True)  # another thread is still inside it
            self._readers.discard(path)
            raise
        except BadSample:
            self._readers.discard(path)  # reopen fresh next time: decoder state after an error is unknown
            raise

    def close(self) -> None:
        """Close this process's readers and stop its watchdog thread. Idempotent."""
        self._readers.close()
        self._watchdog.close()
