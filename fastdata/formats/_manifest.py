"""``manifest.json``: what a converted folder holds, written last by ``fastdata convert``.

Readers use it to know each shard's sample count without opening the shard, so that every rank can
plan the epoch at construction. Layout::

    {"format": "tar", "version": 1, "samples": 10000, "bytes": 312000000,
     "classes": ["cat", "dog"], "class_counts": {"cat": 5000, "dog": 5000},
     "shards": [{"name": "train-000000.tar", "samples": 1000, "bytes": 31200000, "sha256": "..."}]}
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from typing import Any

from fastdata.core.errors import FastdataError, SourceNotFound
from fastdata.storage import Reader, open_reader

MANIFEST = "manifest.json"


def parent(url: str) -> str:
    """The folder (or prefix) holding ``url``."""
    return posixpath.dirname(url)


def read_manifest(folder: str, opener: Callable[[str], Reader] = open_reader) -> dict[str, Any] | None:
    """The manifest in ``folder``, or None when there is none.

    Args:
        folder (str): a local folder or an ``s3://bucket/prefix``.
        opener: opens a URL for reading. Defaults to :func:`fastdata.storage.open_reader`.
    """
    url = posixpath.join(folder, MANIFEST) if folder else MANIFEST
    try:
        reader = opener(url)
    except SourceNotFound:
        return None
    try:
        data = reader.read(0, reader.size)
    finally:
        reader.close()
    try:
        manifest: dict[str, Any] = json.loads(data)
    except ValueError as e:
        raise FastdataError(f"{url}: not valid JSON ({e}); delete it or rerun 'fastdata convert'") from None
    return manifest


def shard_listing(urls: list[str], opener: Callable[[str], Reader] = open_reader) -> dict[str, tuple[int, int]]:
    """``(samples, bytes)`` of the shards in ``urls`` that a manifest beside them lists (bytes -1 where it
    gives none)."""
    listed: dict[str, tuple[int, int]] = {}
    for folder in sorted({parent(u) for u in urls}):
        manifest = read_manifest(folder, opener)
        if not manifest:
            continue
        for shard in manifest.get("shards", []):
            url = posixpath.join(folder, shard["name"]) if folder else shard["name"]
            listed[url] = (int(shard["samples"]), int(shard.get("bytes", -1)))
    return {u: listed[u] for u in urls if u in listed}


def sample_counts(urls: list[str], opener: Callable[[str], Reader] = open_reader) -> dict[str, int]:
    """Sample counts of the shards in ``urls`` that a manifest beside them lists."""
    return {u: n for u, (n, _) in shard_listing(urls, opener).items()}
