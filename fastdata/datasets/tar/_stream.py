"""``TarShardDataset(stream=True)``: each shard fetched whole, once, and read in one pass, without an index or a
sample count (webdataset's way of reading shards that have no sidecar).

Why a mode of its own: the plan of an indexed epoch (which samples each rank and worker reads, ``len()``, a
resume position at any batch) needs every shard's sample count before the first sample is read. Shards with no
``.idx`` sidecar and no manifest are counted by scanning them, and with no cache to keep the scanned copy
(``cache_dir=False``, or a machine where none can be written) the scan's bytes are fetched again by the epoch:
about twice the stored bytes in the first epoch. webdataset, litdata and MosaicML streaming each make the same
choice: litdata and streaming require an index written with the shards, webdataset streams without one and
has no length. Streamed, the first epoch fetches each stored byte once, like every later one.

What is given up, and said where it is asked for: ``len()`` (a ``TypeError`` naming the fix), a resume
position (``state_dict`` raises a ``ConfigError``), the same batches for any ``num_workers`` (each worker
batches its own shards), equal samples per rank (shards are dealt whole: ranks whose shards hold more samples
read more), and :class:`fastdata.Mix` (which draws by position). Every sample of every shard is still read
exactly once per epoch across ranks and workers; a bad sample or a missing shard goes to ``on_error``.

Memory: each worker holds one shard's bytes while it reads it, and the shuffle buffer (``shuffle_window``
samples, cut to ``shuffle_bytes``) of raw samples, each decoded as it leaves the buffer.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from fastdata.core import SKIP
from fastdata.core.epoch import World, epoch_order
from fastdata.core.errors import SourceNotFound, SourceUnavailable, SourceUnreadable
from fastdata.core.process import EGRESS_FLAG
from fastdata.formats.tar import CompressedShard, compression_of, read_samples, scan
from fastdata.storage import is_remote, open_reader, open_remote, scheme

OPEN_BYTES = 8 * 1024 * 1024  # a remote shard's bytes fetched by the request that opens it
SHARD_OPENS = "shard_opens"  # (the counter of fastdata.datasets.tar's TarSource: one per shard fetched)


class MemoryShard:
    """A shard's bytes, fetched whole, read as a storage reader: scanned, then its samples read, from memory."""

    def __init__(self, url: str, data: bytes) -> None:
        self.url, self.size, self._data = url, len(data), data

    def buffer(self) -> memoryview:
        return memoryview(self._data)

    def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        data = self._data
        return [data[o : o + n] for o, n in ranges]

    def close(self) -> None:
        self._data = b""


def fetch_whole(url: str, options: dict[str, Any], stats: Any) -> Any:
    """Shard ``url``'s bytes, fetched in one read (a local shard: read from disk), as a reader; a compressed
    shard (gzip, xz, bzip2, zstd) decompressed."""
    if not scheme(url):
        reader = open_reader(url)
        try:
            data = reader.read(0, reader.size)
        finally:
            reader.close()
    else:
        # the GET that opens the object brings its first OPEN_BYTES: read them from there, then the rest (a
        # read of the whole object at once fetched those bytes again: 1.28x on 680 KB shards)
        reader = open_reader(url, stats=stats, **{**options, "open_bytes": OPEN_BYTES})
        try:
            head = reader.read(0, min(reader.size, OPEN_BYTES))
            data = head + reader.read(len(head), reader.size - len(head)) if reader.size > len(head) else head
        finally:
            reader.close()
    if stats is not None and SHARD_OPENS in getattr(stats, "counters", ()):
        stats.add(SHARD_OPENS)
    shard: Any = MemoryShard(url, data)
    packed = compression_of(shard)
    return CompressedShard(shard, packed) if packed is not None else shard


def warm_client(urls: list[str], options: dict[str, Any] | None, stats: Any) -> None:
    """Ask the store for the first remote shard's size (a HEAD, no bytes), in the process that builds the
    dataset: the store's client is then built here, its models loaded (0.5-3 s cold, in every worker of every
    epoch otherwise: forked workers inherit them warm), and wrong credentials or endpoint fail here, once. A
    missing shard is left to ``on_error`` when it is read."""
    first = next((u for u in urls if is_remote(u)), None)
    if first is None:
        return
    try:
        open_remote(first, stats, **dict(options or {})).stat(first)
    except SourceNotFound:
        pass


def my_shards(n: int, world: World, shuffle: bool) -> list[int]:
    """The shards this (rank, worker) reads in ``world``'s epoch: the epoch's order of the ``n`` shards (seeded
    from (seed, epoch) when shuffling), dealt in turn to every worker of every rank."""
    order = epoch_order(n, shuffle=shuffle, seed=world.seed, epoch=world.epoch)
    readers = world.world_size * world.num_workers
    me = world.rank * world.num_workers + world.worker
    return [int(s) for s in order[me::readers]]


