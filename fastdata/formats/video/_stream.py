"""The video stream every decoder reads, and what its container says about it, found once through PyAV.

Decoders disagree on more than speed: which stream of a file with several they read, whether frames
are turned by the display matrix, how frames are numbered after a seek. So the facts are found once,
the same way whichever decoder reads, from the container through PyAV (FFmpeg), and kept in the video
index with the rest of :class:`~fastdata.formats.video.VideoMeta` (its ``extra``):

* **the stream**: FFmpeg's own choice, ``av_find_best_stream`` (what the ``ffmpeg`` command line,
  decord and torchcodec pick: the default-disposition stream, then the one with most probed frames,
  then the highest bit rate). A decoder that cannot read that stream refuses the file;
* **the frame table**: every frame's timestamp in presentation order and which frames are keyframes,
  read from the packets (demux only, no decode). Frame ``i`` of a video is frame ``i`` of this table
  for every decoder; readers check their decoder against it;
* **the frames the container announces** (``nb_frames``, from an MP4's index or an AVI's header):
  announcing more frames than the file holds means it was cut short or damaged, and it is refused
  (:class:`~fastdata.formats.video.FramesMissing`) instead of read as a shorter video;
* the codec, the display matrix (read from the first frame, whose decoding also proves the stream
  decodes), and the stream's start time and time base (OpenCV reports positions relative to them).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from fastdata.core.errors import BadSample
from fastdata.formats.video._base import FramesMissing, VideoMeta, VideoReader, VideoUnsupported, unreadable
from fastdata.formats.video._display import Display


class FrameTable:
    """Timestamp of every frame (presentation order) and the frame numbers of the keyframes."""

    def __init__(self, pts: list[int] | dict[str, int], keys: list[int]) -> None:
        if isinstance(pts, dict):  # constant frame rate: stored as start + step * i
            self.start, self.step, self.n = int(pts["start"]), int(pts["step"]), int(pts["n"])
            self._pts: list[int] | None = None
            self._index: dict[int, int] | None = None
        else:
            self.start, self.step, self.n = 0, 0, len(pts)
            self._pts = list(pts)
            self._index = {p: i for i, p in enumerate(self._pts)}
        self.keys = keys or [0]
        self.packets = self.n  # packets the scan met, empty ones too (a table loaded from JSON: its frames)

    @classmethod
    def scan(cls, container: Any, stream: Any) -> FrameTable:
        """Read every packet's timestamp and keyframe flag (demux only, no decode)."""
        stamps: list[tuple[int, bool]] = []
        packets = 0
        for packet in container.demux(stream):
            ts = packet.pts if packet.pts is not None else packet.dts
            if ts is None:
                continue  # the empty packet that ends the stream
            packets += 1
            if packet.size == 0:
                continue  # a frame the muxer dropped (an empty AVI chunk): it is in the file, decodes to nothing
            stamps.append((ts, bool(packet.is_keyframe)))
        stamps.sort()
        pts = [t for t, _ in stamps]
        keys = [i for i, (_, key) in enumerate(stamps) if key]
        steps = {b - a for a, b in itertools.pairwise(pts)}
        if len(pts) > 1 and len(steps) == 1 and pts[1] > pts[0]:
            table = cls({"start": pts[0], "step": pts[1] - pts[0], "n": len(pts)}, keys)
        else:
            table = cls(pts, keys)
        table.packets = packets
        return table

    def to_json(self) -> dict[str, Any]:
        pts: Any = self._pts if self._pts is not None else {"start": self.start, "step": self.step, "n": self.n}
        return {"pts": pts, "keys": self.keys}

    @property
    def constant_rate(self) -> bool:
        return self._pts is None

    def pts(self, i: int) -> int:
        return self._pts[i] if self._pts is not None else self.start + self.step * i

    def index(self, pts: int | None) -> int | None:
        """The frame number with timestamp ``pts`` (None when no frame has it)."""
        if pts is None:
            return None
        if self._index is not None:
            return self._index.get(pts)
        i, r = divmod(pts - self.start, self.step)
        return i if r == 0 and 0 <= i < self.n else None

    def nearest(self, pts: float, tolerance: float) -> int | None:
        """The frame whose timestamp is within ``tolerance`` of ``pts`` (None when none is)."""
        if self._pts is None:  # (called for every frame OpenCV grabs: kept to arithmetic)
            i = round((pts - self.start) / self.step)
            return i if 0 <= i < self.n and abs(self.start + self.step * i - pts) <= tolerance else None
        k = bisect.bisect_left(self._pts, pts)
        candidates = [j for j in (k - 1, k) if 0 <= j < self.n]
        best = min(candidates, key=lambda j: abs(self.pts(j) - pts), default=None)
        return best if best is not None and abs(self.pts(best) - pts) <= tolerance else None

    def keyframe_before(self, i: int) -> int:
        """The last keyframe at or before frame ``i``."""
        k = bisect.bisect_right(self.keys, i) - 1
        return self.keys[max(k, 0)] if self.keys[0] <= i else 0


