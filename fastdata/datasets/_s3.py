"""``S3Dataset``: map-style access to the objects under an S3 prefix, one object per sample."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from typing import Any, Literal

import numpy as np
from torch.utils.data import Dataset

from fastdata.core import SKIP, SamplePipeline, process, stages
from fastdata.core.epoch import current_worker
from fastdata.core.errors import (
    ErrorPolicy,
    OnError,
    SourceNotFound,
    SourceUnreadable,
    check_choice,
    check_positive,
)
from fastdata.core.process import ProcessLocal, SharedPlan
from fastdata.datasets._base import MapDatasetBase
from fastdata.formats import DecodeMode, Decoder, make_decoder
from fastdata.formats.tar import split_key
from fastdata.storage import ObjectChanged, open_reader
from fastdata.storage.cache import COUNTERS as CACHE_COUNTERS
from fastdata.storage.cache import CacheCheck, CacheDir, cache_from
from fastdata.storage.s3 import COUNTERS, S3Config, S3Remote, S3Unavailable, Stats, client, executor, release, resolve

Sample = dict[str, Any]
OnMissing = Literal["raise", "skip"]


def sample_key(url: str) -> tuple[str, str]:
    """``("dir/name", "ext")`` for ``s3://bucket/dir/name.ext``: WebDataset's rule (the key ends at the
    first dot of the last path component); ``"data"`` for an object without an extension."""
    name = url.split("/", 3)[3]
    key, ext = split_key(name)
    return (key, ext) if key != name else (name, "data")


# The first GET of an object of unknown size (a URL list or a manifest without sizes): a smaller object
# costs that one request, a larger one a second for the rest.
OPEN_BYTES = 256 * 1024
# The largest single GET of one object's reader: its reads never split into parts on the process's
# thread pool, because they already run on that pool (a fetch waiting on parts queued behind other
# waiting fetches would never finish).
WHOLE = 1 << 62


class _Lookahead:
    """One process's fetches started ahead of need, by index."""

    def __init__(self) -> None:
        self.futures: dict[int, Future[bytes]] = {}

    def drop(self, keep: frozenset[int] = frozenset()) -> list[Future[bytes]]:
        """Forget every pending fetch not in ``keep``; returns those forgotten that are still running."""
        gone = [i for i in self.futures if i not in keep]
        running = []
        for i in gone:
            f = self.futures.pop(i)
            if not f.cancel() and not f.done():
                running.append(f)
        return running


def _close_lookahead(ahead: _Lookahead) -> None:
    running = ahead.drop()
    if running:
        wait_all(running)


