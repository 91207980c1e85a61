"""``s3://bucket/key``: random access to one object through ranged GETs, as a storage reader.

The tar reader asks for bytes in two patterns, and both must become few, large GETs:

* small sequential reads (the header scan reads 512 bytes per member): served from *windows* fetched
  with read-ahead (``readahead`` bytes per GET); a reader moving forward through a window has the next
  one fetched in the background;
* many ranges at once (``read_ranges``: the members of a batch of samples): ranges closer than
  ``coalesce_gap`` are merged into one GET, long spans are split into ``part_size`` GETs issued in
  parallel on this process's thread pool, and when calls move forward with a steady stride (a shard
  streamed in order by one worker, or every n-th batch of it by one of n workers), the stretches the
  next two calls will want are fetched while the caller decodes this one.

Opening costs one GET, not a HEAD and a GET: the first ``open_bytes`` of the object come with its size,
so a ``manifest.json`` or a ``.idx`` sidecar is read in a single request, and opening a ``.tar`` shard
starts the GET of its sidecar at the same time. Every later GET is pinned to the object's ETag, so an
object rewritten mid-read fails with :class:`ObjectChanged` instead of mixing two versions. The client,
retries and counters are described in :mod:`fastdata.storage.s3`; the resumption of broken
bodies in :mod:`fastdata.storage.s3`; fetched windows in :mod:`fastdata.storage.s3`;
single-file uploads in :mod:`fastdata.storage.s3`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any

from fastdata.core import process
from fastdata.core.errors import ConfigError, SourceUnreadable, check_positive
from fastdata.core.process import HandleCache
from fastdata.storage.s3._client import (
    MiB,
    S3Config,
    Stats,
    error_code,
    parse_url,
)
from fastdata.storage.s3._fetch import Fetched, S3Unavailable, call, get
from fastdata.storage.s3._windows import Windows, done

PREFETCH_CALLS = 2  # read_ranges calls of a stream fetched ahead


def _shutdown(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


CLOSE_WAIT_S = 5.0  # the longest close() waits for background reads still running, seconds

# One pool per process: threads do not survive a fork, so a child must never use its parent's pool
# (its queue would never be served); the inherited one is left alone, a new one built.
_pools: HandleCache[int, ThreadPoolExecutor] = HandleCache(
    lambda n: ThreadPoolExecutor(n, thread_name_prefix="fastdata-s3"), _shutdown, max_open=4, close_inherited=False
)
_pools_lock = threading.Lock()


def executor(config: S3Config) -> ThreadPoolExecutor:
    """This process's thread pool for ``config.threads`` parallel requests."""
    with _pools_lock:
        return _pools.get(config.threads)


# Objects fetched ahead because a reader named them as its companion (a tar shard's sidecar index): the
# GET starts with the reader's own, so both take one round trip.
_sidecars: OrderedDict[tuple[S3Config, str], tuple[int, Future[Fetched]]] = OrderedDict()
_sidecars_lock = threading.Lock()


def _start_sidecar(config: S3Config, stats: Stats, url: str, n: int) -> None:
    with _sidecars_lock:
        _sidecars[(config, url)] = (process.pid(), executor(config).submit(get, config, stats, url, 0, n))
        while len(_sidecars) > 16:
            _sidecars.popitem(last=False)


def _take_sidecar(config: S3Config, url: str) -> Future[Fetched] | None:
    with _sidecars_lock:
        pid, future = _sidecars.pop((config, url), (-1, None))
    return future if pid == process.pid() else None  # a forked child never waits on its parent's threads