@dataclass(frozen=True)
class StreamInfo:
    """What the container says about the video stream every decoder reads (see the module docstring).

    Attributes:
        index (int): the stream's index in the container (among all streams).
        streams (int): video streams in the file.
        first (bool): whether it is the first video stream (the only one OpenCV reads).
        codec (str): FFmpeg's name of the codec (``"h264"``, ``"hevc"``, ``"av1"`` ...).
        table (FrameTable): the frames the file holds.
        announced (int): frames the container announces; 0 when it does not say.
        start (int): the stream's start time, in ``time_base`` units.
        time_base (Fraction): seconds per timestamp unit.
        display (Display): how frames are turned for display.
        fps (float): average frame rate.
        height, width (int): stored frame size (before the display matrix is applied).
        others (list[list[int]]): ``[frames, height, width]`` the container announces for each other
            video stream (to tell which stream a decoder that picks its own is reading).
    """

    index: int
    streams: int
    first: bool
    codec: str
    table: FrameTable
    announced: int
    start: int
    time_base: Fraction
    display: Display
    fps: float
    height: int
    width: int
    others: list[list[int]]

    @staticmethod
    def pick(container: Any) -> Any:
        """The video stream FFmpeg picks (``av_find_best_stream``). Raises ValueError if none."""
        video = list(container.streams.video)
        if not video:
            raise ValueError("no video stream")
        best = container.streams.best("video")
        return best if best is not None else video[0]

    @classmethod
    def read(cls, container: Any, stream: Any, path: str) -> StreamInfo:
        """Scan ``stream`` of an open PyAV container, and decode its first frame (which leaves the
        container after that frame: seek before reading on).

        Raises:
            FramesMissing: the container announces more frames than the file holds.
            VideoUnsupported: a display matrix that turns by an angle other than a multiple of 90 degrees.
            ValueError, av.error.FFmpegError: no frames, or the first frame does not decode.
        """
        table = FrameTable.scan(container, stream)
        if table.n == 0:
            raise ValueError("no video frames")
        announced = int(stream.frames or 0)
        if announced > table.packets:
            raise FramesMissing(
                f"{path}: the container announces {announced} frames, the file holds {table.packets}: it was cut "
                "short or is damaged; re-copy or re-encode it, or pass on_error='skip'",
                path,
            )
        matrix = _first_frame_matrix(container, stream, table)
        display = Display() if matrix is None else Display.from_matrix(matrix)
        if display is None:
            raise VideoUnsupported(
                f"{path}: its display matrix turns frames by {_angle(matrix):.1f} degrees; fastdata applies "
                "quarter turns and mirrors only: re-encode the video with the turn applied",
                path,
            )
        video = list(container.streams.video)
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        codec = stream.codec_context
        return cls(
            index=stream.index,
            streams=len(video),
            first=stream is video[0] or stream.index == video[0].index,
            codec=str(getattr(codec.codec, "canonical_name", None) or codec.name),  # "av1", not "libdav1d"
            table=table,
            announced=announced,
            start=int(stream.start_time or 0),
            time_base=Fraction(stream.time_base or Fraction(1, 1)),
            display=display,
            fps=float(rate) if rate else 0.0,
            height=int(codec.height),
            width=int(codec.width),
            others=[[int(s.frames or 0), int(s.height or 0), int(s.width or 0)] for s in video if s is not stream],
        )

    @classmethod
    def probe(cls, path: str) -> StreamInfo:
        """Open ``path`` with PyAV and read its stream info (see :meth:`read`)."""
        import av

        with av.open(path, metadata_errors="ignore") as container:
            return cls.read(container, cls.pick(container), path)

    @classmethod
    def of(cls, path: str, meta: VideoMeta | None) -> StreamInfo:
        """The info an earlier probe stored in ``meta``, else found now through PyAV (for the decoders
        other than PyAV, which check themselves against it)."""
        info = cls.from_meta(meta)
        if info is not None:
            return info
        try:
            return cls.probe(path)
        except BadSample:
            raise
        except Exception as e:
            raise unreadable(path, "PyAV (which finds the stream and frames every decoder reads)", e) from e

    @property
    def shown(self) -> tuple[int, int]:
        """``(height, width)`` of frames as displayed."""
        return self.display.shown(self.height, self.width)

    def meta(self) -> VideoMeta:
        """The :class:`VideoMeta` every decoder reports for this stream (this info in its ``extra``)."""
        height, width = self.shown
        return VideoMeta(self.table.n, self.fps, height, width, self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {
            **self.table.to_json(),
            "stream": self.index,
            "streams": self.streams,
            "first": self.first,
            "codec": self.codec,
            "announced": self.announced,
            "start": self.start,
            "time_base": [self.time_base.numerator, self.time_base.denominator],
            "display": self.display.to_json(),
            "fps": self.fps,
            "size": [self.height, self.width],
            "others": self.others,
        }

    @classmethod
    def from_meta(cls, meta: VideoMeta | None) -> StreamInfo | None:
        """The info an earlier probe stored in ``meta.extra``; None when it holds none."""
        data = meta.extra if meta is not None else {}
        if "pts" not in data or "stream" not in data:
            return None
        num, den = data["time_base"]
        height, width = data["size"]
        return cls(
            index=int(data["stream"]),
            streams=int(data["streams"]),
            first=bool(data["first"]),
            codec=str(data["codec"]),
            table=FrameTable(data["pts"], list(data["keys"])),
            announced=int(data["announced"]),
            start=int(data["start"]),
            time_base=Fraction(int(num), int(den)),
            display=Display.from_json(data["display"]),
            fps=float(data["fps"]),
            height=int(height),
            width=int(width),
            others=[list(o) for o in data["others"]],
        )


def _first_frame_matrix(container: Any, stream: Any, table: FrameTable) -> list[int] | None:
    """The display matrix carried by the stream's first frame (None: none), decoding that frame."""
    container.seek(table.pts(table.keys[0]), stream=stream, backward=True, any_frame=False)
    stream.codec_context.flush_buffers()
    for packet in container.demux(stream):
        for frame in packet.decode():  # the last, empty packet drains the decoder
            for side in frame.side_data:
                if getattr(side.type, "name", str(side.type)).endswith("DISPLAYMATRIX"):
                    return [int(v) for v in np.frombuffer(bytes(side), np.int32)[:9]]
            return None
    raise ValueError("no frame decodes")


def _angle(matrix: list[int] | None) -> float:
    a, b = (matrix or [1, 0])[:2]
    return float(-np.degrees(np.arctan2(b, a)))


class ProbedReader(VideoReader):
    """The base of the readers whose decoder opens the file itself after the stream is probed (decord,
    OpenCV, torchcodec): the stream they decode is FFmpeg's choice, the one PyAV reads."""

    def _probe(self, meta: VideoMeta | None) -> StreamInfo:
        """Probe the stream (or rebuild it from ``meta``, an earlier probe); sets :attr:`info` and :attr:`meta`."""
        self.info = info = StreamInfo.of(self.path, meta)
        self._meta = meta if meta is not None else info.meta()
        return info
