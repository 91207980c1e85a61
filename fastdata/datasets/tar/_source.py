"""The shards of a tar dataset, and reading samples from them in one process (shared by the
iterable :class:`~fastdata.TarShardDataset` and the map-style :class:`~fastdata.IndexedTarDataset`)."""

from __future__ import annotations

import os
import posixpath
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from fastdata.core import SamplePipeline, describe_sample, stages, tracked
from fastdata.core.epoch import current_worker
from fastdata.core.errors import (
    CacheError,
    ErrorPolicy,
    SourceNotFound,
    SourceUnavailable,
    SourceUnreadable,
    check_choice,
)
from fastdata.core.process import HandleCache, pid
from fastdata.datasets.tar._cached_shards import CachedShards
from fastdata.formats import resolve_sources, shard_listing
from fastdata.formats.tar import (
    SPLIT_KEYS_FIX,
    CompressedShard,
    Compression,
    ShardIndex,
    SidecarMismatch,
    check_on_read,
    check_once,
    compression_of,
    index_url,
    read_samples,
    refusal,
    scan,
)
from fastdata.storage import Reader, file_identity, is_remote, open_reader, scheme
from fastdata.storage.cache import COUNTERS as CACHE_COUNTERS
from fastdata.storage.cache import CacheCheck, CacheDir, CacheWarning, NodeCache, cache_from, index_cache

Sample = dict[str, Any]
# Parsed indexes kept per process. Plain Python data: a forked worker may use its parent's.
INDEX_CACHE_SHARDS = 64
CACHED_OPEN = 2  # shard readers kept open per process when the cache has a limit (each pins its shard)


SHARD_OPENS = "shard_opens"
"""The counter of shard readers opened by the dataset's processes (a reader kept open and used again is not
counted again): how often a shard is opened per epoch, whatever the bound on open readers."""


def remote_counters(urls: list[str], cached: bool = False) -> tuple[str, ...]:
    """Names of the counters the readers of ``urls`` keep (S3 requests, retries ...), if any is remote,
    and with ``cached`` the node-local cache's (hits, misses, bytes from the store and from the cache);
    and ``shard_opens``."""
    if not any(scheme(u) == "s3" for u in urls):
        return ()
    from fastdata.storage.s3 import COUNTERS

    return (*COUNTERS, *(CACHE_COUNTERS if cached else ()), SHARD_OPENS)


def choose_cache(
    cache_dir: CacheDir, cache_limit: int | str | None, urls: list[str], storage_options: dict[str, Any] | None
) -> NodeCache | None:
    """The node-local cache a tar dataset reads its remote shards through: the one asked for (``cache_dir``
    or ``$FASTDATA_CACHE_DIR``); else, where remote shards have no index beside them (no ``.idx`` sidecar,
    no manifest: as webdataset and ``tar`` write them), fastdata's own cache folder, so that the shard
    downloaded to be indexed is the one the samples are read from (one fetch, not two:
    :func:`~fastdata.storage.cache.index_cache`), warned once; ``cache_dir=False``: none.

    Whether the shards have an index is judged from the first remote one (a manifest that lists it, or
    its sidecar): two small requests, the shards of one dataset being made alike."""
    remote = [u for u in urls if is_remote(u)]
    if not remote:
        return None
    cache = cache_from(cache_dir, cache_limit)
    if cache is not None:
        cache.prepare()  # an unusable folder is a CacheError naming it, here and not in a worker
        return cache
    if cache_dir is False:
        return None
    options = dict(storage_options or {})

    def opener(u: str) -> Reader:
        return open_reader(u, **options)

    first = remote[0]
    if shard_listing([first], opener):
        return None
    try:
        opener(index_url(first)).close()
        return None
    except (SourceNotFound, SourceUnreadable):
        pass
    cache = index_cache(cache_limit)
    fixes = (
        "Pass cache_dir= (and cache_limit=) to choose where, cache_dir=False to read from the store, or write "
        f"sidecars and a manifest beside the shards once with 'fastdata inspect --write-manifest "
        f"{posixpath.dirname(first)}/'"
    )
    try:
        usable = cache.prepare()
    except CacheError:
        usable = False
    why = cache.problem or "read-only"
    if not usable:
        # no cache was asked for: a home that cannot be written (a container under an arbitrary uid) must not
        # stop the data from being read; it costs a second read of each shard, said once
        warnings.warn(
            f"fastdata: {first} has no .idx sidecar and no manifest, and fastdata's own cache folder {cache.root} "
            f"cannot be written ({why}): each shard is scanned from the store, then its samples read from it "
            f"again (about twice the bytes). {fixes}; or pass stream=True: each shard fetched once per epoch, "
            "read in one pass without an index (no len() or resume position)",
            CacheWarning,
            stacklevel=3,
        )
        return None
    limit = f"{cache.limit / 1e9:.1f} GB" if cache.limit else "no limit"
    warnings.warn(
        f"fastdata: {first} has no .idx sidecar and no manifest: each shard is indexed from a copy downloaded "
        f"once into the node-local cache {cache.root} (limit {limit}) and read from there, not fetched twice. "
        f"{fixes}",
        CacheWarning,
        stacklevel=3,
    )
    return cache


