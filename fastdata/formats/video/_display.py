"""The display matrix: how a video's frames are turned for display, applied alike by every decoder.

A phone stores a portrait video as landscape frames plus a display matrix (side data of the stream:
"rotate by 90 degrees to show this"). fastdata returns frames as they are displayed: the matrix is
applied as FFmpeg's command line applies it by default (``-autorotate``), for the eight orientations a
frame can take (rotations by multiples of 90 degrees, mirrored or not). PyAV hands us the raw frames,
and :meth:`Display.apply` turns them. decord, OpenCV and torchcodec (0.11 and later) rotate by the
matrix's angle themselves (``av_display_rotation_get``, rounded to 90 degrees) and ignore a mirror;
for those the reader applies what is left (:meth:`Display.after_rotation`: nothing, unless mirrored).
A matrix that turns by another angle is refused (the stream info says so, naming the file).

FFmpeg's matrix ``[a, b, u, c, d, v, x, y, w]`` maps a source pixel ``(p, q)`` (column, row) to
``(a p + c q, b p + d q)`` on screen, up to a shift; only the signs of ``a, b, c, d`` matter here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Display:
    """One of the eight orientations, as the signs (-1, 0, 1) of FFmpeg's ``a, b, c, d``.

    Defaults to the identity (frames shown as stored).
    """

    a: int = 1
    b: int = 0
    c: int = 0
    d: int = 1

    @classmethod
    def from_matrix(cls, matrix: Sequence[int]) -> Display | None:
        """The orientation of FFmpeg's 9-entry display matrix (16.16 fixed point), or None when it
        turns by an angle that is not a multiple of 90 degrees."""
        a, b, c, d = (int(matrix[i]) for i in (0, 1, 3, 4))
        big = max(abs(a), abs(b), abs(c), abs(d))
        if big == 0:
            return None

        def sign(v: int) -> int:  # entries that should be 0 may carry rounding noise
            return 0 if abs(v) < big / 100 else (1 if v > 0 else -1)

        a, b, c, d = sign(a), sign(b), sign(c), sign(d)
        if not ((a and d and not b and not c) or (b and c and not a and not d)):
            return None
        return cls(a, b, c, d)

    @classmethod
    def from_json(cls, data: Sequence[int] | None) -> Display:
        return cls(*data) if data else cls()

    def to_json(self) -> list[int]:
        return [self.a, self.b, self.c, self.d]

    @property
    def identity(self) -> bool:
        return self == Display()

    @property
    def swaps(self) -> bool:
        """Whether width and height trade places (a quarter turn)."""
        return self.a == 0

    @property
    def mirrored(self) -> bool:
        return self.a * self.d - self.b * self.c < 0

    @property
    def angle(self) -> int:
        """The counter-clockwise angle, degrees, as ``av_display_rotation_get`` reports it (what
        decord, OpenCV and torchcodec rotate by): one of 0, 90, -90, 180, -180."""
        return round(-math.degrees(math.atan2(self.b, self.a)))

    def shown(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` on screen of frames stored ``height x width``."""
        return (width, height) if self.swaps else (height, width)

    def apply(self, frames: np.ndarray) -> np.ndarray:
        """Turn stored frames ``[..., H, W, C]`` into displayed ones (a view; copy before handing out)."""
        if self.identity:
            return frames
        rows, cols = frames.ndim - 3, frames.ndim - 2
        if self.swaps:  # out[b p, c q] = in[q, p]
            frames, flip_rows, flip_cols = np.swapaxes(frames, rows, cols), self.b < 0, self.c < 0
        else:  # out[d q, a p] = in[q, p]
            flip_rows, flip_cols = self.d < 0, self.a < 0
        if flip_rows:
            frames = np.flip(frames, rows)
        if flip_cols:
            frames = np.flip(frames, cols)
        return frames

    def after_rotation(self, frames: np.ndarray) -> np.ndarray:
        """Displayed frames from frames a decoder already rotated by :attr:`angle` (nothing to do
        unless the matrix mirrors; then a contiguous copy)."""
        if not self.mirrored:
            return frames
        rows, cols = frames.ndim - 3, frames.ndim - 2
        unrotated = np.rot90(frames, -self.angle // 90, axes=(rows, cols))
        return np.ascontiguousarray(self.apply(unrotated))
