"""Where the clips of a :class:`~fastdata.VideoClipDataset` start: pure functions of (seed, epoch, video,
clip), the same in every worker and rank, so any process computes any clip's frames on its own."""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import numpy as np

ClipSampling = Literal["random", "uniform", "random-replace"]
"""Where the ``k`` clips of a video start (with an int ``clips_per_video``).

* ``"random"``: random starts per (seed, epoch, video), all different within a video in one epoch (drawn
  without replacement among the video's possible starts; a video with fewer possible starts than ``k``
  uses each of them before any twice). Default.
* ``"uniform"``: ``k`` fixed starts spaced evenly (evaluation).
* ``"random-replace"``: a random start per (seed, epoch, video, clip), drawn independently, so two clips of
  one video may start at the same frame (what ``"random"`` did before it drew without replacement).
"""

STARTS_CACHE = 256  # videos whose starts of an epoch a process keeps


class ClipStarts:
    """The first frame of every clip, per epoch.

    Args:
        seed (int): the dataset's seed.
        clips_per_video (int | "all"): clips per video.
        clip_step (int): frames between starts under ``"all"``.
        clip_sampling (ClipSampling): how an int ``clips_per_video`` places its clips.
    """

    def __init__(self, seed: int, clips_per_video: int | str, clip_step: int, clip_sampling: ClipSampling) -> None:
        self.seed, self.clips_per_video, self.clip_step, self.sampling = seed, clips_per_video, clip_step, clip_sampling
        self._cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()  # (epoch, video) -> starts

    @property
    def random(self) -> bool:
        """Whether the starts change with the epoch."""
        return self.clips_per_video != "all" and self.sampling != "uniform"

    def start(self, epoch: int, video: int, clip: int, room: int) -> int:
        """The first frame of clip ``clip`` of ``video`` in ``epoch``, for a video with ``room + 1`` possible
        starts (its frames minus the frames one clip spans, plus one)."""
        if self.clips_per_video == "all":
            return clip * self.clip_step
        k = int(self.clips_per_video)
        if self.sampling == "uniform":
            return room // 2 if k == 1 else round(clip * room / (k - 1))
        if self.sampling == "random-replace":
            rng = np.random.default_rng([self.seed, epoch, video, clip, 0xC11B])
            return int(rng.integers(0, room + 1))
        return int(self._distinct(epoch, video, room, k)[clip])

    def _distinct(self, epoch: int, video: int, room: int, k: int) -> np.ndarray:
        """``k`` starts of ``video`` in ``epoch`` without replacement, as far as ``room + 1`` starts allow."""
        key = (epoch, video)
        starts = self._cache.get(key)
        if starts is None:
            n = room + 1
            rng = np.random.default_rng([self.seed, epoch, video, 0xC11C])
            if k <= n:
                starts = rng.choice(n, size=k, replace=False)
            else:  # each possible start once, then again, in new random orders
                starts = np.concatenate([rng.permutation(n) for _ in range(-(-k // n))])[:k]
            self._cache[key] = starts
            if len(self._cache) > STARTS_CACHE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return starts


__all__ = ["ClipSampling", "ClipStarts"]
