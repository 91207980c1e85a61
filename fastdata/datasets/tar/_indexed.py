"""``IndexedTarDataset``: random access into tar shards through their per-shard indexes."""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

from torch.utils.data import Dataset

from fastdata.core import SKIP
from fastdata.core.epoch import data_digest
from fastdata.core.errors import OnError
from fastdata.datasets._base import MapDatasetBase
from fastdata.datasets.tar._source import Sample, TarSource, choose_cache, remote_counters, tar_urls
from fastdata.formats import DecodeMode, Decoder, FieldSpec, make_decoder, with_fields
from fastdata.loading.transport import slot_sample, slot_samples
from fastdata.storage.cache import CacheCheck, CacheDir


class IndexedTarDataset(MapDatasetBase, Dataset[Any]):
    """Map-style access to the samples of WebDataset-format tar shards.

    Index ``i`` runs across shards in the order given. Works with any ``Sampler`` (use
    :meth:`sampler` for a rank-aware, resumable one). Readers are opened lazily in each worker and kept
    in a bounded LRU (``max_open``), so thousands of shards never exhaust file descriptors.

    Under ``on_error="skip"``, a bad sample is left out of its batch (through ``__getitems__``, which
    the DataLoader uses when batching) and counted in :attr:`skipped`. A batch of only bad samples
    becomes a batch of one substitute, and ``ds[i]`` of a bad sample returns it (never None): the next
    good sample after the batch's last index (after ``i``) in index order, wrapping to 0, counted in
    :attr:`substituted` (see :mod:`fastdata.datasets`).

    Args:
        urls (str | list[str]): shard paths or URLs (brace ranges and globs expand); a folder is read
            through the ``manifest.json`` that ``fastdata convert`` wrote in it (a local folder without
            one: its ``.tar`` files).
        decode ("raw" | "pil" | "numpy" | "torch" | Decoder | Callable): Defaults to "raw" (bytes).
        fields (dict | str | None): keep these fields, each the first of its alternatives the sample has,
            under a name of its own: ``{"image": "jpg;jpeg;png;webp", "label": "cls"}`` (webdataset's
            ``"jpg;png"``), so that samples storing different extensions batch together; applied after
            ``decode``, before ``transform``. A sample with none of a field's alternatives is a bad sample
            (``on_error``). Defaults to None: every member, under its extension.
        transform (Callable | None): applied to each decoded sample dict.
        on_error ("raise" | "skip"): Defaults to "raise".
        seed (int): seed of :meth:`sampler`'s shuffles and of ``worker_init_fn``. Defaults to 0.
        rank, world_size (int | None): Default to the detected ones.
        max_open (int | None): readers open at once per process. Defaults to
            ``default_max_open``.
        storage_options (dict | None): for ``s3://`` shards: ``endpoint_url``, credentials, retries ... (the
            fields of ``fastdata.storage.s3._client.S3Config``) and ``S3Reader`` options. Defaults to the
            environment's settings (``AWS_ENDPOINT_URL``, profiles).
        cache_dir (str | PathLike | False | None): a folder on this node where remote shards are kept whole,
            shared by every worker and rank on the node (each downloaded once per node, when first read).
            None: ``$FASTDATA_CACHE_DIR/remote`` when that variable is set, else no cache; False: no cache.
            See docs/s3.md. Defaults to None.
        cache_limit (int | str | None): the most bytes the cache folder may hold (``"50GB"`` or bytes); least
            recently used shards no reader on the node has open are deleted to keep under it. None:
            ``$FASTDATA_CACHE_LIMIT`` when set, else no limit. Defaults to None.
        cache_check ("epoch" | "build"): when a cached shard's version is asked of the store: once per epoch
            and node (a HEAD by the first process that opens it: one replaced between epochs is read as
            it is now), or once per node after the dataset was built (fewer requests; a replacement is
            seen by a dataset built later). Defaults to "epoch".
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        decode: DecodeMode | Decoder | Callable[[Sample], Sample] = "raw",
        transform: Callable[[Sample], Any] | None = None,
        fields: FieldSpec | None = None,
        on_error: OnError = "raise",
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        max_open: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: CacheDir = None,
        cache_limit: int | str | None = None,
        cache_check: CacheCheck = "epoch",
    ) -> None:
        shard_urls = tar_urls(urls, storage_options)
        cache = choose_cache(cache_dir, cache_limit, shard_urls, storage_options)
        self._init_base(
            seed=seed,
            on_error=on_error,
            rank=rank,
            world_size=world_size,
            counters=remote_counters(shard_urls, cached=cache is not None),
        )
        if cache is not None:
            cache.count_into(self._shared)
        self.source = TarSource(
            shard_urls,
            policy=self._policy,
            decoder=with_fields(fields, make_decoder(decode)),
            transform=transform,
            max_open=max_open,
            storage_options=storage_options,
            stats=self._shared,
            cache=cache,
            cache_check=cache_check,
        )
        self._starts = [0, *accumulate(self.source.counts)]
        self._shards: int | None = None  # resume_plan()'s digest, made on first use

    @property
    def urls(self) -> list[str]:
        return self.source.urls

    def __len__(self) -> int:
        return self._starts[-1]

    def resume_plan(self) -> dict[str, int]:
        """The data a resume state's indices name (its shards' names, order and sample counts), checked on loading
        (see :class:`fastdata.core.ResumeState`)."""
        if self._shards is None:  # once: the shards do not change
            self._shards = data_digest(self.urls, self.source.counts)
        return {"shards": self._shards}

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard number, sample number in that shard)`` of dataset index ``i``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for {n} samples")
        i %= n
        shard = bisect.bisect_right(self._starts, i) - 1
        return shard, i - self._starts[shard]

    def __getitem__(self, i: int) -> Any:
        self.follow_epoch()
        shard, local = self.locate(i)
        got = self.source.read(shard, [local])
        return slot_sample(got[0] if got else self._stand_in([i % len(self)], self._good, [self.urls[shard]])[1])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch's samples; skipped bad ones are left out (the DataLoader calls this to batch)."""
        self.follow_epoch()
        out: list[Any] = []
        run: list[int] = []
        run_shard = -1
        for i in indices:
            shard, local = self.locate(i)
            if shard != run_shard and run:
                out.extend(self.source.read(run_shard, run))
                run = []
            run_shard = shard
            run.append(local)
        if run:
            out.extend(self.source.read(run_shard, run))
        if not out and indices:  # all bad: a batch of one substitute, so that the rank keeps its batch count
            bad = [i % len(self) for i in indices]
            shards = [self.urls[s] for s in dict.fromkeys(self.locate(i)[0] for i in bad)]
            out = [self._stand_in(bad, self._good, shards)[1]]
        return list(slot_samples(iter(out)))  # batched by the DataLoader: its batches travel in slots

    def _good(self, indices: list[int]) -> list[tuple[int, Any]]:
        """``(index, sample)`` of the good samples among ``indices``, in order (a substitute search)."""
        out: list[tuple[int, Any]] = []
        runs: list[tuple[int, list[int], list[int]]] = []  # (shard, samples in it, their indices)
        for i in indices:
            shard, local = self.locate(i)
            if not runs or runs[-1][0] != shard:
                runs.append((shard, [], []))
            runs[-1][1].append(local)
            runs[-1][2].append(i)
        pipeline = self.source.pipeline
        for shard, which, idx in runs:
            kept: list[int] = []
            got = self.source.read(shard, which, decode=False, kept=kept)
            raw = dict(zip(kept, got))
            for local, i in zip(which, idx):
                if local in raw:
                    sample, _ = pipeline(raw[local])
                    if sample is not SKIP:
                        out.append((i, sample))
        return out

    def warm(self) -> None:
        """Open this worker's first shard reader before the first batch is asked for."""
        if self.urls:
            self.source.index(self.urls[0])

    def close(self) -> None:
        self.source.close()

    def __repr__(self) -> str:
        return f"IndexedTarDataset({len(self.urls)} shards, {len(self)} samples)"
