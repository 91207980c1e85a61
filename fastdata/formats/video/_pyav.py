"""The PyAV (FFmpeg) reader: one seek per clip, decode forward, convert only the frames asked for.

PyAV gives us the demuxer and decoder directly, so the seek strategy is ours:

* the frame table (each frame's timestamp, which frames are keyframes) is read once from the packets
  without decoding, at probe time, and cached in the clip index; the reader never rescans the file
  (:mod:`fastdata.formats.video`, which also picks the stream, FFmpeg's best, and reads the
  display matrix, applied to every frame converted);
* a read jumps to the keyframe at or before its first frame and decodes forward; when the decoder
  already sits between that keyframe and the first frame (the next clip of a sequential read), it just
  keeps going, without a seek. A seek that lands after the frames wanted (a late index entry, an open
  GOP's leading frames, an MPEG-TS file, where FFmpeg's timestamp search lands one keyframe group late)
  is redone from an earlier keyframe, and from the first keyframe by the start of the file; the reader
  remembers how far back its seeks must start, so that it pays for a late seek once, not per clip;
* frames in between are decoded (they must be, to decode what follows) but only the ones asked for are
  converted to RGB, through one ``VideoReformatter`` per thread, shared by all readers (a new one per
  frame, as ``frame.to_ndarray(format="rgb24")`` makes, costs ~0.4 ms here; one per reader adds that
  to every reopen);
* no helper threads: with ``threads=1`` all work happens in the calling thread, so N DataLoader
  workers use N cores, not 2N.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdata.core.errors import BadSample, DecodeFailed
from fastdata.formats.video._base import Size, VideoMeta, VideoReader, unreadable
from fastdata.formats.video._stream import FrameTable, StreamInfo

_local = threading.local()


def _reformatter() -> Any:
    reformatter = getattr(_local, "reformatter", None)
    if reformatter is None:
        from av.video.reformatter import VideoReformatter

        reformatter = _local.reformatter = VideoReformatter()
    return reformatter


# Seeks retried from an earlier keyframe when a seek lands after the frames wanted (files whose
# index points a little late, open-GOP streams whose leading frames need the previous GOP).
SEEK_RETRIES = 2


class PyAVReader(VideoReader):
    """Reads frames through PyAV; see the module docstring for the seek strategy."""

    name = "pyav"

    def __init__(self, path: str, *, threads: int = 1, size: Size | None = None, meta: VideoMeta | None = None) -> None:
        super().__init__(path, threads=threads, size=size, meta=meta)
        import av

        try:
            self._container: Any = av.open(path, metadata_errors="ignore")
        except Exception as e:
            raise unreadable(path, "PyAV", e) from e
        try:
            info = StreamInfo.from_meta(meta)
            self._stream = self._container.streams[info.index] if info is not None else StreamInfo.pick(self._container)
            codec = self._stream.codec_context
            codec.thread_count = threads  # before the first decode opens the codec
            if threads > 1:
                codec.thread_type = "AUTO"
            if info is None:
                info = StreamInfo.read(self._container, self._stream, path)
                meta = info.meta()
            assert meta is not None
        except BadSample:
            self._container.close()
            raise
        except Exception as e:
            self._container.close()
            raise unreadable(path, "PyAV", e) from e
        self.info = info
        self._table: FrameTable = info.table
        self._display = info.display
        self._turned = not info.display.identity
        self._meta = meta
        self._frames: Iterator[Any] | None = None
        self._next = -1  # frame number the decoder produces next; -1: unknown, seek first
        self._back = 0  # keyframes further back a seek starts from (learned from seeks that landed late)

    def _decode_from(self, key: int) -> None:
        if key <= self._table.keys[0]:
            # the first keyframe: from the start of the file (a timestamp search can land late there, and
            # nothing lies before it)
            self._container.seek(0, backward=True, any_frame=False)
        else:
            self._container.seek(self._table.pts(key), stream=self._stream, backward=True, any_frame=False)
        self._stream.codec_context.flush_buffers()
        self._frames = self._decoded()
        self._next = key

    def _earlier(self, key: int, times: int = 1) -> int:
        """The keyframe ``times`` keyframes before ``key`` (the first one at the least)."""
        for _ in range(times):
            key = self._table.keyframe_before(key - 1) if key > 0 else 0
        return key

    def _decoded(self) -> Iterator[Any]:
        for packet in self._container.demux(self._stream):
            yield from packet.decode()  # the last, empty packet drains the decoder

    def _read(self, wanted: list[int]) -> np.ndarray:
        first = wanted[0]
        key = self._table.keyframe_before(first)
        h, w = self.shown_size
        out = np.empty((len(wanted), h, w, 3), np.uint8)
        slot = {f: k for k, f in enumerate(wanted)}
        if not (self._frames is not None and key <= self._next <= first):
            key = self._earlier(key, self._back)
            self._decode_from(key)
        seen = self._fill(out, slot, wanted[-1])
        for _ in range(SEEK_RETRIES):
            if not slot or (seen is not None and seen[0] <= min(slot)):
                break
            # the decoder started after a wanted frame (a late index entry, an open GOP, an MPEG-TS seek):
            # go back, and start this reader's later seeks that much earlier
            if key > self._table.keys[0]:
                self._back = min(self._back + 1, SEEK_RETRIES)
            key = self._earlier(key)
            self._decode_from(key)
            seen = self._fill(out, slot, wanted[-1])
        if slot:
            self._frames, self._next = None, -1
            raise self.missing(sorted(slot), None if seen is None else seen[1])
        return out

    def _fill(self, out: np.ndarray, slot: dict[int, int], last: int) -> tuple[int, int] | None:
        """Decode forward, converting the frames in ``slot`` (removed once filled) into ``out``;
        stop after frame ``last``. Returns the first and last frame numbers decoded, if any."""
        table, frames = self._table, self._frames
        assert frames is not None
        first_seen = seen = -1
        try:
            for frame in frames:
                i = table.index(frame.pts if frame.pts is not None else frame.dts)
                if i is None:
                    continue
                if first_seen < 0:
                    first_seen = i
                seen = i
                self._next = i + 1
                k = slot.pop(i, None)
                if k is not None:
                    self._convert(frame, out[k])
                    if not slot:
                        return first_seen, seen
                if i >= last:
                    return first_seen, seen
        except Exception as e:
            self._frames, self._next = None, -1
            raise DecodeFailed(
                f"{self.path}: PyAV cannot decode frames {sorted(slot)} "
                f"({type(e).__name__}: {e}); the file is damaged: re-encode it, or pass "
                "on_error='skip'",
                self.path,
            ) from e
        self._frames, self._next = None, -1  # end of stream: the next read seeks
        return (first_seen, seen) if seen >= 0 else None

    def _convert(self, frame: Any, out: np.ndarray) -> None:
        h, w = out.shape[:2]
        if self._turned:
            h, w = self._display.shown(h, w)  # the stored orientation of the output size
        resize = (h, w) != (frame.height, frame.width)
        rgb = _reformatter().reformat(
            frame, format="rgb24", width=w, height=h, threads=self.threads, interpolation="AREA" if resize else None
        )
        out[...] = self._display.apply(rgb.to_ndarray()) if self._turned else rgb.to_ndarray()

    def close(self) -> None:
        container, self._container = getattr(self, "_container", None), None
        self._frames = None
        if container is not None:
            container.close()
