"""``ClipBatchSampler``: batches of video clips laid out so that each worker decodes forward, file by file.

A random order of clips makes every read a seek, often backwards, into a file that the worker's bounded
pool of open readers has just closed: each clip then costs an open, a seek and the frames from the last
keyframe, as a fresh reader per clip does. This sampler orders an epoch so that a video decoder can keep
going forward instead:

1. **the epoch's sequence**: videos in an order permuted from (seed, epoch); each video's clips in the
   order of their first frame (the clip starts of that epoch). Ranks take equal, contiguous parts of it
   (:func:`fastdata.core.epoch.rank_span`), so every clip is read once per epoch across ranks;
2. **streams**: the rank's part is cut into ``lanes * S`` contiguous *streams* (``S = batch_size / run``)
   of about equal length, each a run of whole videos (a cut moves to the nearest video boundary within
   half a stream), forward; stream ``r`` belongs to lane ``r % lanes``, so a lane's streams lie spread
   over the sequence and lanes read different files;
3. **batches**: lane ``w``'s ``t``-th batch takes the next ``run`` clips of each of its ``S`` streams, and
   the batches go out lane after lane: batch ``t * lanes + w``. The DataLoader deals batch ``b`` to worker
   ``b % num_workers``, so with ``lanes == num_workers`` worker ``w`` reads exactly lane ``w``: each of its
   streams forward, one file after the other, one seek per file and pass, and at most ``S`` files open.

Each batch draws from ``S = batch_size / run`` videos (half as many as clips with ``run=2``); the price of
the locality is that consecutive batches of one worker continue the same videos. The order depends on
(seed, epoch, rank, world size, batch size, ``lanes``, ``run``), never on the ``num_workers`` actually
used: another worker count reads the same batches, only less decoder-friendly. It resumes through
:mod:`fastdata.core.epoch` like :class:`~fastdata.loading.ChunkBatchSampler`, whose
bookkeeping it shares. Build one with :meth:`fastdata.VideoClipDataset.clip_sampler`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fastdata.core.epoch import Remainder, rank_span
from fastdata.core.errors import ConfigError, check_positive
from fastdata.core.process import SharedState
from fastdata.loading._chunk_sampler import ChunkBatchSampler


def stream_cuts(videos: np.ndarray, streams: int) -> np.ndarray:
    """Where to cut a rank's sequence into ``streams`` streams (``streams + 1`` positions from 0 to its
    length): equal parts, each cut moved to the nearest start of a video when one lies within half a
    stream, so that a video is read whole by one stream. ``videos``: the video of each position."""
    length = len(videos)
    cuts = np.linspace(0, length, streams + 1)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(videos)) + 1, [length]])
    k = np.clip(np.searchsorted(starts, cuts), 1, len(starts) - 1)
    nearest = np.where(cuts - starts[k - 1] <= starts[k] - cuts, starts[k - 1], starts[k])
    snapped = np.where(np.abs(nearest - cuts) <= length / streams / 2, nearest, np.round(cuts)).astype(np.int64)
    snapped[0], snapped[-1] = 0, length
    return np.maximum.accumulate(snapped)


def stream_order(cuts: np.ndarray, *, lanes: int, run: int) -> np.ndarray:
    """Positions ``0 .. cuts[-1]-1`` of a rank's sequence in batch order (see the module doc, steps 2-3):
    stream ``r`` is ``cuts[r] .. cuts[r+1]-1``, in lane ``r % lanes``, read in chunks of ``run``; for
    ``t = 0, 1, ...``: lane after lane, chunk ``t`` of each of the lane's streams."""
    cuts = np.asarray(cuts, dtype=np.int64)
    position = np.arange(int(cuts[-1]), dtype=np.int64)
    stream = np.searchsorted(cuts, position, side="right") - 1
    step = (position - cuts[stream]) // run
    return position[np.lexsort((position, stream // lanes, stream % lanes, step))]


class ClipBatchSampler(ChunkBatchSampler):
    """Batches of a video clip dataset for this rank, laid out for forward decoding; see the module doc.

    Pass as ``fd.Loader(ds, batch_sampler=...)`` or ``DataLoader(ds, batch_sampler=...)``.

    Args:
        video_starts (Sequence[int]): first dataset index of each video's clips, increasing from 0 (a video
            without clips repeats the next one's start).
        n (int): clips in the dataset.
        batch_size (int): clips per batch; a multiple of ``run``.
        clip_starts (Callable[[], Sequence[int]]): the first frame of every clip (by dataset index) in the
            current epoch; called once per epoch.
        lanes (int): the DataLoader workers the layout is made for. Defaults to 1.
        run (int | None): clips of one video in a row within a batch (``batch_size / run`` videos per
            batch). Defaults to 2 when ``batch_size`` is even, else 1.
        shuffle (bool): a new order of videos (and clip starts, from the dataset) every epoch. Defaults to True.
        seed (int): Defaults to 0.
        drop_last (bool): drop the rank's last, smaller batch. Defaults to False.
        remainder ("drop" | "pad" | "uneven"): see :data:`fastdata.core.epoch.Remainder`. Defaults to "drop".
        rank, world_size (int | None): Default to the detected ones.
        shared (SharedState | None): the dataset's shared state, to follow its ``set_epoch``.

    Raises:
        ConfigError: ``batch_size`` not a multiple of ``run``, or video starts that do not increase.
    """

    def __init__(
        self,
        video_starts: Sequence[int] | np.ndarray,
        n: int,
        batch_size: int,
        *,
        clip_starts: Callable[[], Sequence[int]],
        lanes: int = 1,
        run: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        remainder: Remainder = "drop",
        rank: int | None = None,
        world_size: int | None = None,
        shared: SharedState | None = None,
    ) -> None:
        check_positive("batch_size", batch_size)
        check_positive("lanes", lanes)
        run = run if run is not None else (2 if batch_size % 2 == 0 else 1)
        check_positive("run", run)
        if batch_size % run:
            raise ConfigError(
                f"batch_size={batch_size} is not a multiple of run={run} (clips of one video in a row in a "
                "batch); pass a run that divides it, e.g. run=1"
            )
        starts = np.asarray(video_starts, dtype=np.int64)
        if len(starts) and ((np.diff(starts) < 0).any() or starts[0] != 0 or starts[-1] > n):
            raise ConfigError(f"video starts must increase from 0 and stay within n={n}")
        self.video_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))  # video of each clip
        nonempty = np.unique(starts[starts < n]) if n else starts[:0]
        super().__init__(
            nonempty,
            n,
            batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            remainder=remainder,
            rank=rank,
            world_size=world_size,
            shared=shared,
        )
        self.lanes, self.run = lanes, run
        self.streams = batch_size // run
        self._clip_starts = clip_starts

    def sequence(self) -> np.ndarray:
        """The epoch's sequence of clip indices (step 1 of the module doc), the same on every rank."""
        videos = int(self.video_of.max()) + 1 if len(self.video_of) else 0
        if self.shuffle:
            place = np.empty(videos, dtype=np.int64)
            place[np.random.default_rng([self.seed, self.epoch, 0x51DE]).permutation(videos)] = np.arange(videos)
        else:
            place = np.arange(videos, dtype=np.int64)
        frames = np.asarray(self._clip_starts(), dtype=np.int64)
        if frames.shape != (self.n,):
            raise ConfigError(f"clip_starts() gave {frames.shape[0]} start frames for {self.n} clips")
        return np.lexsort((np.arange(self.n), frames, place[self.video_of]))

    def rank_order(self, rank: int, world_size: int, batch_size: int) -> np.ndarray:
        """Rank ``rank``'s clip indices of the current epoch, in batch order, in a plan of ``world_size``
        ranks with batches of ``batch_size`` (steps 2-3 of the module doc)."""
        seq = self.sequence()
        start, length = rank_span(self.n, rank, world_size, self.remainder)
        mine = seq[(start + np.arange(length)) % self.n]
        cuts = stream_cuts(self.video_of[mine], self.lanes * (batch_size // self.run))
        return mine[stream_order(cuts, lanes=self.lanes, run=self.run)]

    def _plan(self) -> dict[str, int]:
        return {**super()._plan(), "lanes": self.lanes, "run": self.run}

    def __repr__(self) -> str:
        return (
            f"ClipBatchSampler({self.n} clips, batch_size={self.batch_size}, lanes={self.lanes}, run={self.run}, "
            f"rank {self.rank}/{self.world_size})"
        )


__all__ = ["ClipBatchSampler", "stream_cuts", "stream_order"]