def tar_urls(urls: Any, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The shards a tar dataset's ``urls`` name: brace ranges and globs expanded, a folder (local, or an
    ``s3://`` prefix ending in ``/``) read through its manifest (see
    :func:`fastdata.formats.resolve_sources`)."""
    options = dict(storage_options or {})
    return resolve_sources(urls, "tar", lambda u: open_reader(u, **options) if scheme(u) else open_reader(u))


def sidecar_index(
    url: str,
    reader: Reader,
    opener: Callable[[str], Reader] = open_reader,
    *,
    planned: int | None = None,
    end: bool = False,
) -> ShardIndex | None:
    """The shard's sidecar index (``URL.idx``) when there is one and it matches the shard; None (warned,
    for a damaged or mismatched one) when the shard must be scanned.

    A local shard's sidecar is checked whole against the shard's headers
    (:func:`~fastdata.formats.tar.check_once`). A remote shard's is checked as far as its layout
    shows, and each member as it is read (:func:`~fastdata.formats.tar.check_on_read`: reads of
    the index may raise :class:`~fastdata.formats.tar.SidecarMismatch`); it is refused when it
    lists another number of samples than ``planned`` (from a manifest), and with ``end`` its end of the
    archive is checked now (for a sample count that plans an epoch).
    """
    try:
        side = opener(index_url(url))
    except (SourceNotFound, SourceUnreadable):
        return None
    try:
        data = side.read(0, side.size)
        index = ShardIndex.from_bytes(url, data)
    except Exception as e:  # noqa: BLE001 - a damaged sidecar is rebuilt, never trusted
        warnings.warn(f"{index_url(url)}: unreadable index ({e}); scanning the shard instead", stacklevel=3)
        return None
    finally:
        side.close()
    if hasattr(reader, "buffer"):
        problem = check_once(index, reader, data)
    elif planned is not None and planned != len(index):
        problem = f"lists {len(index)} samples, the dataset's manifest {planned}"
    else:
        problem = check_on_read(index, reader, end=end)
    if problem is not None:
        _refused(url, problem)
        return None
    index.identity = getattr(reader, "identity", None)
    return index


def _refused(url: str, problem: str, stacklevel: int = 4) -> None:
    """Warn that the shard's sidecar is not used, why, and the fix."""
    warnings.warn(
        f"{index_url(url)}: {problem}; scanning the shard instead (rewrite the sidecar with "
        "'fastdata inspect --write-manifest', or delete it)",
        stacklevel=stacklevel,
    )