def raw_stream(ds: Any, shards: list[int]) -> Iterator[dict[str, Any]]:
    """The raw samples of ``shards`` of ``ds`` (a streamed ``TarShardDataset``), shard after shard, in file
    order; a bad sample, or a shard that cannot be read, handed to the dataset's ``on_error``."""
    source = ds.source
    policy = source.policy
    urls = [source.urls[s] for s in shards]
    # the next shard is fetched while this one is read: a worker holds two shards' bytes at most
    pool = ThreadPoolExecutor(1, thread_name_prefix="fastdata-stream")
    ahead: Future[Any] | None = None
    try:
        options, stats = ds.stream_options, source._stats
        for n, url in enumerate(urls):
            got = ahead or pool.submit(fetch_whole, url, options, stats)
            ahead = pool.submit(fetch_whole, urls[n + 1], options, stats) if n + 1 < len(urls) else None
            try:
                shard = got.result()
            except (SourceNotFound, SourceUnreadable, SourceUnavailable) as e:
                policy.handle(e)  # raised, or counted as one skipped sample (its count is unknown) and warned
                continue
            yield from _samples(shard, policy)
    finally:
        if ahead is not None:
            ahead.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def _samples(shard: Any, policy: Any) -> Iterator[dict[str, Any]]:
    """The good samples of a shard held in memory, in file order; its bad ones handed to ``policy``."""
    index = scan(shard)
    good: list[int] = []
    for i in range(len(index.keys)):
        problem = index.error_at(i) if index.bad else None
        if problem is None:
            good.append(i)
        else:
            policy.handle(problem)
    yield from read_samples(shard, index, good)
    shard.close()


def shuffled(samples: Iterator[dict[str, Any]], window: int, shuffle_bytes: int | None, rng: Any) -> Iterator[Any]:
    """``samples`` through a shuffle buffer of at most ``window`` samples and ``shuffle_bytes`` of their
    members' bytes (at least one sample): once full, each new sample takes the place of one drawn at random."""
    buffer: list[dict[str, Any]] = []
    held = 0
    for sample in samples:
        buffer.append(sample)
        held += _nbytes(sample)
        while len(buffer) > 1 and (len(buffer) > window or (shuffle_bytes is not None and held > shuffle_bytes)):
            k = int(rng.integers(len(buffer)))
            buffer[k], buffer[-1] = buffer[-1], buffer[k]
            out = buffer.pop()
            held -= _nbytes(out)
            yield out
    while buffer:
        k = int(rng.integers(len(buffer)))
        buffer[k], buffer[-1] = buffer[-1], buffer[k]
        yield buffer.pop()


def _nbytes(sample: dict[str, Any]) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__") and isinstance(v, (bytes, bytearray)))


def stream_epoch(ds: Any, world: World) -> Iterator[Any]:
    """This worker's part of a streamed epoch: its shards' samples, shuffled through a buffer (with
    ``ds.shuffle``), decoded as they leave it; batched with ``ds.batch_size`` (the worker's last batch smaller,
    or dropped with ``drop_last``)."""
    n = len(ds.source.urls)
    # (the flag of the EgressWarning, which a streamed dataset never raises: each byte is fetched once)
    readers = world.world_size * world.num_workers
    if n < readers and world.worker == 0 and world.rank == 0 and ds._shared.once(EGRESS_FLAG):
        warnings.warn(
            f"{ds!r}: {n} shards for {world.world_size} rank(s) x {world.num_workers or 1} worker(s): streamed "
            "shards are dealt whole, so some workers read nothing; use fewer workers, or more, smaller shards",
            stacklevel=3,
        )
    raw = raw_stream(ds, my_shards(n, world, ds.shuffle))
    if ds.shuffle and ds.shuffle_window > 1:
        rng = np.random.default_rng([world.seed, world.epoch, world.rank, world.worker])
        raw = shuffled(raw, ds.shuffle_window, ds.shuffle_bytes, rng)
    pipeline = ds.source.pipeline
    try:
        if ds.batch_size is None:
            for sample in raw:
                done, _ = pipeline(sample)
                if done is not SKIP:
                    yield done
            return
        batch: list[Any] = []
        for sample in raw:
            done, _ = pipeline(sample)
            if done is SKIP:
                continue
            batch.append(done)
            if len(batch) == ds.batch_size:
                yield ds.collate_fn(batch)
                batch = []
        if batch and not ds.drop_last:
            yield ds.collate_fn(batch)
    finally:
        ds.source.close()


__all__ = ["MemoryShard", "fetch_whole", "my_shards", "shuffled", "stream_epoch"]
