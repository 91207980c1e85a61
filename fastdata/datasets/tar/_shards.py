"""``TarShardDataset``: WebDataset-format tar shards, streamed by every worker of every rank."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from fastdata.core import SKIP, process
from fastdata.core.epoch import (
    Remainder,
    Stop,
    WindowShuffle,
    World,
    epoch_order,
    rank_span,
    split_counts,
    worker_ranges,
)
from fastdata.core.errors import ConfigError, EgressWarning, OnError, PlanError, check_choice, check_positive
from fastdata.core.process import EGRESS_FLAG
from fastdata.datasets._base import DatasetBase
from fastdata.datasets._substitute import find_substitute
from fastdata.datasets.tar._elastic import read_tail
from fastdata.datasets.tar._epoch_reader import (
    DEFAULT_WINDOW,
    DEFAULT_WINDOW_BYTES,
    LOCAL_CHUNK,
    Ahead,
    EpochReader,
    WindowWarning,
    by_window,
    window_order,
    window_size,
    worker_span,
)
from fastdata.datasets.tar._resume import TarResume
from fastdata.datasets.tar._source import Sample, TarSource, choose_cache, remote_counters, tar_urls
from fastdata.datasets.tar._stream import stream_epoch, warm_client
from fastdata.formats import DecodeMode, Decoder, FieldSpec, make_decoder, with_fields
from fastdata.loading.transport import batch_default_collate, slot_samples, stacking
from fastdata.storage import scheme
from fastdata.storage.cache import CacheCheck, CacheDir

NOT_PLANNED = "a TarShardDataset(stream=True) counts no samples and plans no positions, so it"


class TarShardDataset(TarResume, DatasetBase, IterableDataset[Any]):
    """Samples of WebDataset-format tar shards, each exactly once per epoch across ranks and workers.

    Every rank reads an equal, contiguous part of the epoch (shards in a seeded order, then samples);
    samples are shuffled within windows of ``shuffle_window`` samples and at most ``shuffle_bytes`` of
    shard bytes; each worker reads its own part. A window's samples are read undecoded and each is decoded
    as it leaves the window, so a worker holds at most one window of raw bytes (remote shards: a window
    fetched shard by shard in few ranged GETs, the next one fetched while the second half of the current one
    is used) and a batch of decoded samples. See :mod:`fastdata.datasets.tar`. Shards are indexed (from
    ``manifest.json`` and ``.idx`` files written by ``fastdata convert``, or by scanning their headers), so
    shards may be fewer than workers and any worker can start mid-shard.

    With ``batch_size``, the dataset yields whole batches (use ``DataLoader(ds, batch_size=None)``): each
    rank then sees the same batches in the same order for any ``num_workers``, a skipped bad sample
    makes one batch smaller instead of shifting all later ones (a batch of only bad samples becomes a
    batch of one substitute: the next good sample after it in this rank's plan order, counted in
    :attr:`substituted`; see :mod:`fastdata.datasets`), and ``state_dict``/``load_state_dict``
    resume mid-epoch exactly: through :class:`fastdata.Loader` with any ``num_workers``, or through
    torchdata's ``StatefulDataLoader`` with the same ``num_workers`` (see docs/distributed.md).

    Args:
        urls (str | list[str]): shard paths or URLs; brace ranges (``train-{000000..000099}.tar``) and
            globs expand; a folder (``"shards/train"``, ``"s3://bucket/train/"``) is read through the
            ``manifest.json`` that ``fastdata convert`` wrote in it (a local folder without one: its
            ``.tar`` files).
        shuffle (bool): new shard order and sample order every epoch, from (seed, epoch). Defaults to False.
        seed (int): Defaults to 0.
        shuffle_window (int | None): samples shuffled together (a window of the rank's part of the epoch,
            per-sample mode: of each worker's part). Defaults to None: 4096.
        shuffle_bytes (int | None): the most shard bytes a window may span, in bytes: the window is cut to
            ``shuffle_bytes`` divided by the shards' bytes per sample (the largest mean of any shard).
            None: no bound but ``shuffle_window``. Defaults to 64 MiB.
        batch_size (int | None): yield batches of this size, collated by ``collate_fn``. Defaults to None
            (yield samples; the order then depends on ``num_workers``). On remote shards, each of ``n``
            workers fetches the windows that hold its batches: ``min(n, window / batch_size)`` times the
            shards' bytes per epoch (warned); per-sample mode fetches them once.
        collate_fn (Callable | None): Defaults to ``torch.utils.data.default_collate`` (precisely
            :func:`fastdata.loading.transport.batch_default_collate`, which is ``default_collate`` except
            that in a worker whose batches go through reused slots it stacks straight into the slot).
        drop_last (bool): with ``batch_size``, drop the rank's last, smaller batch. Defaults to False.
        decode ("raw" | "pil" | "numpy" | "torch" | Decoder | Callable): Defaults to "raw" (bytes).
        fields (dict | str | None): keep these fields, each the first of its alternatives the sample has,
            under a name of its own: ``{"image": "jpg;jpeg;png;webp", "label": "cls"}`` (webdataset's
            ``"jpg;png"``), so that samples storing different extensions batch together; applied after
            ``decode``, before ``transform``. A sample with none of a field's alternatives is a bad sample
            (``on_error``). Defaults to None: every member, under its extension.
        transform (Callable | None): applied to each decoded sample dict.
        on_error ("raise" | "skip"): bad-input policy. Defaults to "raise".
        remainder ("drop" | "pad" | "uneven"): see :data:`fastdata.core.epoch.Remainder`. Defaults to "drop".
        rank, world_size (int | None): Default to the detected ones.
        max_open (int | None): shard readers open at once per worker. Defaults to
            ``default_max_open``.
        storage_options (dict | None): for ``s3://`` shards: ``endpoint_url``, credentials, retries ... (the
            fields of ``fastdata.storage.s3._client.S3Config``) and ``S3Reader`` options. Defaults to the
            environment's settings (``AWS_ENDPOINT_URL``, profiles).
        cache_dir (str | PathLike | False | None): a folder on this node where remote shards are kept whole,
            shared by every worker and rank on the node: each shard is downloaded once per node (and read
            from the local copy by every epoch that finds it there), the next shards of each worker's
            plan downloaded ahead. None: ``$FASTDATA_CACHE_DIR/remote`` when that variable is set, else no
            cache; False: no cache. Local shards are read where they are. See docs/s3.md. Defaults to None.
        cache_limit (int | str | None): the most bytes the cache folder may hold (``"50GB"`` or bytes): the
            least recently used shards no reader on the node has open are deleted to keep under it. None:
            ``$FASTDATA_CACHE_LIMIT`` when set, else no limit. Defaults to None.
        cache_check ("epoch" | "build"): when a cached shard's version is asked of the store: once per epoch
            and node (a HEAD by the first process that opens it: one replaced between epochs is read as
            it is now), or once per node after the dataset was built (fewer requests; a replacement is
            seen by a dataset built later). Defaults to "epoch".
        stream (bool): read without an index or a count, as webdataset does: the epoch's shards (in a
            seeded order with ``shuffle``) dealt whole to every worker of every rank in turn, each fetched
            whole, once, and read in one pass, its samples shuffled through a buffer of ``shuffle_window``
            samples (cut to ``shuffle_bytes``), batched by each worker with ``batch_size``. For remote
            shards without ``.idx`` sidecars or a manifest and no cache (``cache_dir=False``, or none can be
            written): building the dataset fetches nothing and every epoch fetches each stored byte once
            (indexed, the first epoch fetches them twice: once to count the samples). Given up: ``len()``
            (raises ``TypeError``), ``state_dict()`` (raises ``ConfigError``), the same batches for any
            ``num_workers``, equal samples per rank (a rank reads its shards' samples: with DDP, stop each
            epoch at a fixed number of steps), use in :class:`fastdata.Mix` (it plans from the counts); not with
            ``cache_dir=``. :class:`fastdata.Loader` reads it as is (its batches, or batch_size= to batch its
            samples; no state_dict), as does torch's ``DataLoader``. Every sample is still read once per epoch.
            Defaults to False.
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_window: int | None = None,
        shuffle_bytes: int | None = DEFAULT_WINDOW_BYTES,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        decode: DecodeMode | Decoder | Callable[[Sample], Sample] = "raw",
        transform: Callable[[Sample], Any] | None = None,
        fields: FieldSpec | None = None,
        on_error: OnError = "raise",
        remainder: Remainder = "drop",
        rank: int | None = None,
        world_size: int | None = None,
        max_open: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: CacheDir = None,
        cache_limit: int | str | None = None,
        cache_check: CacheCheck = "epoch",
        stream: bool = False,
    ) -> None:
        if stream and cache_dir:
            raise ConfigError(
                f"TarShardDataset(stream=True, cache_dir={str(cache_dir)!r}): a streamed dataset fetches each shard "
                "once per epoch and keeps no copy; pass cache_dir= without stream=True (each shard fetched once per "
                "node, counted from the copy), or stream=True without cache_dir="
            )
        self.stream = stream
        if shuffle_window is not None:
            check_positive("shuffle_window", shuffle_window)
        if shuffle_bytes is not None:
            check_positive("shuffle_bytes", shuffle_bytes)
        if batch_size is not None:
            check_positive("batch_size", batch_size)
        check_choice("remainder", remainder, Remainder)
        shard_urls = tar_urls(urls, storage_options)
        cache = None if stream else choose_cache(cache_dir, cache_limit, shard_urls, storage_options)
        self._init_base(
            seed=seed,
            on_error=on_error,
            rank=rank,
            world_size=world_size,
            counters=remote_counters(shard_urls, cached=cache is not None),
        )
        if cache is not None:
            cache.count_into(self._shared)
        self.shuffle, self.shuffle_window = shuffle, shuffle_window or DEFAULT_WINDOW
        self.shuffle_bytes = shuffle_bytes
        self.batch_size, self.drop_last, self.remainder = batch_size, drop_last, remainder
        self.collate_fn = collate_fn or batch_default_collate
        # remote shards read from a node-local cache are read like local ones (from the local copy)
        self.remote = any(scheme(u) for u in shard_urls) and cache is None
        options = dict(storage_options or {})
        if self.remote:
            # windows are fetched whole when they are needed: nothing to guess ahead of that
            options.setdefault("follow_streams", False)
        self.source = TarSource(
            shard_urls,
            policy=self._policy,
            decoder=with_fields(fields, make_decoder(decode)),
            transform=transform,
            max_open=max_open,
            storage_options=options,
            stats=self._shared,
            dealt=batch_size is not None,
            streaming=True,
            cache=cache,
            cache_check=cache_check,
            counted=not stream,
        )
        self.stream_options = options
        self.total = -1 if stream else sum(self.source.counts)
        if stream:  # no plan: nothing counted, nothing to lay out over ranks
            self._reads = self.window = self.shuffle_window if shuffle else 1
            self._resume, self._progress = None, None
            warm_client(shard_urls, storage_options, self._shared)
            return
        # samples read together: shuffle_window cut to shuffle_bytes, also without shuffling (a remote
        # shard's part of a window is fetched whole)
        self._reads = window_size(self.shuffle_window, shuffle_bytes, self.source.counts, self.source.sizes)
        self.window = self._reads if shuffle else 1
        """Samples shuffled together: ``shuffle_window``, cut to ``shuffle_bytes`` (1 without shuffling)."""
        if shuffle and shuffle_window is not None and self.window < shuffle_window:
            warnings.warn(
                f"TarShardDataset: shuffle_window={shuffle_window} is cut to {self.window} samples, which span "
                f"shuffle_bytes={shuffle_bytes} bytes of these shards; raise shuffle_bytes (memory per worker) "
                "for a wider shuffle",
                WindowWarning,
                stacklevel=2,
            )
        self._rank_changed()
        # (epoch, batches, worker, num_workers, history): where the next pass starts; worker None = the whole
        # rank; history: the earlier layouts of an epoch resumed on another number of ranks (_tar_elastic)
        self._resume: tuple[int, int, int | None, int | None, tuple[Stop, ...]] | None = None
        # (pid, epoch, next batch, worker, num_workers, history) of this process's latest pass, for state_dict()
        self._progress: tuple[int, int, int, int, int, tuple[Stop, ...]] | None = None

    def _rank_changed(self) -> None:
        """This rank's span of the epoch, for the rank read now (at construction, or where it reads)."""
        if self.stream:
            return  # shards are dealt to ranks when each pass starts
        remainder = self.remainder
        self._span = rank_span(self.total, self.rank, self.world_size, remainder)
        # the last rank reads the fewest (remainder="uneven"): every rank refuses a plan that starves it
        fewest = rank_span(self.total, self.world_size - 1, self.world_size, remainder)[1]
        if self.batch_size is not None and self.drop_last and fewest < self.batch_size:
            raise PlanError(
                f"rank {self.world_size - 1} reads {fewest} samples per epoch, fewer than batch_size="
                f"{self.batch_size}, so drop_last=True leaves it no batch; use a smaller batch_size, "
                "fewer ranks, or drop_last=False"
            )

    @property
    def urls(self) -> list[str]:
        return self.source.urls

    def __len__(self) -> int:
        """Samples per epoch on this rank, or batches when ``batch_size`` is set (in an epoch resumed on another
        number of ranks and loaded, not yet read: the batches of its tail).

        Raises:
            TypeError: ``stream=True``: the samples are not counted."""
        if self.stream:
            raise TypeError(
                f"{self!r} has no len(): stream=True reads its shards without counting their samples; build it "
                "without stream=True for a length (the shards are counted from their .idx sidecars or manifest, "
                "or scanned), or write them once with 'fastdata inspect --write-manifest'"
            )
        self.follow_rank(use=False)
        resume = self._resume
        if resume is not None and resume[4] and resume[0] == self.epoch:
            return self.elastic_length(resume[4])
        n = self._span[1]
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the resume position is taken now, when the DataLoader (or its worker) asks
        # for the iterator, so it applies to exactly one pass.
        self.begin_pass()
        world = self.worker_world()
        if self.stream:
            streamed = stream_epoch(self, world)
            return slot_samples(streamed) if self.batch_size is None else streamed
        start, length = self._span
        if self.batch_size is not None and self.drop_last:
            length -= length % self.batch_size
        order = epoch_order(len(self.urls), shuffle=self.shuffle, seed=self.seed, epoch=world.epoch)
        epoch = EpochReader(self.source, start, length, split_counts(self.source.counts, order), order)
        if self.batch_size is None:  # batched by a DataLoader: its batches of bytes travel in slots
            return slot_samples(self._samples(world, epoch))
        resume = self._resume
        if resume is not None and resume[4] and resume[0] == world.epoch:  # an epoch resumed elsewhere
            self._resume = None
            self._progress = (
                process.pid(),
                world.epoch,
                resume[1] + world.worker,
                world.worker,
                world.num_workers,
                resume[4],
            )
            return read_tail(self, world, resume[4], resume[1] + world.worker, world.num_workers)
        first, stride, worker = self._first_batch(world)
        shuffled = WindowShuffle(length, self.window, seed=self.seed, epoch=world.epoch, rank=self.rank)
        self._progress = (process.pid(), world.epoch, first, world.worker, world.num_workers, ())
        if self.remote:
            self._warn_egress(world)
        return self._batches(world, epoch, shuffled, first, stride, worker)

    def _samples(self, world: World, epoch: EpochReader) -> Iterator[Any]:
        """Per-sample mode: this worker's contiguous range, a window at a time, each sample decoded as it
        leaves its window (see :mod:`fastdata.datasets.tar`)."""
        within = epoch.offsets[1:-1] - epoch.start  # where shards start, in this rank's part
        within = within[(within > 0) & (within < epoch.length)]
        lo, hi = worker_span(epoch.length, world.worker, world.num_workers, within)
        if self.source.cache is not None:  # the cache fills ahead in this worker's order of shards
            self.source.plan(epoch.shards_at(np.arange(lo, hi, dtype=np.int64)))
        windows = (self._window(w, min(hi, w + self._reads), world.epoch) for w in range(lo, hi, self._reads))
        if not self.remote:
            try:
                for positions in windows:
                    if self.window > 1:  # a shuffled window reads its shards in any order: keep them open
                        self.source.hold(epoch.shards_at(positions))
                    for c in range(0, len(positions), LOCAL_CHUNK):
                        chunk = positions[c : c + LOCAL_CHUNK]
                        yield from epoch.finish(epoch.raw(chunk), chunk)
            finally:
                self.source.close()
            return
        ahead = Ahead(epoch.raw, windows)
        try:
            for positions, raw in ahead:
                half = len(positions) // 2
                for n, sample in enumerate(epoch.finish(raw, positions)):
                    if n == half:
                        ahead.fetch_next()
                    yield sample
        finally:
            ahead.close()
            self.source.close()

    def _window(self, lo: int, hi: int, epoch: int) -> np.ndarray:
        """Positions ``lo .. hi-1`` in the order they are read (shuffled when shuffling)."""
        if self.window <= 1:
            return np.arange(lo, hi, dtype=np.int64)
        return window_order(lo, hi, seed=self.seed, epoch=epoch, rank=self.rank)

    def _batches(
        self, world: World, epoch: EpochReader, shuffled: WindowShuffle, first: int, stride: int, worker: int
    ) -> Iterator[Any]:
        unit = self.batch_size
        assert unit is not None
        # batch ``first + j * stride`` is this worker's j-th: worker_ranges deals units from ``first``
        # to slot ``worker`` of ``stride`` (slot 0 when ``first`` is already this worker's own)
        base = (first - worker) * unit
        ranges = list(worker_ranges(epoch.length, worker=worker, num_workers=stride, unit=unit, start=base))
        if self.source.cache is not None and ranges:  # the cache fills ahead in this worker's order of shards
            self.source.plan(epoch.shards_at(np.concatenate([shuffled.positions(lo, hi) for lo, hi in ranges])))
        mine = ((lo, hi, shuffled.positions(lo, hi)) for lo, hi in ranges)
        ahead = None
        try:
            if not self.remote:
                # members that go straight into a worker's slot untouched (no decoder, transform or collate
                # of the user's in between) are read as views of the shard: the slot's copy is then the
                # only one (a bytes object per member first cost as much again; see read_views)
                untouched = self.source.pipeline.passthrough and self.collate_fn is batch_default_collate
                held: tuple[int, int] | None = None
                for lo, hi, positions in mine:
                    if self.window > 1 and held != (lo // self.window, (hi - 1) // self.window):
                        # the shards of the window(s) the batch is drawn from: kept open while they are read
                        held = (lo // self.window, (hi - 1) // self.window)
                        span = np.arange(held[0] * self.window, min(epoch.length, (held[1] + 1) * self.window))
                        self.source.hold(epoch.shards_at(span))
                    batch = epoch.decoded(positions, views=untouched and stacking())
                    if not batch:
                        batch = [self._stand_in_batch(epoch, shuffled, lo, hi, positions)]
                    yield self._batch(world, (lo, hi, stride), batch)
                return
            # remote: this worker's batches that start in one window are fetched together, shard by shard;
            # unshuffled batches dealt to several workers, one by one (fetched together, the runs of the other
            # workers' batches between them would be fetched too)
            together = self._reads if self.shuffle or stride == 1 else unit
            ahead = Ahead(epoch.raw_group, by_window(mine, together))
            pipeline = self.source.pipeline
            for group, raw in ahead:
                for n, (lo, hi, positions) in enumerate(group):
                    if n == len(group) // 2:
                        ahead.fetch_next()
                    samples = [raw.pop(p) for p in positions.tolist() if p in raw]
                    batch = pipeline.batch(samples)
                    if not batch:
                        ahead.settle()  # the window thread reads through the same readers: let it finish
                        batch = [self._stand_in_batch(epoch, shuffled, lo, hi, positions)]
                    yield self._batch(world, (lo, hi, stride), batch)
        finally:
            if ahead is not None:
                ahead.close()
            self.source.close()

    def _batch(self, world: World, where: tuple[int, int, int], batch: list[Any]) -> Any:
        """The collated ``batch`` of positions ``lo .. hi-1`` (``where``: lo, hi, stride); notes the position
        reached first."""
        lo, _, stride = where
        unit = self.batch_size
        assert unit is not None
        # counted before the yield, so that a state taken right after this batch resumes past it
        self._progress = (process.pid(), world.epoch, lo // unit + stride, world.worker, world.num_workers, ())
        return self.collate_fn(batch)

    def _stand_in_batch(
        self, epoch: EpochReader, shuffled: WindowShuffle, lo: int, hi: int, positions: np.ndarray
    ) -> Any:
        """The substitute for batch ``lo .. hi-1``, whose samples were all bad: leaving the batch out would
        give this rank fewer batches than the others (a hang at the next collective) and shift every later
        batch (a wrong resume). The next good sample after it in this rank's plan order: the span
        positions ``hi, hi+1 ...``, wrapping to ``0 .. lo-1`` (see :mod:`fastdata.datasets`)."""
        unit = self.batch_size
        assert unit is not None
        shards = epoch.shards_at(positions)
        pipeline = self.source.pipeline

        def good(slots: list[int]) -> list[tuple[int, Any]]:
            where = np.concatenate([shuffled.positions(s, s + 1) for s in slots])
            raw = epoch.raw(where)
            for slot, p in zip(slots, where.tolist()):
                if p in raw:
                    sample, _ = pipeline(raw[p])
                    if sample is not SKIP:
                        return [(slot, sample)]  # the first good one: the rest need no decoding
            return []

        return find_substitute(
            good,
            chain(range(hi, epoch.length), range(lo)),
            shared=self._shared,
            owner=repr(self),
            bad=f"every sample of batch {lo // unit} ({hi - lo} samples, from {', '.join(shards)})",
            order="this rank's plan order",
            unit="position",
            sources=shards,
        )[1]

    def _warn_egress(self, world: World) -> None:
        """Batched mode on remote shards: every worker reads the windows that hold its batches, so with
        ``n`` workers and windows of ``k`` batches each byte is fetched ``min(n, k)`` times; say so once."""
        unit = self.batch_size
        assert unit is not None
        times = min(world.num_workers, -(-self.window // unit))
        if times > 1 and world.worker == 0 and self._shared.once(EGRESS_FLAG):
            warnings.warn(
                f"{self!r}: with {world.num_workers} workers, each fetches the windows of "
                f"{self.window} samples that hold its batches of {unit}: about {times}x the shards' bytes "
                "are fetched per epoch. To fetch each byte once, pass cache_dir= (a folder on this node: "
                "each shard is fetched once, every worker reads the local copy), or read per sample "
                "(batch_size=None, the DataLoader batching), or shuffle within batches "
                "(shuffle_window=batch_size), or stream the shards (stream=True: each fetched once, each worker "
                "batching its own; no len() or resume position), or use fewer workers",
                EgressWarning,
                stacklevel=3,
            )

    def _epoch_randomness(self) -> str | None:
        return "the order of shards and samples (shuffle=True)" if self.shuffle else None

    def whole_pass(self, seed: int, epoch: int) -> tuple[EpochReader, WindowShuffle]:
        """The reader of pass ``epoch`` over every shard, as one rank alone would read it, and the window
        shuffle of its ``total`` positions (what :class:`fastdata.Mix` draws a tar source through)."""
        order = epoch_order(len(self.urls), shuffle=self.shuffle, seed=seed, epoch=epoch)
        if self.stream:
            raise ConfigError(f"{self!r}: {NOT_PLANNED} cannot be drawn from by position (fastdata.Mix)")
        reader = EpochReader(self.source, 0, self.total, split_counts(self.source.counts, order), order)
        return reader, WindowShuffle(self.total, self.window, seed=seed, epoch=epoch, rank=0)

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        if self.stream:
            raise ConfigError(
                f"{self!r}: {NOT_PLANNED} has no resume position; build it without stream=True to save and "
                "resume a position (the shards are then counted first)"
            )
        return super().state_dict(batches)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.stream:
            self.state_dict()  # the same refusal
        super().load_state_dict(state)

    def close(self) -> None:
        self.source.close()

    def __repr__(self) -> str:
        if self.stream:
            return (
                f"TarShardDataset({len(self.urls)} shards, streamed, shuffle={self.shuffle}, "
                f"batch_size={self.batch_size})"
            )
        return (
            f"TarShardDataset({len(self.urls)} shards, {self.total} samples, rank {self.rank}/"
            f"{self.world_size}, shuffle={self.shuffle}, batch_size={self.batch_size})"
        )
