"""``VideoClipDataset``: map-style access to fixed-length clips of many videos."""

from __future__ import annotations

import os
import random
import time
import warnings
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from fastdata.core import SKIP, SamplePipeline, process, stages
from fastdata.core.epoch import Remainder, current_worker, derive_seed, stagger
from fastdata.core.errors import (
    BadSample,
    ConfigError,
    OnError,
    SourceNotFound,
    SourceUnreadable,
    check_choice,
    is_collecting,
)
from fastdata.datasets._base import MapDatasetBase
from fastdata.datasets.video._plan import ClipSampling, ClipStarts
from fastdata.datasets.video._remote import RemoteVideos, video_cache
from fastdata.datasets.video._sources import Labels, find_videos, subfile
from fastdata.formats.video import (
    DecoderFallbackWarning,
    DecoderName,
    DecodeTimeout,
    ReaderPool,
    Size,
    VideoIndex,
    VideoMeta,
    VideoReader,
    VideoTooShort,
    VideoUnsupported,
    default_index_file,
    reader_class,
)
from fastdata.loading import ClipBatchSampler
from fastdata.storage.cache import COUNTERS as CACHE_COUNTERS
from fastdata.storage.cache import CacheDir


class _OpenStagger:
    """A seeded random pause before each reader opens, so workers do not open files in lockstep."""

    def __init__(self, seed: int, rank: int, low: float, high: float) -> None:
        self.seed, self.rank, self.low, self.high = seed, rank, low, high
        self._rng: random.Random | None = None
        self._pid = -1

    def __call__(self) -> None:
        if self._pid != process.pid():
            worker, num_workers = current_worker()
            self._pid = process.pid()
            self._rng = random.Random(derive_seed(self.seed, self.rank, worker, 0x0BE7)) if num_workers > 1 else None
        if self._rng is not None:
            time.sleep(self._rng.uniform(self.low, self.high))