def load_index(url: str, reader: Reader, opener: Callable[[str], Reader] = open_reader) -> ShardIndex:
    """The shard's sidecar index if it matches the shard (:func:`sidecar_index`), else a fresh scan."""
    return sidecar_index(url, reader, opener) or scan(reader)


class TarSource:
    """Shards, their sample counts, and per-process readers and indexes.

    Args:
        urls (list[str]): the shards.
        policy (ErrorPolicy): what to do with bad samples and missing shards.
        decoder, transform: applied to each sample, in that order (see ``SamplePipeline``).
        max_open (int | None): readers open at once per process; see ``HandleCache``.
        storage_options (dict | None): passed to the reader of remote URLs (for ``s3://``: the fields
            of :class:`~fastdata.storage.s3.S3Config` such as ``endpoint_url``, and the
            ``S3Reader`` options such as ``readahead``). Defaults to None (the environment's settings).
        stats: where remote readers count requests and retries (the dataset's shared state).
        cache (NodeCache | None): where remote shards (and their sidecars and manifest) are kept on this
            node: every remote URL is read from its local copy there, downloaded once per node. Defaults
            to None (read from the store).
        read_ahead (int): with a cache, shards of this process's plan (:meth:`plan`) downloaded ahead of
            the one being read. Defaults to 2.
        cache_check ("epoch" | "build"): when a cached shard's version is asked of the store (see
            :data:`~fastdata.storage.cache.CacheCheck`). Defaults to "epoch".
        counted (bool): count each shard's samples now (from a manifest, sidecars or a scan); False leaves
            :attr:`counts` at -1 each (a streamed dataset, which counts nothing ahead). Defaults to True.

    Attributes:
        counts (list[int]): samples per shard. sizes (list[int]): bytes per shard, -1 where unknown (from a
            manifest, the shard's index or, for local files, the file).
        dealt (bool): the dataset deals batches to its DataLoader workers in turn, so each worker reads
            every n-th stretch of a shard (a hint for remote read-ahead). Defaults to False.
        streaming (bool): the dataset reads its part of each shard in one pass, so compressed shards
            (gzip, xz, bzip2, zstd) are read (decompressed in memory, see
            :mod:`fastdata.formats.tar`); without, they are refused. Defaults to False.
    """

    def __init__(
        self,
        urls: list[str],
        *,
        policy: ErrorPolicy,
        decoder: Callable[[Sample], Sample] | None,
        transform: Callable[[Sample], Any] | None,
        max_open: int | None,
        storage_options: dict[str, Any] | None = None,
        stats: Any = None,
        dealt: bool = False,
        streaming: bool = False,
        cache: NodeCache | None = None,
        read_ahead: int = 2,
        cache_check: CacheCheck = "epoch",
        counted: bool = True,
    ) -> None:
        check_choice("cache_check", cache_check, CacheCheck)
        self.urls = urls
        self.cache = cache if any(is_remote(u) for u in urls) else None
        self.policy = policy
        self.pipeline = SamplePipeline(decoder, transform, policy, describe=self.describe)
        self._options = dict(storage_options or {})
        self._stats = stats
        self._dealt = dealt
        self._streaming = streaming
        self._checked_epoch: int | None = None  # the epoch whose start this process last checked shards for
        self._noted: set[str] = set()  # what this process warned about: "ignored", shards that changed
        self._compressed: dict[str, Compression] = {}  # shards found to be compressed (read decompressed)
        self._distrusted: set[str] = set()  # shards whose sidecar a read found wrong: scanned from now on
        self._clients: set[Any] = set()  # client settings of the remote readers this process opened
        if max_open is None and self.cache is not None and self.cache.limit is not None:
            # an open reader pins its shard in the cache (never evicted): hold few, so that a cache_limit
            # of a few shards is kept; reopening costs no request (its version is remembered for the epoch)
            max_open = CACHED_OPEN
        self._readers: HandleCache[str, Reader] = HandleCache(self._open_shard, self._put_down, max_open=max_open)
        # the shards of the window being read (see hold()): their readers stay open past the LRU bound
        self._holding: frozenset[str] = frozenset()
        self._held: dict[str, Reader] = {}
        self._held_by = pid()
        self._read_ahead = read_ahead
        self._cached = (
            CachedShards(
                self.cache,
                next(u for u in urls if is_remote(u)),
                self._options,
                stats,
                read_ahead=read_ahead,
                check=cache_check,
                held=self._readers.max_open,
            )
            if self.cache is not None
            else None
        )
        self._indexes: OrderedDict[str, ShardIndex] = OrderedDict()
        self._sizes: dict[str, int] = {}  # bytes of each shard, where known (manifest, index, local file)
        # counted=False (a streamed dataset): no count, so nothing is fetched to build it
        self.counts = self._count_samples() if counted else [-1] * len(urls)
        self.sizes = [self._sizes.get(u, -1) for u in self.urls]
        self._planned = dict(zip(urls, self.counts))
        self.close()  # the parent keeps no reader or connection open into the DataLoader's fork

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # rebuilt in the worker, cheaper than pickling them; but a remote shard's read from the store (no cache)
        # is rebuilt by fetching its sidecar or, without one, the whole shard again: those travel (a spawned
        # worker scanned again what the build had scanned, 0.3x more bytes in a Mix's epoch)
        state["_indexes"] = OrderedDict(
            (u, i) for u, i in self._indexes.items() if self._cached is None and is_remote(u) and i.pending is None
        )
        state["_clients"] = set()
        state["_holding"], state["_held"] = frozenset(), {}
        return state

    def hold(self, urls: Sequence[str]) -> None:
        """The shards the window being read spans (its shuffled samples come from them in any order): with
        a cache limit, their readers stay open (each pinning its local copy) until the next :meth:`hold`
        or :meth:`close`, so that each is opened once per window and not again at every turn of the bound
        on open readers (a window over 10 shards read 64 samples at a time reopened them ~200 times per
        epoch, batched ~1,500). The shards held together stay a share of the limit that leaves room for
        the read-ahead and the usual open readers (the first of ``urls`` that fit; the rest are opened
        as usual)."""
        if self._cached is None:
            return
        self._own_held()
        budget = self._hold_budget()
        keep: list[str] = []
        for url in dict.fromkeys(urls):
            size = self._sizes.get(url, -1)
            if size < 0 or size > budget:
                break
            budget -= size
            keep.append(url)
        self._holding = frozenset(keep)
        open_now = set(self._readers.open_keys())
        for url in [u for u in self._held if u not in self._holding]:
            reader = self._held.pop(url)
            if url not in open_now:  # (one the bound still holds is closed when the bound lets it go)
                reader.close()

    def _hold_budget(self) -> float:
        """Bytes of shards :meth:`hold` may keep open: the cache's limit less the read-ahead's downloads and
        the usual open readers, at the largest shard's size each (no limit: no bound)."""
        limit = self.cache.limit if self.cache is not None else None
        if limit is None:
            return float("inf")
        biggest = max(self.sizes, default=0)
        return limit - (self._read_ahead + self._readers.max_open + 1) * biggest

    def _own_held(self) -> None:
        """Forget held readers inherited through a fork (the parent's: its process closes them)."""
        if self._held_by != pid():
            self._held, self._holding, self._held_by = {}, frozenset(), pid()

    def _put_down(self, reader: Reader) -> None:
        """The bound on open readers lets ``reader`` go: closed, unless a window holds it."""
        if not any(r is reader for r in self._held.values()):
            reader.close()

    def _discard(self, url: str) -> None:
        """Close and forget the reader of ``url``, held or not (after an error, a replacement)."""
        self._own_held()
        held = self._held.pop(url, None)
        if url in self._readers.open_keys():
            self._readers.discard(url)
        elif held is not None:
            held.close()

    def plan(self, urls: Sequence[str]) -> None:
        """The shards this process will read next, in order: with a cache, their versions are asked and
        the next ones downloaded in the background (see ``CachedShards``)."""
        if self._cached is not None:
            self._check_identities()  # a new epoch starts here: versions asked before it are not good for it
            self._cached.plan(urls)

    def open(self, url: str, **hints: Any) -> Reader:
        """A reader for ``url`` (a shard, its sidecar index or a manifest) with this source's options;
        ``hints`` are the remote reader's access-pattern options (see :meth:`_open_shard`)."""
        if not scheme(url):
            return open_reader(url)
        if self._cached is not None and is_remote(url):
            cached = self._cached.open(url)
            if cached is not None:
                return cached
            hints = {}  # larger than the cache's limit: read from the store, as without one
        reader = open_reader(url, stats=self._stats, **hints, **self._options)
        config = getattr(reader, "config", None)
        if config is not None:
            self._clients.add(config)
        return reader

    def _open_shard(self, url: str) -> Reader:
        """A shard's reader. A remote one is told what comes next: the sidecar index (fetched together
        with the shard's first bytes) and, when batches are dealt to workers, every n-th stretch.
        A shard found to be gzip-compressed (see :meth:`index`) is decompressed; a shard that is not the
        file its cached index was made from loses that index."""
        self._own_held()
        held = self._held.get(url)
        if held is not None:  # kept open by the window being read: not opened again
            return held
        if not scheme(url):
            reader = open_reader(url)
        elif self._cached is not None:
            reader = self.open(url)  # its local copy (downloaded first if the node has none)
            self._cached.opened(url)
        else:
            hints: dict[str, Any] = {
                "companion": index_url(url),
                "expected_stride": current_worker()[1] if self._dealt else 1,
            }
            if self._sizes.get(url, -1) > 0:
                hints["size"] = self._sizes[url]  # known: the reader opens without a request of its own
            reader = self.open(url, **hints)
        if url in self._compressed:
            reader = CompressedShard(reader, self._compressed[url])
        index = self._indexes.get(url)
        if index is not None and index.identity != getattr(reader, "identity", None):
            del self._indexes[url]  # replaced on disk since it was indexed: index it again
        if url in self._holding:
            self._held[url] = reader
        if self._stats is not None and SHARD_OPENS in getattr(self._stats, "counters", ()):
            self._stats.add(SHARD_OPENS)
        return reader

    def describe(self, sample: Any) -> tuple[str, str]:
        """``(shard, where)`` of a sample, for an error message: its number in the shard (from the shard's
        index, when this process holds it) and its key."""
        source, where = describe_sample(sample)
        index = self._indexes.get(source)
        key = sample.get("__key__") if isinstance(sample, dict) else None
        if index is not None and key is not None:
            try:
                where = f"{source}: sample {index.keys.index(key)} (key {key!r})"
            except ValueError:
                pass
        return source, where

    def _count_samples(self) -> list[int]:
        """Samples per shard: from a manifest beside the shards, else from each shard's index."""
        listed = shard_listing(self.urls, self.open)
        known = {u: n for u, (n, _) in listed.items()}
        self._sizes = {u: b for u, (_, b) in listed.items() if b >= 0}
        for url in self.urls:
            if url not in self._sizes and not scheme(url):
                try:
                    self._sizes[url] = os.path.getsize(url)
                except OSError:
                    pass  # a missing shard: reported when it is read
        todo = [u for u in self.urls if u not in known]
        for url in tracked(todo, "fastdata: indexing shards", unit="shards", enabled=len(todo) >= 50):
            try:
                # the count plans every epoch: a remote sidecar's end of the archive is checked now (a
                # sidecar that leaves the last samples out would drop them from the plan)
                index = self._count_from_sidecar(url) or self.index(url, end=True)
                known[url] = len(index)
                self._sizes.setdefault(url, index.size)
            except (SourceNotFound, SourceUnreadable) as e:
                # without a manifest, a missing shard's sample count is unknown: it cannot be planned
                self.policy.handle(e)
                known[url] = 0
            finally:
                self._discard(url)
        return [known[u] for u in self.urls]

    def _count_from_sidecar(self, url: str) -> ShardIndex | None:
        """With a cache: a remote shard's index from its sidecar, checked against the shard in the store
        as far as its layout and end show (a HEAD and one small ranged GET), or None without a sidecar.
        So counting the samples of shards that have sidecars does not download every shard now, in this
        process; the workers check each member when they read it from the cache."""
        if self._cached is None or not is_remote(url):
            return None
        try:
            self.open(index_url(url)).close()  # absent: no request for the shard itself
        except (SourceNotFound, SourceUnreadable):
            return None
        options = {**self._options, "size": self._cached.remote().stat(url).size, "prefetch": False}
        reader = open_reader(url, stats=self._stats, **options)
        try:
            return sidecar_index(url, reader, self.open, end=True)
        finally:
            reader.close()

    def index(self, url: str, *, end: bool = False) -> ShardIndex:
        """The index of shard ``url``, from this process's cache, its sidecar, or a scan; ``end``: a
        remote sidecar's end of the archive is checked now, not when its last member is read."""
        index = self._indexes.get(url)
        if index is None:
            reader = self._readers.get(url)
            index = None
            if url not in self._distrusted:
                index = sidecar_index(url, reader, self.open, planned=getattr(self, "_planned", {}).get(url), end=end)
            if index is None:
                index = self._scan(url, reader)
            self._indexes[url] = index
            if len(self._indexes) > INDEX_CACHE_SHARDS:
                self._indexes.popitem(last=False)
            self._note(url, index)
        else:
            self._indexes.move_to_end(url)
        return index

    def _scan(self, url: str, reader: Reader) -> ShardIndex:
        """Index the shard by scanning it. The compression sniff runs here only: a sidecar that matches
        the shard says it is a plain tar, and the sniff's small read would fetch a remote shard's first
        megabytes (a read-ahead window) in every worker."""
        packed = compression_of(reader) if url not in self._compressed else None
        if packed is not None:
            if not self._streaming:
                raise refusal(url, packed)
            self._compressed[url] = packed
            self._discard(url)
            reader = self._readers.get(url)  # reopened, decompressed
        return scan(reader)

    def _distrust(self, url: str, mismatch: SidecarMismatch) -> None:
        """A read found the shard's sidecar wrong (nothing it pointed at was returned): warn, and scan
        the shard from now on in this process."""
        _refused(url, mismatch.problem, stacklevel=4)
        self._distrusted.add(url)
        self._indexes.pop(url, None)

    def _note(self, url: str, index: ShardIndex) -> None:
        """Warn (once per process) about what a fresh index shows: members that belong to no sample,
        and a shard whose sample count changed since the epoch was planned."""
        if index.ignored and "ignored" not in self._noted:
            self._noted.add("ignored")
            warnings.warn(
                f"fastdata: {url}: {index.ignored} member(s) without an extension (a README?) belong to no "
                "sample and are left out (WebDataset names are KEY.EXT); 'fastdata inspect' counts them in "
                "every shard",
                stacklevel=3,
            )
        if index.split and "split" not in self._noted:
            self._noted.add("split")
            named = ", ".join(repr(k) for k in index.split_examples)
            warnings.warn(
                f"fastdata: {url}: {index.split} key(s) ({named}, ...) have members scattered over the shard (a tar "
                "of a folder stores directory order); each is read as one sample, but webdataset and other "
                f"readers split them and no sidecar index can be used: {SPLIT_KEYS_FIX}",
                stacklevel=3,
            )
        planned = getattr(self, "_planned", {}).get(url)
        if planned is not None and planned != len(index) and index.tail_error is None and url not in self._noted:
            self._noted.add(url)
            why, fix = "the shard was replaced?", "build the dataset again to read it all"
            if url in self._distrusted:
                why = "its sidecar did not match it"
                fix = (
                    "rewrite the sidecar and manifest ('fastdata inspect --write-manifest') and build the dataset again"
                )
            warnings.warn(
                f"fastdata: {url}: has {len(index)} samples now, {planned} when the dataset was built ({why}); "
                f"the epoch keeps the planned count: {fix}",
                stacklevel=3,
            )

    def _check_identities(self) -> None:
        """At the start of an epoch: forget the index (and reader) of every local shard that is no
        longer the file it was indexed from (replaced or rewritten since)."""
        epoch = self._stats.epoch if self._stats is not None else 0
        if epoch == self._checked_epoch:
            return
        self._checked_epoch = epoch
        if self._cached is not None:
            self._cached.new_epoch()  # asks again whether each shard was replaced in the store
        for url, index in list(self._indexes.items()):
            # (a remote shard's version is asked for when it is opened: see _open_shard)
            if index.identity is not None and not scheme(url) and file_identity(url) != index.identity:
                del self._indexes[url]
                self._discard(url)

    def read(
        self,
        shard: int,
        which: Sequence[int],
        *,
        decode: bool = True,
        kept: list[int] | None = None,
        views: bool = False,
    ) -> list[Any]:
        """Samples ``which`` of shard number ``shard``, decoded and transformed (``decode=False``: raw, for
        :attr:`pipeline` later); bad ones handled by the policy (raised, or counted and left out). The
        numbers of the samples read (all of ``which`` but the bad ones) are appended to ``kept``. With
        ``views`` (a pipeline that passes samples through), a local shard's members come as views of the
        file (see :func:`~fastdata.formats.tar.read_samples`)."""
        t = stages.clock()  # 0.0 unless `fastdata bench` probes this process
        url = self.urls[shard]
        self._check_identities()
        while True:
            try:
                reader = self._readers.get(url)
                index = self.index(url)
            except (SourceNotFound, SourceUnreadable, SourceUnavailable) as e:
                for _ in which:
                    self.policy.handle(e)
                return []
            if not index.bad and (not which or max(which) < len(index.keys)):
                good: Sequence[int] = which  # the common case: a sound shard, no per-sample check
            else:
                good = [i for i in which if index.error_at(i) is None]
            try:
                samples: list[Any] = read_samples(reader, index, good, views=views)
            except SidecarMismatch as e:  # a remote sidecar, checked as it is read, was wrong: scan, read again
                self._distrust(url, e)
                continue
            except SourceUnavailable as e:  # the store stopped answering mid-shard (after every retry)
                self._handle_bad(index, which, good)
                for _ in good:
                    self.policy.handle(e)
                return []
            break
        self._handle_bad(index, which, good)
        if kept is not None:
            kept.extend(good)
        t = stages.lap("fetch", t, len(samples))
        return self.pipeline.batch(samples, t) if decode else samples

    def _handle_bad(self, index: ShardIndex, which: Sequence[int], good: Sequence[int]) -> None:
        """Hand the policy the problem of each of ``which`` left out of ``good``."""
        if len(good) != len(which):
            for i in which:
                problem = index.error_at(i)
                if problem is not None:
                    self.policy.handle(problem)

    def close(self) -> None:
        """Close every reader this process opened, and the pooled connections of its S3 client; drop
        the cache's read-ahead not yet started."""
        self._own_held()
        held, self._held, self._holding = self._held, {}, frozenset()
        open_now = set(self._readers.open_keys())
        self._readers.close()
        for url, reader in held.items():
            if url not in open_now:
                reader.close()
        # after this process's readers let go of their shared locks: a download under way, which close() waits
        # for, may need the exclusive lock of a shard one of them held (closing it first hung CI: a worker's
        # close() waited on its own read-ahead, blocked on the worker's own pin, for ever)
        if self._cached is not None:
            self._cached.close()
        if self._clients:
            from fastdata.storage.s3 import release

            for config in self._clients:
                release(config)
            self._clients.clear()
