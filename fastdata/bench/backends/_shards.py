"""Tar shards as ``fastdata bench`` measures them, wherever they live: the options, the dataset, a peek.

One copy for the ``tar`` backend (local shards) and the ``s3`` backend (shards on S3), so that a shard
pattern measures the same pipeline local or remote: decoded to tensors (``decode="torch"``) and batched
in the dataset (``batch_size``) as training reads it, with the same ``-o`` options. The remote backend
adds only where the bytes come from (``storage_options``, ``cache_dir`` ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_DECODE = "torch"

OPTIONS = frozenset(
    {
        "decode",
        "size",
        "fields",
        "indexed",
        "shuffle",
        "shuffle_window",
        "on_error",
        "max_open",
        "seed",
        "batch_size",
    }
)
"""The ``-o`` options every shard source takes (see :mod:`fastdata.bench.backends`)."""


def open_shards(urls: str | list[str], options: dict[str, Any], **source: Any) -> Any:
    """A :class:`~fastdata.TarShardDataset` over ``urls`` (with ``indexed=True`` an
    :class:`~fastdata.IndexedTarDataset`, batched by the DataLoader), from the ``-o`` options; ``source``
    are the keywords of where the bytes come from (``storage_options``, ``cache_dir``, ...)."""
    import fastdata as fd
    from fastdata.bench.backends._sizing import parse_size

    options = dict(options)
    indexed = bool(options.pop("indexed", False))
    options.setdefault("decode", DEFAULT_DECODE)
    size = options.pop("size", None)
    if size is not None:
        options["decode"] = fd.Decoder(options["decode"], size=parse_size(size))
    if indexed:
        options.pop("shuffle", None)  # map-style: the sweep's sampler shuffles
        options.pop("shuffle_window", None)
        options.pop("batch_size", None)  # map-style: the DataLoader batches
        return fd.IndexedTarDataset(urls, **options, **source)
    options.setdefault("shuffle", True)
    return fd.TarShardDataset(urls, **options, **source)


def peek(urls: list[str], peek_count: int, **source: Any) -> tuple[list[Any], int]:
    """A few raw samples spread over the shards (read through their indexes), or the first few of a
    stream where the shards cannot be read at random (compressed ones); and the bytes fetched from a
    store to read them (0 for local shards)."""
    import fastdata as fd
    from fastdata.core.errors import FastdataError

    try:
        ds: Any = fd.IndexedTarDataset(urls, **source)
        try:
            picks: Any = np.unique(np.linspace(0, len(ds) - 1, min(peek_count, len(ds))).astype(int)) if len(ds) else []
            return [ds[int(i)] for i in picks], fetched_bytes(ds)
        finally:
            ds.close()
    except FastdataError:
        ds = fd.TarShardDataset(urls, on_error="skip", **source)
        try:
            return [s for _, s in zip(range(peek_count), ds)], fetched_bytes(ds)
        finally:
            ds.close()


def fetched_bytes(ds: Any) -> int:
    """Bytes ``ds`` (a fastdata dataset) received from a remote store, over every process that read it:
    its ``s3_bytes`` counter (downloads into a cache included); 0 for local data."""
    counters = getattr(ds, "counters", None)
    if not callable(counters):
        return 0
    try:
        return int(counters().get("s3_bytes", 0))
    except Exception:  # noqa: BLE001 - a closed or foreign dataset: nothing to count
        return 0


__all__ = ["DEFAULT_DECODE", "OPTIONS", "fetched_bytes", "open_shards", "peek"]