class S3Reader:
    """Random-access reads of one S3 object (the storage reader for ``s3://`` URLs).

    Args:
        url (str): ``s3://bucket/key``.
        config (S3Config | None): endpoint, credentials, retries, timeouts, concurrency. Defaults to
            one built from ``**options`` (field names of :class:`S3Config`) and the AWS chain.
        stats (Stats | CounterSink | None): where to count requests, retries ... (see
            :data:`~fastdata.storage.s3.COUNTERS`); always counted in :func:`process_counters` too.
        readahead (int): bytes fetched by a small read, and by each background read-ahead, in bytes.
            Defaults to 4 MiB.
        part_size (int): the largest single GET; longer spans are split and fetched in parallel, in
            bytes. Defaults to 8 MiB.
        coalesce_gap (int): ranges of one ``read_ranges`` call closer than this are fetched together
            (the bytes between them read and dropped), in bytes. Defaults to 1 MiB.
        prefetch (bool): fetch ahead in the background when reads go forward. Defaults to True.
        max_prefetch (int): most bytes fetched ahead at once, in bytes. Defaults to 32 MiB.
        cache_bytes (int): most bytes of fetched windows kept, in bytes. Defaults to 64 MiB.
        open_bytes (int): bytes fetched by the first GET, which also gives the size. Defaults to 256 KiB.
        companion (str | None): an object the caller will open right after this one (a tar shard's sidecar
            index): its first GET starts together with this reader's. Defaults to None.
        expected_stride (int): how the caller's first ``read_ranges`` calls will move: each call ``n``
            spans after the previous one (a dataset that deals batches to ``n`` workers in turn passes
            ``n``); 1 for a contiguous stream. Later calls measure the stride. Defaults to 1.
        follow_streams (bool): fetch ahead what a stream of ``read_ranges`` calls will want next (see
            above); False for a caller that asks for each stretch whole when it needs it (a shuffle window
            filled shard by shard), where bytes fetched ahead past its stretch would be fetched for
            nothing. Defaults to True.
        size (int | None): the object's size, when the caller knows it (a manifest lists it): the reader
            then opens without a request, its first read is its first GET, and a GET that finds another
            size fails with :class:`ObjectChanged`. Defaults to None (the first GET, of ``open_bytes``,
            tells the size).
        **options: :class:`S3Config` fields (``endpoint_url=...``, ``max_attempts=...``).

    Raises:
        SourceNotFound: no such key or bucket. SourceUnreadable: access denied.
        S3Unavailable: the store did not answer after every retry (S3Unreachable: no connection could
            be made to the endpoint). S3CredentialsMissing: the AWS chain found no credentials.
    """

    def __init__(
        self,
        url: str,
        *,
        config: S3Config | None = None,
        stats: Any = None,
        readahead: int = 4 * MiB,
        part_size: int = 8 * MiB,
        coalesce_gap: int = 1 * MiB,
        prefetch: bool = True,
        max_prefetch: int = 32 * MiB,
        cache_bytes: int = 64 * MiB,
        open_bytes: int = 256 * 1024,
        companion: str | None = None,
        expected_stride: int = 1,
        follow_streams: bool = True,
        size: int | None = None,
        **options: Any,
    ) -> None:
        for name, value in (
            ("readahead", readahead),
            ("part_size", part_size),
            ("max_prefetch", max_prefetch),
            ("cache_bytes", cache_bytes),
            ("open_bytes", open_bytes),
        ):
            check_positive(name, value)
        check_positive("coalesce_gap", coalesce_gap, allow_zero=True)
        check_positive("expected_stride", expected_stride)
        if size is not None:
            check_positive("size", size, allow_zero=True)
        self.companion, self.expected_stride, self.follow_streams = companion, expected_stride, follow_streams
        self.bucket, self.key = parse_url(url)
        if not self.key or self.key.endswith("/"):
            raise ConfigError(
                f"{url}: names a prefix, not an object; S3Reader reads one object "
                "(use fastdata.S3Dataset for every object under a prefix)"
            )
        self.url = url
        self.config = S3Config.from_options(config, **options)
        self.stats = stats if isinstance(stats, Stats) else Stats(stats)
        self.readahead, self.part_size, self.coalesce_gap = readahead, part_size, coalesce_gap
        self.prefetch, self.max_prefetch = prefetch, max_prefetch
        self._windows = Windows(max(cache_bytes, max_prefetch + readahead))
        self._closed = False
        self._previous: tuple[int, int] | None = None  # the span of the last read_ranges call
        if size is not None:
            self.size, self.etag = size, ""  # the ETag comes with the first GET, which pins the later ones
            self._ahead = (0, 0)
            if self.prefetch and companion is not None:
                _start_sidecar(self.config, self.stats, companion, open_bytes)
            return
        first = self._open(open_bytes)
        self.size = first.size
        self.etag = first.etag
        if first.data:
            self._windows.put(0, len(first.data), done(first.data))
        self._ahead = (len(first.data), len(first.data) // 2)  # (next byte to read ahead, when to)

    def _open(self, n: int) -> Any:
        from botocore.exceptions import ClientError

        started = _take_sidecar(self.config, self.url)
        if self.prefetch and self.companion is not None:
            _start_sidecar(self.config, self.stats, self.companion, n)
        try:
            if started is not None:
                try:
                    return started.result()
                except S3Unavailable:
                    pass  # fetched ahead and failed: ask again below
            return get(self.config, self.stats, self.url, 0, n)
        except SourceUnreadable as e:
            cause = e.__cause__
            if not (isinstance(cause, ClientError) and error_code(cause.response) == "InvalidRange"):
                raise
        # only an empty object has no byte 0; ask its size to be sure
        head = call(self.config, self.stats, self.url, lambda s3: s3.head_object(Bucket=self.bucket, Key=self.key))
        return Fetched(b"", int(head["ContentLength"]), head.get("ETag", ""))

    # -- fetching -----------------------------------------------------------------------------------
    def _get(self, start: int, end: int) -> bytes:
        fetched = get(self.config, self.stats, self.url, start, end - start, etag=self.etag or None, size=self.size)
        if not self.etag:
            self.etag = fetched.etag  # opened with a known size: the first GET names the version to read
        return fetched.data

    def _parts(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(s, min(end, s + self.part_size)) for s in range(start, end, self.part_size)]

    def _fetch_many(self, jobs: list[tuple[int, int]], then: Callable[[], None] | None = None) -> list[bytes]:
        """Fetch every ``(start, end)``: the first on this thread, the others in parallel on the pool;
        ``then`` runs once they are queued (a read-ahead queued behind them)."""
        futures = []
        if len(jobs) > 1 and not self.etag:
            # no GET yet pinned the object's version: the first one does, before the others start
            return [self._get(*jobs[0]), *self._fetch_many(jobs[1:], then)]
        if len(jobs) > 1:
            pool = executor(self.config)
            futures = [pool.submit(self._get, s, e) for s, e in jobs[1:]]
        if then is not None:
            then()
        try:
            first = self._get(*jobs[0])
            return [first, *(f.result() for f in futures)]
        finally:
            for f in futures:
                f.cancel()

    def _read_ahead(self, start: int, length: int, min_gap: int = 0) -> None:
        """Fetch what no window holds of ``length`` bytes from ``start``, in the background, as windows
        of at most ``part_size``; gaps shorter than ``min_gap`` wait (unless they reach the end)."""
        end = min(self.size, start + length)
        if not self.prefetch or start >= end or self._closed:
            return
        pool = executor(self.config)
        for gap_start, gap_end in self._windows.missing(start, end):
            if gap_end - gap_start < min_gap and gap_end < self.size:
                continue
            for s, e in self._parts(gap_start, gap_end):
                self._windows.put(s, e, pool.submit(self._get, s, e))

    def _plan_ahead(self, lo: int, hi: int) -> Callable[[], None] | None:
        """After a dense call for ``lo .. hi-1``: if calls move forward with a steady stride (a shard read
        in order by one worker, or every n-th batch of it by one of n workers), fetch what the next
        ``PREFETCH_CALLS`` calls will want (at least ``readahead`` bytes when contiguous), widened by a
        margin for uneven sample sizes."""
        previous, self._previous = self._previous, (lo, hi)
        if not self.prefetch or not self.follow_streams:
            return None
        span = hi - lo
        # the first call has no stride to go by but the caller's word (a dataset dealing batches to n
        # workers in turn has each worker read every n-th one)
        stride = span * self.expected_stride if previous is None else lo - previous[0]
        if stride <= 0 or stride > 64 * max(span, 1):
            return None  # not a forward stream: random access, or a restart
        margin = span // 8
        if stride <= span + margin:
            # contiguous: one stretch, at least readahead long, topped up once half of it is used, so
            # that small calls make few, large GETs
            ahead = min(self.max_prefetch, max(self.readahead, PREFETCH_CALLS * span))
            return self._fetcher([(hi, min(self.size, hi + ahead))], min_gap=ahead // 2)
        # strided: the stretches of the next calls, re-planned at every call from where this one fell (a
        # guess far ahead drifts with uneven sample sizes); stretches already mostly held are left alone
        stretches = []
        budget = self.max_prefetch
        for k in range(1, PREFETCH_CALLS + 1):
            s, e = max(hi, lo + k * stride - margin), min(self.size, hi + k * stride + margin)
            e = min(e, s + budget)
            if s < e:
                stretches.append((s, e))
                budget -= e - s
        return self._fetcher(stretches, min_gap=span // 4)

    def _fetcher(self, stretches: list[tuple[int, int]], min_gap: int = 0) -> Callable[[], None] | None:
        stretches = [(s, e) for s, e in stretches if s < e]
        if not stretches:
            return None

        def fetch_ahead() -> None:
            for s, e in stretches:
                self._read_ahead(s, e - s, min_gap)

        return fetch_ahead

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.url}: read after close")

    # -- the reader interface -----------------------------------------------------------------------
    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer at the end of the object)."""
        if offset < 0 or length < 0:
            raise ValueError(f"{self.url}: negative offset or length ({offset}, {length})")
        end = min(self.size, offset + length)
        if end <= offset:
            return b""
        self._check_open()
        data = self._windows.get(offset, end)
        if data is None:
            if end - offset >= self.readahead:
                return b"".join(self._fetch_many(self._parts(offset, end)))
            stop = min(self.size, offset + self.readahead)
            window = self._get(offset, stop)
            self._windows.put(offset, stop, done(window))
            self._ahead = (stop, offset + (stop - offset) // 2)
            data = window[: end - offset]
        ahead, when = self._ahead
        if end > when and ahead < self.size and offset < ahead:
            # reads are moving forward through what is fetched: fetch the next stretch now
            self._read_ahead(ahead, self.readahead)
            self._ahead = (ahead + self.readahead, ahead + self.readahead // 2)
        return data

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)`` range, in order; nearby ranges fetched together,
        long spans in parallel parts, and the next stretches of a stream read in order fetched ahead."""
        self._check_open()
        out: list[bytes] = [b""] * len(ranges)
        need: list[tuple[int, int, int]] = []
        hits, lo, hi, wanted = 0, self.size, 0, 0
        for i, (offset, length) in enumerate(ranges):
            if offset < 0 or length < 0:
                raise ValueError(f"{self.url}: negative offset or length ({offset}, {length})")
            end = min(self.size, offset + length)
            if end <= offset:
                continue
            lo, hi, wanted = min(lo, offset), max(hi, end), wanted + end - offset
            data = self._windows.get(offset, end)
            if data is None:
                need.append((offset, end, i))
            else:
                out[i] = data
                hits += 1
        if hits:
            self.stats.add("s3_prefetch_hits", hits)
        # a dense call (a run of samples, headers between them) is a stream; scattered ranges are not
        then = self._plan_ahead(lo, hi) if hi > lo and wanted >= (hi - lo) // 2 else None
        if not need:
            if then is not None:
                then()
            return out
        need.sort()
        spans: list[tuple[int, int, list[tuple[int, int, int]]]] = []
        for offset, end, i in need:
            if spans and offset <= spans[-1][1] + self.coalesce_gap:
                s, e, members = spans[-1]
                members.append((offset, end, i))
                spans[-1] = (s, max(e, end), members)
            else:
                spans.append((offset, end, [(offset, end, i)]))
        jobs = [part for s, e, _ in spans for part in self._parts(s, e)]
        fetched = iter(self._fetch_many(jobs, then))
        for s, e, members in spans:
            parts = [next(fetched) for _ in self._parts(s, e)]
            buf = parts[0] if len(parts) == 1 else b"".join(parts)
            if then is not None:
                self._windows.put(s, e, done(buf))  # the margins of the next read-ahead may reach back here
            for offset, end, i in members:
                out[i] = buf[offset - s : end - s]
        return out

    def close(self) -> None:
        """Drop fetched windows and wait for background reads still running. Idempotent. The client
        belongs to the process (see :func:`release`)."""
        self._closed = True
        running: list[Future[Any]] = list(self._windows.clear())
        # the companion fetched ahead and never asked for (a shard whose index was cached)
        sidecar = _take_sidecar(self.config, self.companion) if self.companion is not None else None
        if sidecar is not None and not sidecar.cancel():
            running.append(sidecar)
        if running:
            # bounded: a close run by the garbage collector (a reader dropped mid-iteration, in a reference
            # cycle) can run while this thread holds a lock the background reads need (the client's, the
            # counters'); an unbounded wait there deadlocked. Past the bound they finish on their own,
            # their bytes dropped.
            wait_all(running, timeout=CLOSE_WAIT_S)

    def __enter__(self) -> S3Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "an S3Reader is not pickled; open it again in the process that reads "
            "(fastdata datasets do this on their own)"
        )

    def __repr__(self) -> str:
        return f"S3Reader({self.url!r}, endpoint={self.config.endpoint!r})"


__all__ = ["S3Reader", "executor"]