class VideoClipDataset(MapDatasetBase, Dataset[Any]):
    """Clips of ``clip_len`` frames from many videos, map-style over (video, clip) pairs.

    Each sample is a dict::

        {"clip": uint8 tensor [T, H, W, 3] (RGB), "video": int (position in paths), "path": str,
         "frames": int64 tensor [T] (frame numbers in the video), "fps": float,
         "label": int (with class folders, see below)}

    passed through ``transform`` if given. Class folders give labels, as for images: with ``paths`` one
    folder (or ``s3://`` prefix) whose videos lie in folders below it (``root/<class>/<video>.mp4``), each
    first-level folder is a class (sorted by name: :attr:`classes`), and ``sample["label"]`` its number.

    Videos in an object store (``s3://bucket/prefix/`` or ``s3://`` URLs) are read from local copies in
    the node-local cache (``cache_dir=``; see docs/video.md): each is downloaded once per node, shared by
    every worker and rank on it, and held while a reader has it open.

    At construction every video is probed once (frame count, frame rate, size; the results are cached
    in an index file so the next start opens only new or changed videos; a remote video is downloaded
    into the cache to be probed, and listed ones are known to the index by their listed size). In each
    worker, readers open on first use and stay open in a bounded LRU
    (``max_open`` per worker); a reader created in the parent (``ds[0]`` before the DataLoader starts)
    is never used or closed by a forked worker. Every open and read runs under a watchdog: one that
    takes longer than ``decode_timeout`` is abandoned and treated as bad input.

    Bad input (missing, empty, truncated or damaged files, not a video, a video shorter than one clip,
    frames the container announces but does not hold) raises an error naming the file under
    ``on_error="raise"``; under ``"skip"`` the clip (or, at construction, the whole video) is left out,
    counted in :attr:`skipped`, and warned about once per file. A batch of only bad clips (with
    ``batch_size=1``, every bad clip) becomes a batch of one substitute, and ``ds[i]`` of a bad clip returns
    it (never None): the next good clip after the batch's last index (after ``i``) in index order, wrapping
    to 0, counted in :attr:`substituted` (see :mod:`fastdata.datasets`).

    Args:
        paths (str | PathLike | list): video files, globs, brace ranges, folders (searched recursively
            for video files), ``s3://`` URLs of videos or ``s3://`` prefixes (listed).
        labels ("auto" | bool): labels from class folders: "auto" when ``paths`` is one folder (or
            prefix) of class folders; True: such folders are required (else a ConfigError); False: no
            labels. Defaults to "auto".
        clip_len (int): frames per clip. Defaults to 16.
        frame_stride (int): take every ``frame_stride``-th frame; a clip spans
            ``(clip_len - 1) * frame_stride + 1`` frames. Defaults to 1.
        clips_per_video (int | "all"): clips per video. An int ``k`` gives ``k`` clips per video, placed
            by ``clip_sampling``; ``"all"`` gives every clip start ``clip_step`` frames apart.
            Defaults to 1.
        clip_step (int | None): frames between clip starts under ``"all"``. Defaults to
            ``clip_len * frame_stride``: clips do not overlap, and each continues the frame grid of the
            one before.
        clip_sampling ("random" | "uniform" | "random-replace"): with an int ``clips_per_video``: new random
            starts every epoch, distinct within a video as far as its length allows; evenly spaced fixed
            starts (for evaluation); or random starts drawn independently per clip (two may coincide).
            See ``ClipSampling``. Defaults to "random".
        size ((height, width) | None): resize frames to this size (needed to batch videos of different
            sizes). Defaults to None.
        decoder ("pyav" | "decord" | "opencv" | "torchcodec" | VideoReader subclass): see
            :mod:`fastdata.formats.video`. Defaults to "pyav" (the fastest here; see docs/video.md).
        fallback ("pyav" | "decord" | "opencv" | "torchcodec" | None): the decoder that reads a video
            ``decoder`` cannot read exactly (it refuses it as
            :class:`~fastdata.formats.video.VideoUnsupported`: decord on open-GOP HEVC, OpenCV on a file
            whose chosen stream is not the first...), instead of dropping the video; such videos are
            counted in ``counters()["fallbacks"]``, listed in :attr:`fallback_videos` and warned about
            once; a clip refused so mid-epoch is read by the fallback, counted in
            ``counters()["fallback_reads"]``. None: refuse them (an error under ``on_error="raise"``).
            Defaults to "pyav".
        stagger ((float, float)): each worker process waits a delay drawn from [low, high) seconds,
            seeded by (seed, rank, worker), before its first read, so workers do not all open files at
            the same instant. Only when there is more than one reader (workers x ranks). Defaults to
            (0.0, 0.05).
        stagger_each_open (bool): also wait such a delay before opening each new file. Defaults to False.
        max_open (int | None): readers open at once per process. None: derived from ``ulimit -n``.
            Defaults to 8.
        decode_threads (int): FFmpeg threads per reader. Defaults to 1.
        decode_timeout (float | None): seconds one open or read may take before it is abandoned.
            None disables the watchdog. Defaults to 60.
        on_error ("raise" | "skip"): Defaults to "raise".
        transform (Callable[[dict], Any] | None): applied to each sample dict in the worker.
        index_cache (bool | str | PathLike): where to keep the probe results: True for the user's cache
            folder (``$FASTDATA_CACHE_DIR`` or ``~/.cache/fastdata``), a file path (e.g. beside the
            videos), or False for nowhere. Defaults to True.
        seed (int): seeds :meth:`sampler`, random clip starts and ``stagger``. Defaults to 0.
        rank, world_size (int | None): Default to the detected ones.
        storage_options (dict | None): how to reach the store of ``s3://`` videos (``endpoint_url``,
            ``region_name``, credentials: :class:`~fastdata.storage.s3.S3Config` fields). Defaults to None
            (the AWS chain's).
        cache_dir (str | PathLike | None): the node-local cache folder remote videos are copied into.
            None: ``$FASTDATA_CACHE_DIR/remote`` when that variable is set, else fastdata's own cache
            folder. Defaults to None.
        cache_limit (int | str | None): the most bytes the cache may hold (``"50GB"``); None:
            ``$FASTDATA_CACHE_LIMIT``, else no limit for a ``cache_dir`` and half of the free disk for
            fastdata's own folder. Defaults to None.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        clip_len: int = 16,
        frame_stride: int = 1,
        clips_per_video: int | Literal["all"] = 1,
        clip_step: int | None = None,
        clip_sampling: ClipSampling = "random",
        size: Size | None = None,
        decoder: DecoderName | type[VideoReader] = "pyav",
        fallback: DecoderName | None = "pyav",
        stagger: tuple[float, float] = (0.0, 0.05),
        stagger_each_open: bool = False,
        max_open: int | None = 8,
        decode_threads: int = 1,
        decode_timeout: float | None = 60.0,
        on_error: OnError = "raise",
        transform: Callable[[dict[str, Any]], Any] | None = None,
        index_cache: bool | str | os.PathLike[str] = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        labels: Labels = "auto",
        storage_options: dict[str, Any] | None = None,
        cache_dir: CacheDir = None,
        cache_limit: int | str | None = None,
    ) -> None:
        _check_options(
            clip_len,
            frame_stride,
            clips_per_video,
            clip_step,
            clip_sampling,
            size,
            stagger,
            max_open,
            decode_threads,
            decode_timeout,
        )
        if fallback is not None:
            check_choice("fallback", fallback, DecoderName)
        reader_class(decoder)  # an unknown name or a library that cannot load fails now, not in a worker
        sources = find_videos(paths, labels=labels, storage_options=storage_options)
        self.paths = sources.paths
        self.classes: list[str] = sources.classes  # label k is classes[k]; empty without class folders
        self.labels: list[int] = sources.labels  # each video's label (empty without class folders)
        remote = sources.remote
        counters: tuple[str, ...] = ("timeouts", "reads", "fallbacks", "fallback_reads")
        if remote:
            from fastdata.storage.s3 import COUNTERS as S3_COUNTERS

            counters = (*counters, *S3_COUNTERS, *CACHE_COUNTERS)
        self._init_base(seed=seed, on_error=on_error, rank=rank, world_size=world_size, counters=counters)
        self.remote: RemoteVideos | None = None
        if remote:
            cache = video_cache(cache_dir, cache_limit, remote[0])
            cache.count_into(self._shared)
            self.remote = RemoteVideos(cache, remote[0], dict(storage_options or {}), self._shared)
        self._listed = sources.sizes
        self._members = sources.members  # videos inside tar shards: (shard, offset, size)
        # the reader pool decodes (and times fetch and decode); the pipeline applies the transform
        self.pipeline = SamplePipeline(None, transform, self._policy)
        self.clip_len, self.frame_stride = clip_len, frame_stride
        self.span = (clip_len - 1) * frame_stride + 1
        self.clips_per_video = clips_per_video
        self.clip_step = clip_step or clip_len * frame_stride
        self.clip_sampling = clip_sampling
        self._clip_starts = ClipStarts(seed, clips_per_video, self.clip_step, clip_sampling)
        self.stagger = stagger
        decoder_key = decoder if isinstance(decoder, str) else f"{decoder.__module__}.{decoder.__qualname__}"
        if fallback is not None and fallback != decoder:
            decoder_key += f", fallback {fallback}"  # an index entry may name the fallback as its decoder
        self.decoder, self.fallback = decoder, fallback
        self.pool = ReaderPool(
            decoder,
            threads=decode_threads,
            size=size,
            max_open=max_open,
            timeout=decode_timeout,
            before_open=_OpenStagger(seed, self.rank, *stagger) if stagger_each_open and stagger[1] > 0 else None,
            fallback=fallback,
            on_fallback=self._fell_back,
            locate=self._locate if self.remote is not None or self._members else None,
        )
        self.metas = self._index(index_cache, decoder_key)
        self._starts = [0, *accumulate(self._clip_count(m) for m in self.metas)]
        if not len(self):
            raise BadSample(
                f"none of the {len(self.paths)} videos holds a clip of {self.span} frames (see the warnings above)",
                self.paths[0],
            )
        self._stagger_pid = -1
        self.stagger_delay = 0.0  # the delay this process waited before its first read, seconds

    @property
    def transform(self) -> Callable[[dict[str, Any]], Any] | None:
        """The user's function applied to each clip's sample dict (may be replaced)."""
        return self.pipeline.transform

    @transform.setter
    def transform(self, transform: Callable[[dict[str, Any]], Any] | None) -> None:
        self.pipeline.transform = transform

    # -- construction ----------------------------------------------------------------------------

    def _index(self, index_cache: bool | str | os.PathLike[str], decoder_key: str) -> list[VideoMeta | None]:
        if index_cache is True:
            file: Path | None = default_index_file(self.paths, decoder_key)
        else:
            file = Path(index_cache) if index_cache else None
        self.index = VideoIndex(file, decoder_key)
        try:
            outcomes = self.index.build(self.paths, self.pool.probe, stat=self._stat)
        finally:
            self.pool.close()  # no reader left open in the parent before a fork
        metas: list[VideoMeta | None] = []
        for path in self.paths:
            outcome = outcomes[path]
            if isinstance(outcome, VideoMeta):
                if self._clip_count(outcome):
                    metas.append(outcome)
                    continue
                outcome = VideoTooShort(
                    f"{path}: {outcome.frames} frames, fewer than one clip spans ((clip_len - 1) * frame_stride "
                    f"+ 1 = {self.span}); lower clip_len or frame_stride, or leave the video out",
                    path,
                )
            if isinstance(outcome, DecodeTimeout):
                self._shared.add("timeouts")
            self._policy.handle(outcome)  # raises under "raise"; counts one skip per video under "skip"
            metas.append(None)
        self.pool.metas = {p: m for p, m in zip(self.paths, metas) if m is not None}
        fallen = [p for p, m in self.pool.metas.items() if "decoder" in m.extra]
        if fallen:
            self._shared.add("fallbacks", len(fallen))
            why = self.pool.metas[fallen[0]].extra.get("refused", "")
            warnings.warn(
                f"{len(fallen)} of {len(self.paths)} videos are read with decoder={self.fallback!r} (the fallback): "
                f"decoder={self.decoder!r} cannot read them exactly (first: {why}); pass fallback=None to leave "
                "them out instead",
                DecoderFallbackWarning,
                stacklevel=3,
            )
        return metas

    def _stat(self, path: str) -> Any:
        """A video's state for the index (size and time; for a remote one, see RemoteVideos.stat; for one in
        a shard, its size and the shard's time)."""
        member = self._members.get(path)
        if member is not None:
            return SimpleNamespace(st_size=member[2], st_mtime_ns=os.stat(member[0]).st_mtime_ns)
        if self.remote is not None and "://" in path:
            return self.remote.stat(path, self._listed.get(path))
        return os.stat(path)

    def _locate(self, path: str) -> tuple[str, Callable[[], None] | None]:
        """What the decoder opens for ``path``: a byte range of its shard, a remote video's cached copy, or
        the path itself."""
        member = self._members.get(path)
        if member is not None:
            return subfile(member), None
        if self.remote is not None and "://" in path:
            return self.remote.locate(path)
        return path, None

    @property
    def fallback_videos(self) -> list[str]:
        """Videos read by the fallback decoder, found when they were probed (at construction)."""
        return [p for p, m in self.pool.metas.items() if "decoder" in m.extra]

    def _fell_back(self, path: str, refusal: VideoUnsupported) -> None:
        """A clip of ``path`` that the decoder refused is read by the fallback: count it, and say so."""
        if not is_collecting():  # a substitute search's reads are not part of the epoch: not counted
            self._shared.add("fallback_reads")
        warnings.warn(
            f"{path}: a clip is read with decoder={self.fallback!r} (the fallback): {refusal}",
            DecoderFallbackWarning,
            stacklevel=2,
        )

    def _clip_count(self, meta: VideoMeta | None) -> int:
        if meta is None or meta.frames < self.span:
            return 0
        if self.clips_per_video == "all":
            return (meta.frames - self.span) // self.clip_step + 1
        return int(self.clips_per_video)

    # -- reading ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._starts[-1]

    def locate(self, i: int) -> tuple[int, int]:
        """``(video number, clip number in that video)`` of dataset index ``i``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for {n} clips")
        i %= n
        video = int(np.searchsorted(self._starts, i, side="right")) - 1
        return video, i - self._starts[video]

    def clip_start(self, video: int, clip: int) -> int:
        """The first frame of clip ``clip`` of video ``video`` in the current epoch."""
        meta = self.metas[video]
        assert meta is not None
        return self._clip_starts.start(self.epoch, video, clip, meta.frames - self.span)

    def frames_of(self, i: int) -> tuple[int, list[int]]:
        """``(video number, frame numbers)`` of dataset index ``i`` in the current epoch."""
        video, clip = self.locate(i)
        start = self.clip_start(video, clip)
        return video, list(range(start, start + self.span, self.frame_stride))

    def _epoch_randomness(self) -> str | None:
        return f"the choice of clip starts (clip_sampling={self.clip_sampling!r})" if self._clip_starts.random else None

    def _begin(self, reads: int = 0) -> None:
        self.follow_epoch()
        if reads:
            self._count_reads(reads)
        if self._stagger_pid != process.pid():
            self._stagger_pid = process.pid()
            world = self.worker_world()
            if world.total_workers > 1:
                self.stagger_delay = stagger(world, *self.stagger)

    def _read(self, indices: Sequence[int], *, count: bool = True) -> list[Any]:
        """The clips ``indices``, each finished or :data:`SKIP` (bad: handled by the policy). ``count``: count
        them as reads (a substitute search's are not: they are not part of the epoch's plan)."""
        self._begin(len(indices) if count else 0)
        plan = [self.frames_of(i) for i in indices]
        out: list[Any] = [SKIP] * len(plan)
        pipeline = self.pipeline
        # video by video, clips in frame order: a reader moving forward through a file need not seek
        order = sorted(range(len(plan)), key=lambda k: (plan[k][0], plan[k][1][0]))
        for n, k in enumerate(order):
            video, frames = plan[k]
            path = self.paths[video]
            after = plan[order[n + 1]] if n + 1 < len(order) else None
            reads_on = after is not None and after[0] == video and after[1][0] > frames[-1]
            try:
                clip = self.pool.read(path, frames, pause=not reads_on)
            except (BadSample, SourceNotFound, SourceUnreadable) as e:
                if isinstance(e, DecodeTimeout) and not is_collecting():  # a substitute search's: not counted
                    self._shared.add("timeouts")
                self._policy.handle(e)
                continue
            sample = {
                "clip": torch.from_numpy(clip),
                "video": video,
                "path": path,
                "frames": torch.tensor(frames, dtype=torch.int64),
                "fps": self.metas[video].fps,  # type: ignore[union-attr]
            }
            if self.labels:
                sample["label"] = self.labels[video]
            out[k], _ = pipeline(sample, stages.clock())  # 0.0 unless `fastdata bench` probes
        return out

    def __getitem__(self, i: int) -> Any:
        got = self._read([i])[0]
        return got if got is not SKIP else self._substitute([i])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch's samples; skipped bad ones are left out (the DataLoader calls this to batch), and a batch
        of only bad ones is a batch of one substitute."""
        got = [s for s in self._read(indices) if s is not SKIP]
        if not got and indices:
            return [self._substitute(indices)]
        return got

    def _substitute(self, indices: Sequence[int]) -> Any:
        """The substitute for the bad clips ``indices`` (see :meth:`DatasetBase._stand_in`)."""
        bad = [i % len(self) for i in indices]
        sources = [self.paths[v] for v in dict.fromkeys(self.locate(i)[0] for i in bad)]

        def good(candidates: list[int]) -> list[tuple[int, Any]]:
            return [(j, s) for j, s in zip(candidates, self._read(candidates, count=False)) if s is not SKIP]

        return self._stand_in(bad, good, sources)[1]

    def clip_sampler(
        self,
        batch_size: int,
        *,
        num_workers: int = 1,
        run: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        remainder: Remainder = "drop",
    ) -> ClipBatchSampler:
        """A rank-aware, resumable :class:`~fastdata.loading.ClipBatchSampler` that follows this
        dataset's ``set_epoch``: batches laid out so that each of ``num_workers`` DataLoader workers reads
        its videos forward, one after the other, while the workers read different files. Pass it as
        ``fd.Loader(ds, batch_sampler=ds.clip_sampler(64, num_workers=4), num_workers=4)``.

        Args:
            batch_size (int): clips per batch (a multiple of ``run``).
            num_workers (int): the workers the layout is made for (any count reads the same batches; this
                one reads them with the fewest seeks). Defaults to 1.
            run (int | None): clips of one video in a row in a batch: each batch draws from
                ``batch_size / run`` videos, and a worker keeps as many open (keep ``max_open`` at least that).
                Defaults to 2 (1 for an odd ``batch_size``).
            shuffle, drop_last, remainder: as for :meth:`sampler`.
        """
        counts = np.diff(self._starts)

        def clip_starts() -> list[int]:  # this epoch's first frame of every clip, by dataset index
            return [self.clip_start(v, c) for v, k in enumerate(counts) for c in range(int(k))]

        return ClipBatchSampler(
            self._starts[:-1],
            len(self),
            batch_size,
            clip_starts=clip_starts,
            lanes=num_workers,
            run=run,
            shuffle=shuffle,
            seed=self.seed,
            drop_last=drop_last,
            remainder=remainder,
            rank=self.rank,
            world_size=self.world_size,
            shared=self._shared,
        )

    def warm(self) -> None:
        """Called by ``worker_init_fn``: wait this worker's stagger delay before the first batch."""
        self._begin()

    @property
    def open_readers(self) -> int:
        """Readers open now in this process (at most ``max_open``)."""
        return self.pool.open_count

    def close(self) -> None:
        self.pool.close()

    def __repr__(self) -> str:
        return (
            f"VideoClipDataset({len(self.paths)} videos, {len(self)} clips of {self.clip_len} frames, "
            f"stride {self.frame_stride}, decoder={self.decoder!r})"
        )


