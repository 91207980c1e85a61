"""The decord reader, with the three fixes that make a kept-open decord reader cheap.

Measured here (224x224 mp4v, keyframe every 12 frames, random 8-frame clips with stride 2), a decord
``VideoReader`` kept open was ~2x slower than a fresh one per clip. decord decodes in a helper thread
fed by the calling thread, which pushes packets ahead of the frame it waits for; the helper decodes
and converts to RGB everything pushed, and keeps going *after* ``get_batch`` returns, until the next
seek. A fresh reader stops that when it is destroyed; a kept one burnt 40-80 ms of CPU per clip in
the background, stealing the cores of the other DataLoader workers. So:

1. **park** the reader whenever the next read is not a continuation (``seek(0)``: stops and empties
   the helper thread, ~0.2 ms): :meth:`pause`, called by the reader pool at the end of each batch's
   reads from this file; between the clips of a sequential read the read-ahead is useful and kept;
2. **read the span, not the stride** when the clip crosses a keyframe: decord re-seeks (and restarts
   its thread) at every keyframe a strided ``get_batch`` crosses, ~3 ms each, while the frames in
   between are decoded anyway; within one keyframe group, a strided ``get_batch`` is cheaper (decord
   skips RGB conversion of frames it only has to decode);
3. ask in increasing order (the base class sorts), so no read ever seeks backwards mid-clip.

decord readers must never be used or destroyed in a process forked after they were created (that
hangs); the dataset's reader cache abandons inherited readers (``HandleCache(close_inherited=False)``),
and every decord object is registered with ``native``, so that a
forked child never finalises one it inherited, wherever it is referenced from.
"""

from __future__ import annotations

import bisect
import traceback
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


class DecordReader(ProbedReader):
    """Reads frames through decord; see the module docstring."""

    name = "decord"

    def __init__(self, path: str, *, threads: int = 1, size: Size | None = None, meta: VideoMeta | None = None) -> None:
        super().__init__(path, threads=threads, size=size, meta=meta)
        import decord

        self._vr: Any = None
        info = self._probe(meta)
        vr: Any = None
        try:
            # at the stream's size: decord's own resize (its filter graph) gave other pixels than the other
            # decoders; the base class resizes every decoder's frames alike
            # registered before its constructor runs: one that fails after making its native handle
            # leaves the half-built object to the garbage collector (see base.native)
            vr = native(decord.VideoReader.__new__(decord.VideoReader))
            vr.__init__(path, ctx=decord.cpu(0), num_threads=threads)
            frames = len(vr)
            keys = [int(k) for k in vr.get_key_indices()]
        except Exception as e:
            vr = None
            traceback.clear_frames(e.__traceback__)  # decord's frames there hold the half-built reader
            error = f"{type(e).__name__}: {str(e).strip()[:300]}"
            raise unsupported(self, info.codec, "open", error) or unreadable(path, "decord", e) from e
        self._vr, vr = vr, None  # the reader alone holds it: close() frees it
        self._keys = keys
        self.unlisted_keys: list[int] = []
        problem = self._disagrees(frames, keys)
        if problem is None and meta is None:
            try:
                first = self._get([0])
                self.pause()
            except Exception:
                self.close()  # now, in this process: never left to the garbage collector
                raise
            shape = first.shape[1:3]
            if shape != self.shown_size:
                height, width = self.shown_size
                problem = f"its frames are {shape[0]}x{shape[1]}, the stream's {height}x{width}"
        if problem is not None:
            self.close()  # now, in this process: never left to the garbage collector
            raise VideoUnsupported(
                f"{path}: decord does not read this video as FFmpeg does ({problem}); decord cannot be told "
                "otherwise: use decoder='pyav'",
                path,
            )

    def _disagrees(self, frames: int, keys: list[int]) -> str | None:
        """What makes decord's reading of this file differ from the stream's frame table, if anything."""
        info = self.info
        table = info.table
        if info.streams > 1:
            height, width = info.shown
            alike = [o for o in info.others if o[0] == table.n and sorted(o[1:]) == sorted((height, width))]
            if alike:
                return f"{info.streams} video streams alike: which one decord reads cannot be checked"
        if frames != table.n:
            other = f" (it reads another of the {info.streams} video streams)" if info.streams > 1 else ""
            return f"decord counts {frames} frames, video stream {info.index} holds {table.n}{other}"
        if keys != table.keys and not (keys and keys[0] == table.keys[0] and set(keys) <= set(table.keys)):
            return (
                f"its keyframes are frames {keys[:6]}, the stream's {table.keys[:6]}: it would return other "
                "frames than asked after a seek, as on open-GOP HEVC"
            )
        # decord lists only some of the stream's keyframes (x264's scene-cut I-frames that are not IDR):
        # it seeks to an earlier keyframe than it could and decodes forward, which is exact where the
        # frames after an unlisted keyframe decode as PyAV's do: the probe checks that (check_points)
        self.unlisted_keys = sorted(set(table.keys) - set(keys))
        return None

    def _get(self, indices: list[int]) -> np.ndarray:
        try:
            frames = self._vr.get_batch(indices).asnumpy()
        except Exception as e:
            self._park()  # its state after a failure is unknown: stop it before it is closed or reused
            error = f"{type(e).__name__}: {str(e).strip()[:300]}"
            raise unsupported(
                self, self.info.codec, f"decode frames {indices[0]}..{indices[-1]} of", error, indices
            ) or DecodeFailed(
                f"{self.path}: decord cannot decode frames {indices[0]}..{indices[-1]} ({error}); the file is "
                "damaged: re-encode it, or pass on_error='skip'",
                self.path,
            ) from e
        return self.info.display.after_rotation(frames)  # type: ignore[no-any-return]

    def pause(self) -> None:
        """Park the reader (1. of the module doc): no read continues from where this one ended."""
        self._park()

    def _park(self) -> None:
        # stop decord's helper thread from decoding ahead in the background (see module docstring)
        try:
            self._vr.seek(0)
        except Exception:  # noqa: BLE001 - parking is an optimisation; a failed one changes nothing
            pass

    def _read(self, wanted: list[int]) -> np.ndarray:
        first, last = wanted[0], wanted[-1]
        crosses_keyframe = bisect.bisect_right(self._keys, last) > bisect.bisect_right(self._keys, first)
        if crosses_keyframe and len(wanted) > 1:
            frames = self._get(list(range(first, last + 1)))[np.asarray(wanted) - first]
        else:
            frames = self._get(wanted)
        if frames.shape[0] != len(wanted):
            raise self.missing(wanted, None)
        return frames

    def close(self) -> None:
        # dropping the last reference runs decord's destructor, which closes the file
        self._vr = None

    @classmethod
    def probe(cls, path: str, *, threads: int = 1) -> VideoMeta:
        """Open the file (its checks against the stream), and hold two of its frames to PyAV's
        (``checked_probe``: decord misnumbered MPEG-TS frames)."""
        return checked_probe(cls, path, threads)