class S3Dataset(MapDatasetBase, Dataset[Any]):
    """One sample per S3 object: ``{"__key__": "dir/name", "__url__": "s3://...", EXT: bytes}``.

    The objects are fixed at construction: a prefix is listed once (paginated, with a progress bar for
    large prefixes; ``cache=`` keeps the listing in a file), or taken from a list of URLs or a manifest
    file. Each worker process builds its own client on first use. A batch's objects are fetched
    concurrently (``concurrency`` threads per process, see :class:`~fastdata.storage.s3.S3Config`) and
    decoded as they arrive; with ``lookahead``, while a batch is decoded and handed over, the objects of
    the batches this worker will be given next are already being fetched: :meth:`sampler` publishes each
    epoch's order once, in shared memory (:class:`~fastdata.core.process.SharedPlan`), and a worker looks
    up where the batch it was given sits in it.

    Use :meth:`sampler` for a rank-aware, resumable order. Under ``on_missing="skip"`` / ``on_error="skip"``
    a missing or unreadable object is left out of its batch and counted in :attr:`skipped`; a batch of
    only such objects becomes a batch of one substitute, and ``ds[i]`` of one returns it (never None): the
    next good object after the batch's last index (after ``i``) in index order, wrapping to 0, counted in
    :attr:`substituted` (see :mod:`fastdata.datasets`). :meth:`counters` also reports requests,
    retries, throttles, errors and resumed reads, summed over every worker.

    Args:
        source (str | list[str]): ``"s3://bucket/prefix/"``, a list of ``s3://bucket/key`` URLs, or a
            manifest file (local or ``s3://``, ``.json`` or ``.txt``; see :mod:`fastdata.storage.s3`).
        endpoint_url (str | None): the S3 endpoint. Defaults to the AWS chain's (``AWS_ENDPOINT_URL`` ...).
        decode ("raw" | "pil" | "numpy" | "torch" | Decoder | Callable | None): by extension, like the tar
            datasets. Defaults to None (bytes).
        transform (Callable | None): applied to each decoded sample dict.
        on_missing ("raise" | "skip"): an object listed but gone. Defaults to "raise".
        on_error ("raise" | "skip"): an object that cannot be read after every retry (access denied,
            throttled or failing store, an endpoint that cannot be reached) or decoded. Listing a prefix
            at construction, and missing credentials, raise either way. Defaults to "raise".
        seed (int): seed of :meth:`sampler`'s shuffles and of ``worker_init_fn``. Defaults to 0.
        rank, world_size (int | None): Default to the detected ones.
        lookahead (int): batches of this worker fetched ahead of time (0: none). Two keep the threads busy
            while one slow object (a throttled retry) holds up a batch. Defaults to 2.
        cache (str | PathLike | None): a local file keeping the listing of a prefix; used when it lists
            the same prefix (delete it to list again). Defaults to None.
        page_size (int): keys per listing request. Defaults to 1000.
        progress (bool | None): listing progress bar; None shows it for prefixes of more than one page.
        config (S3Config | None): client settings; ``**options`` (its field names: ``max_attempts``,
            ``read_timeout``, ``concurrency``, credentials ...) override them.
        cache_dir (str | PathLike | False | None): a folder on this node where the objects are kept,
            shared by every worker and rank on the node: each object is downloaded once per node, and an
            epoch that finds it there reads it from the local copy (its version checked with a HEAD).
            None: ``$FASTDATA_CACHE_DIR/remote`` when that variable is set, else no cache; False: no cache.
            See docs/s3.md. Defaults to None.
        cache_limit (int | str | None): the most bytes the cache folder may hold (``"50GB"`` or bytes); least
            recently used objects no reader on the node has open are deleted to keep under it. None:
            ``$FASTDATA_CACHE_LIMIT`` when set, else no limit. Defaults to None.
        cache_check ("epoch" | "build"): when a cached object's version is asked of the store: once per epoch
            and node (a HEAD by the first process that opens it: one replaced between epochs is read as
            it is now), or once per node after the dataset was built (fewer requests; a replacement is
            seen by a dataset built later). Defaults to "epoch".
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str],
        *,
        endpoint_url: str | None = None,
        decode: DecodeMode | Decoder | Callable[[Sample], Sample] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        on_missing: OnMissing = "raise",
        on_error: OnError = "raise",
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        lookahead: int = 2,
        cache: str | os.PathLike[str] | None = None,
        page_size: int = 1000,
        progress: bool | None = None,
        config: S3Config | None = None,
        cache_dir: CacheDir = None,
        cache_limit: int | str | None = None,
        cache_check: CacheCheck = "epoch",
        **options: Any,
    ) -> None:
        check_choice("on_missing", on_missing, OnMissing)
        check_positive("lookahead", lookahead, allow_zero=True)
        if endpoint_url is not None:
            options["endpoint_url"] = endpoint_url
        self.config = S3Config.from_options(config, **options)
        check_choice("cache_check", cache_check, CacheCheck)
        self.cache = cache_from(cache_dir, cache_limit)
        if self.cache is not None:
            self.cache.prepare()  # an unusable folder is a CacheError naming it, here and not in a worker
        self.cache_check = cache_check
        self._built = time.time_ns()
        self._epoch_began: tuple[int, int, int] = (-1, -1, 0)  # (pid, epoch, time.time_ns() it began here)
        counters = (*COUNTERS, *(CACHE_COUNTERS if self.cache is not None else ()))
        self._init_base(seed=seed, on_error=on_error, rank=rank, world_size=world_size, counters=counters)
        if self.cache is not None:
            self.cache.count_into(self._shared)
        self._missing = ErrorPolicy(on_missing, self._shared)
        self.stats = Stats(self._shared)
        self.pipeline = SamplePipeline(make_decoder(decode), transform, self._policy)
        self.lookahead = lookahead
        self.urls, sizes = resolve(source, self.config, self.stats, cache=cache, page_size=page_size, progress=progress)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        # the order of sampler(), shared with the workers, for lookahead: made with the dataset (like its
        # shared state), so its one shared-memory file is there before any loader, and every sampler of
        # this dataset writes to the same one
        self._plan = SharedPlan(len(self.urls)) if lookahead else None
        self._ahead: ProcessLocal[_Lookahead] = ProcessLocal(_Lookahead, _close_lookahead, close_inherited=False)

    @property
    def decoder(self) -> Callable[[Sample], Sample] | None:
        """What decodes each sample (from ``decode``); None for raw bytes."""
        return self.pipeline.decoder

    @property
    def transform(self) -> Callable[[Sample], Any] | None:
        """The user's function applied to each decoded sample (may be replaced)."""
        return self.pipeline.transform

    @transform.setter
    def transform(self, transform: Callable[[Sample], Any] | None) -> None:
        self.pipeline.transform = transform

    @property
    def on_missing(self) -> OnMissing:
        return self._missing.on_error  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.urls)

    # -- fetching --------------------------------------------------------------------------------------
    def fetch(self, i: int) -> bytes:
        """The bytes of object ``i`` (retried, resumed, length checked against the listing), read through
        an :class:`~fastdata.storage.s3.S3Reader`: one GET when the listing gave the size or the object is
        under 256 KiB (an empty one takes a GET and a HEAD: S3 has no byte range of nothing)."""
        url, listed = self.urls[i], int(self.sizes[i])
        if self.cache is not None:
            # fetch() runs on the process's thread pool: the download's parts must not queue behind it there
            local = self.cache.open(url, S3Remote(self.config, self.stats, parallel=False), since=self._since())
            if local is not None:
                try:
                    self._check_size(url, local.size, listed)
                    return local.read(0, local.size)
                finally:
                    local.close()
        first = listed if listed > 0 else OPEN_BYTES
        reader = open_reader(
            url,
            config=self.config,
            stats=self.stats,
            open_bytes=first,
            part_size=WHOLE,
            prefetch=False,  # a whole object is read at once: nothing to read ahead within it
        )
        try:
            size = reader.size
            self._check_size(url, size, listed)
            if size <= first:
                return reader.read(0, size)  # what the first GET brought: no copy
            return reader.read(0, first) + reader.read(first, size - first)
        finally:
            reader.close()

    def _since(self) -> int:
        """Versions asked of the store at or after this time are good (see NodeCache.version): the start
        of this process's epoch, or the dataset's construction (``cache_check="build"``)."""
        if self.cache_check == "build":
            return self._built
        pid, epoch, began = self._epoch_began
        if (pid, epoch) != (process.pid(), self.epoch):
            began = time.time_ns()
            self._epoch_began = (process.pid(), self.epoch, began)
        return began

    @staticmethod
    def _check_size(url: str, size: int, listed: int) -> None:
        if listed >= 0 and size != listed:
            changed = ObjectChanged(
                f"{url}: the object has {size} bytes, {listed} were expected (it was "
                "replaced since it was listed); list it again"
            )
            changed.source = url  # type: ignore[attr-defined]  # what the policy warns about, once per object
            raise changed

    def _sample(self, i: int, data: bytes) -> Sample:
        url = self.urls[i]
        key, ext = sample_key(url)
        return {"__key__": key, "__url__": url, ext: data}

    def _next_batches(self, indices: Sequence[int]) -> list[int]:
        """The indices this worker will most likely be asked for in its next ``lookahead`` batches: the
        DataLoader deals the sampler's batches to its workers in turn, so those are ``num_workers``,
        ``2 * num_workers`` ... batches further on in the sampler's order (read from the shared plan)."""
        plan = self._plan
        if plan is None or not indices or not self.lookahead:
            return []
        return plan.following(self.epoch, indices, current_worker()[1] * len(indices), self.lookahead)

    def _read(self, indices: Sequence[int], *, planned: bool = True) -> list[Any]:
        """The samples ``indices``, fetched concurrently and decoded in order, each finished or :data:`SKIP`
        (bad: handled by the policies, raised or counted). ``planned``: a batch of the sampler's order, which
        moves the lookahead on; False for a substitute search, which leaves it alone."""
        t = stages.clock()  # 0.0 unless `fastdata bench` probes this process
        self.follow_epoch()
        pool = executor(self.config)
        futures: list[Future[bytes]] = []
        if planned:
            ahead = self._ahead.get()
            hits = 0
            for i in indices:
                f = ahead.futures.pop(i, None)
                if f is None:
                    f = pool.submit(self.fetch, i)
                else:
                    hits += 1
                futures.append(f)
            upcoming = self._next_batches(indices)
            ahead.drop(frozenset(upcoming))  # guesses that did not come true
            if hits:
                self.stats.add("s3_prefetch_hits", hits)
            for j in upcoming:  # queued behind this batch's own fetches
                if j not in ahead.futures:
                    ahead.futures[j] = pool.submit(self.fetch, j)
        else:
            futures = [pool.submit(self.fetch, i) for i in indices]
        out: list[Any] = []
        pipeline = self.pipeline
        try:
            for i, f in zip(indices, futures):
                try:
                    data = f.result()
                except SourceNotFound as e:
                    self._missing.handle(e)
                    out.append(SKIP)
                    continue
                except (SourceUnreadable, S3Unavailable, ObjectChanged) as e:
                    self._policy.handle(e)  # type: ignore[arg-type]
                    out.append(SKIP)
                    continue
                t = stages.lap("fetch", t)  # waiting for the object (fetched by the pool's threads)
                sample, t = pipeline(self._sample(i, data), t)
                out.append(sample)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return out

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for {n} objects")
        got = self._read([i % n])[0]
        return got if got is not SKIP else self._substitute([i % n])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch's samples; skipped ones are left out (the DataLoader calls this to batch), and a batch of
        only skipped ones is a batch of one substitute."""
        out = [s for s in self._read(indices) if s is not SKIP]
        if not out and indices:
            return [self._substitute(indices)]
        return out

    def _substitute(self, indices: Sequence[int]) -> Any:
        """The substitute for the skipped objects ``indices`` (see :meth:`DatasetBase._stand_in`)."""
        n = len(self)

        def good(candidates: list[int]) -> list[tuple[int, Any]]:
            got = self._read(candidates, planned=False)
            return [(j, s) for j, s in zip(candidates, got) if s is not SKIP]

        bad = [i % n for i in indices]
        return self._stand_in(bad, good, [self.urls[i] for i in bad])[1]

    def _publish_order(self) -> Callable[..., Any] | None:
        # each epoch's order goes to a plan in shared memory that the workers read (the order last iterated),
        # which tells ``lookahead`` which objects each worker reads next
        plan = self._plan
        return None if plan is None else plan.publish

    def warm(self) -> None:
        """Build this process's client and threads before the first batch is asked for."""
        client(self.config)
        executor(self.config)

    def close(self) -> None:
        """Cancel fetches started ahead (waiting for those running) and close this process's client for
        this dataset's settings with its pooled connections (rebuilt, ~10 ms, if the dataset is read
        again). Idempotent."""
        self._ahead.close()
        release(self.config)

    def __repr__(self) -> str:
        return f"S3Dataset({len(self)} objects, endpoint={self.config.endpoint!r})"