def _check_options(
    clip_len: int,
    frame_stride: int,
    clips_per_video: int | str,
    clip_step: int | None,
    clip_sampling: str,
    size: Size | None,
    stagger: tuple[float, float],
    max_open: int | None,
    decode_threads: int,
    decode_timeout: float | None,
) -> None:
    for name, value in (("clip_len", clip_len), ("frame_stride", frame_stride), ("decode_threads", decode_threads)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be an int >= 1")
    if clips_per_video != "all" and (not isinstance(clips_per_video, int) or clips_per_video < 1):
        raise ConfigError(f"clips_per_video={clips_per_video!r} must be an int >= 1 or 'all'")
    if clip_step is not None and (not isinstance(clip_step, int) or clip_step < 1):
        raise ConfigError(f"clip_step={clip_step!r} must be an int >= 1 or None")
    check_choice("clip_sampling", clip_sampling, ClipSampling)
    if size is not None and (len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size)):
        raise ConfigError(f"size={size!r} must be (height, width) in pixels, or None")
    if len(stagger) != 2 or not 0 <= stagger[0] <= stagger[1]:
        raise ConfigError(f"stagger={stagger!r} must be (low, high) seconds with 0 <= low <= high")
    if max_open is not None and max_open < 1:
        raise ConfigError(f"max_open={max_open!r} must be >= 1 or None")
    if decode_timeout is not None and not decode_timeout > 0:
        raise ConfigError(f"decode_timeout={decode_timeout!r} must be > 0 seconds, or None to disable the watchdog")
