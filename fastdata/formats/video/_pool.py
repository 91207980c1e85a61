"""Per-process video readers: opened on first use through the watchdog, kept in a bounded LRU.

The rules of :mod:`fastdata.core.process` apply: nothing is opened before it is needed, nothing opened in
one process is used in another, pickling drops every reader, and at most ``max_open`` readers (so
file descriptors) are open per process. Forks get three guards:

* just before any fork, each pool closes its idle readers, in the parent, where that is safe: a
  forked worker then inherits no reader, no descriptor of a video file, and no decoder state (a user
  who looked at ``ds[0]`` before starting the DataLoader leaves nothing behind);
* a reader that was busy at that moment (read from another thread) is inherited, and the child
  abandons it: never uses it, never closes it (decord hangs in a forked child that does either);
* a reader held by anything else (one that failed, whose exception's traceback holds it; one in a
  reference cycle) is never finalised in the child either (``native``).

A file the chosen decoder cannot read exactly (:class:`~fastdata.formats.video.VideoUnsupported`: decord
on open-GOP HEVC, OpenCV on a second video stream...) is read by the ``fallback`` decoder instead of being
dropped: found when the file is probed (the meta then says which decoder reads it, ``extra["decoder"]``,
and the video index keeps that); a read refused that way later (frames the chosen decoder cannot decode
where PyAV can, as on a damaged file) is read again by the fallback, that clip alone.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastdata.core import process, stages
from fastdata.core.errors import BadSample
from fastdata.core.process import HandleCache
from fastdata.formats.video import reader_class
from fastdata.formats.video._base import DecodeTimeout, Size, VideoMeta, VideoReader, VideoUnsupported
from fastdata.formats.video._watchdog import Watchdog

_STUCK_ATTR = "_fastdata_stuck"
# Readers given up on by the watchdog: another thread may still be inside them, so they are kept
# referenced (never closed or destroyed) for the life of the process.
_stuck_readers: list[VideoReader] = []


_RELEASE_ATTR = "_fastdata_release"  # what frees the local copy a reader of a remote video reads

Locate = Callable[[str], tuple[str, Callable[[], None] | None]]
"""What a decoder opens for a video that is not a local file: ``locate(url)`` gives that path (a remote
video's local copy, a byte range of a shard) and the function that lets it go (None: nothing to let go)."""


def _close_reader(reader: VideoReader) -> None:
    if getattr(reader, _STUCK_ATTR, False):
        _stuck_readers.append(reader)  # its local copy stays held too: another thread may read it
        return
    try:
        reader.close()
    finally:
        release = getattr(reader, _RELEASE_ATTR, None)
        if release is not None:
            release()


def _renamed(error: BaseException, local: str, source: str) -> BaseException:
    """``error`` naming ``source`` (the video's URL) where it names ``local`` (the cached copy the decoder
    opened), so that a message names the video the user gave."""
    if local == source or local not in str(error):
        return error
    try:
        renamed = type(error)(str(error).replace(local, source), source)  # fastdata's errors: (message, source)
    except Exception:  # noqa: BLE001 - another signature: the message as it is
        return error
    renamed.__cause__ = error.__cause__ or error
    return renamed


def _get_frames(reader: VideoReader, frames: Sequence[int], pause: bool) -> np.ndarray:
    try:
        return reader.get_frames(frames)
    finally:
        if pause:
            reader.pause()


def _read_once(
    cls: type[VideoReader], path: str, frames: Sequence[int], meta: VideoMeta | None, size: Size | None
) -> np.ndarray:
    with cls(path, meta=meta, size=size) as reader:
        return reader.get_frames(frames)


_pools: weakref.WeakSet[ReaderPool] = weakref.WeakSet()


def _before_fork() -> None:
    for pool in list(_pools):
        pool.close_idle()


def _after_fork_in_child() -> None:
    # a pool busy in another thread of the parent was copied with its lock held, by a thread the
    # child does not have: the child starts with a free lock (and abandons that pool's readers)
    for pool in list(_pools):
        pool._busy = threading.Lock()


process.at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


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
        fallback (str | None): the decoder that reads a file ``decoder`` cannot read exactly; None: such
            a file is refused (:class:`VideoUnsupported`).
        on_fallback (Callable[[str, VideoUnsupported], object] | None): called in the reading process when
            a read (not a probe) is refused as unsupported and the fallback reads that clip instead.
        locate (Locate | None): for videos that are not local files (``s3://``): their local copy (the
            node-local cache's), held while a reader has it open; errors name the URL. None: paths only.
    """

    def __init__(
        self,
        decoder: str | type[VideoReader],
        *,
        threads: int,
        size: Size | None,
        max_open: int | None,
        timeout: float | None,
        metas: dict[str, VideoMeta] | None = None,
        before_open: Callable[[], object] | None = None,
        fallback: str | None = None,
        on_fallback: Callable[[str, VideoUnsupported], object] | None = None,
        locate: Locate | None = None,
    ) -> None:
        self.locate = locate
        self.decoder = decoder
        self.fallback = fallback if fallback != decoder else None
        self.on_fallback = on_fallback
        self.threads, self.size, self.timeout = threads, size, timeout
        self.metas = metas or {}
        self.before_open = before_open
        self._readers: HandleCache[str, VideoReader] = HandleCache(
            self._open, _close_reader, max_open=max_open, close_inherited=False
        )
        self.watchdog = Watchdog(timeout)
        self._busy = threading.Lock()  # held while this process reads; see close_idle
        _pools.add(self)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_busy"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._busy = threading.Lock()
        _pools.add(self)

    @property
    def open_count(self) -> int:
        """Readers open now in this process."""
        return len(self._readers)

    def decoder_of(self, path: str) -> str | type[VideoReader]:
        """The decoder that reads ``path``: the fallback where the probe or a read moved it there."""
        meta = self.metas.get(path)
        return meta.extra.get("decoder", self.decoder) if meta is not None else self.decoder

    def _local(self, path: str) -> tuple[str, Callable[[], None] | None]:
        """The file the decoder opens for ``path``, and what lets it go (None for a local path)."""
        if self.locate is None:
            return path, None
        return self.locate(path)

    def _open(self, path: str) -> VideoReader:
        cls = reader_class(self.decoder_of(path))
        if self.before_open is not None:
            self.before_open()
        local, release = self._local(path)
        try:
            reader = self.watchdog.call(
                cls,
                local,
                threads=self.threads,
                size=self.size,
                meta=self.metas.get(path),
                what="opening the video",
                source=path,
            )
        except BaseException as e:  # noqa: BLE001 - raised again, naming the URL
            if release is not None:
                release()
            raise _renamed(e, local, path)  # noqa: B904 - its cause is kept
        if release is not None:
            setattr(reader, _RELEASE_ATTR, release)
        return reader

    def probe(self, path: str) -> VideoMeta:
        """The file's :class:`VideoMeta`, found by opening it under the watchdog (then closing it); a file
        the decoder refuses as unsupported is probed with the fallback, and its meta says so."""
        with self._busy:
            try:
                return self._probe(self.decoder, path)
            except VideoUnsupported as e:
                if self.fallback is None:
                    raise
                return self._fallen_back(path, self._probe(self._fallback_class(e), path), e)

    def _probe(self, decoder: str | type[VideoReader], path: str) -> VideoMeta:
        cls = reader_class(decoder)
        local, release = self._local(path)
        try:
            return self.watchdog.call(cls.probe, local, threads=self.threads, what="probing the video", source=path)
        except BaseException as e:  # noqa: BLE001 - raised again, naming the URL
            raise _renamed(e, local, path)  # noqa: B904 - its cause is kept
        finally:
            if release is not None:
                release()

    def _fallback_class(self, refusal: VideoUnsupported) -> type[VideoReader]:
        assert self.fallback is not None
        try:
            return reader_class(self.fallback)
        except ImportError as e:  # the fallback is not installed: the refusal stands, and says why
            raise refusal from e

    def _fallen_back(self, path: str, meta: VideoMeta, refusal: VideoUnsupported) -> VideoMeta:
        assert self.fallback is not None
        extra = {**meta.extra, "decoder": self.fallback, "refused": str(refusal)[:500]}
        return dataclasses.replace(meta, extra=extra)

    def read(self, path: str, frames: Sequence[int], *, pause: bool = True) -> np.ndarray:
        """Frames ``frames`` of ``path`` as ``uint8 [T, H, W, 3]``.

        Args:
            pause (bool): no read of this file follows right away (let the reader stop background
                work); False when the caller reads on from where this read ends. Defaults to True.

        Raises:
            SourceNotFound, VideoUnreadable, FramesMissing, DecodeFailed, DecodeTimeout: bad input,
                for the dataset's error policy.
        """
        with self._busy:
            try:
                return self._read(path, frames, pause)
            except VideoUnsupported as e:
                if self.fallback is None or self.decoder_of(path) == self.fallback:
                    raise
                cls = self._fallback_class(e)
                refusal = e
            # this clip alone, from a fresh fallback reader: whether a clip is read by the fallback then
            # depends on the clip, not on what this process read before (so not on num_workers)
            if self.on_fallback is not None:
                self.on_fallback(path, refusal)
            what = f"decoding frames {min(frames)}..{max(frames)}"
            local, release = self._local(path)
            try:
                meta = self.metas.get(path)
                return self.watchdog.call(_read_once, cls, local, frames, meta, self.size, source=path, what=what)
            except BaseException as e:  # noqa: BLE001 - raised again, naming the URL
                raise _renamed(e, local, path)  # noqa: B904 - its cause is kept
            finally:
                if release is not None:
                    release()

    def _read(self, path: str, frames: Sequence[int], pause: bool) -> np.ndarray:
        t = stages.clock()  # 0.0 unless `fastdata bench` probes this process
        reader = self._readers.get(path)
        t = stages.lap("fetch", t)  # opening the file and its container, when not open yet
        try:
            clip = self.watchdog.call(
                _get_frames,
                reader,
                frames,
                pause,
                source=path,
                what=f"decoding frames {min(frames)}..{max(frames)}",
            )
            stages.lap("decode", t)  # demuxing and decoding (the packets' bytes come from a local file)
            return clip
        except DecodeTimeout:
            setattr(reader, _STUCK_ATTR, True)  # another thread is still inside it
            self._readers.discard(path)
            raise
        except BadSample as e:
            self._readers.discard(path)  # reopen fresh next time: decoder state after an error is unknown
            raise _renamed(e, reader.path, path)  # noqa: B904 - its cause is kept

    def close_idle(self) -> None:
        """:meth:`close`, unless a read is in progress in another thread (then leave everything)."""
        if self._busy.acquire(blocking=False):
            try:
                self.close()
            finally:
                self._busy.release()

    def close(self) -> None:
        """Close this process's readers. Idempotent. (Watchdog helper threads stay, idle, for the life
        of the process: see :mod:`~fastdata.formats.video`.)"""
        self._readers.close()
