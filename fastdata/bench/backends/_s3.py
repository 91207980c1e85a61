"""The S3 backend of ``fastdata bench``: objects under a prefix, or tar shards, read from S3.

SPEC:

* ``s3://bucket/prefix/`` (or a manifest ``s3://bucket/list.json``, ``.txt``): one sample per object,
  through :class:`~fastdata.S3Dataset`. A prefix whose objects are all tar shards (beside their ``.idx``
  sidecars and a ``manifest.json``, as ``fastdata convert SRC s3://... --format tar`` writes) is read as
  shards instead (``-o shards=false`` forces objects);
* ``s3://bucket/train-{000000..000099}.tar``: tar shards streamed from S3 through
  :class:`~fastdata.TarShardDataset` (``-o indexed=true``: :class:`~fastdata.IndexedTarDataset`).

Endpoint, region and credentials come from the standard AWS chain (``AWS_ENDPOINT_URL``, profiles,
the environment), or from ``-o endpoint_url=http://127.0.0.1:9000`` and the other non-secret fields of
:class:`~fastdata.storage.s3.S3Config` (``region_name``, ``profile_name``, ``anonymous``,
``max_attempts``, ``concurrency`` ...). Credentials are not taken as options: options are written to
the report; from Python, pass ``config=S3Config(...)`` (its repr hides them). Other options: ``decode``,
``on_error``, ``seed``; for objects ``lookahead``, ``on_missing``, ``cache``, ``page_size``; for shards
``indexed``, ``shuffle``, ``shuffle_window``, ``max_open`` and the reader's ``readahead``, ``part_size``,
``coalesce_gap``, ``prefetch``, ``max_prefetch``, ``cache_bytes``, ``open_bytes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from braceexpand import braceexpand

from fastdata.bench.backends import DemoUnavailable, require
from fastdata.core.errors import ConfigError

require("boto3", extra="s3")

NAME = "s3"
PRIORITY = 40  # after hdf5 and video, which claim s3:// names with their extensions (to say "local only")
EXTRA = "s3"
DEMO_BATCH_SIZE = 32
DEMO_OPTIONS: dict[str, Any] = {"decode": "torch"}
DEMO_OBJECTS = 384  # moto stores ~100 objects/s here: the upload takes a few seconds
DEMO_SIZE = (128, 128)
DEMO_BUCKET = "fastdata-demo"
DEMO_UPLOAD_THREADS = 8

SECRETS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token"})
_COMMON = {"decode", "on_error", "seed", "config", "shards"}
_OBJECTS = {"lookahead", "on_missing", "cache", "page_size"}
_SHARDS = {"indexed", "shuffle", "shuffle_window", "max_open"}
_READER = {"readahead", "part_size", "coalesce_gap", "prefetch", "max_prefetch", "cache_bytes", "open_bytes"}
SIDECARS = (".idx",)
MANIFEST = "manifest.json"


def _config_fields() -> set[str]:
    from fastdata.storage.s3 import S3Config

    return {f.name for f in dataclasses.fields(S3Config)} - SECRETS


def detect(spec: str) -> bool:
    """Any ``s3://`` SPEC (HDF5 and video names on S3 are claimed first by their backends)."""
    return spec.lower().startswith("s3://")


def _is_shard(url: str) -> bool:
    return url.endswith(".tar")


def _prefix_holds_shards(url: str, config: Any) -> bool:
    """Whether the first page of the listing of prefix ``url`` holds tar shards and nothing else but their
    sidecars and manifest (one request; the dataset lists the prefix itself)."""
    from fastdata.storage.s3 import Stats, call, parse_url, release

    bucket, prefix = parse_url(url)
    try:
        page = call(config, Stats(), url, lambda s3: s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1000))
    finally:
        release(config)  # the parent keeps no connection open into the DataLoader's fork
    keys = [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    data = [k for k in keys if not k.endswith(SIDECARS) and posixpath.basename(k) != MANIFEST]
    return bool(data) and all(_is_shard(k) for k in data)


def _shard_urls(url: str, config: Any) -> list[str]:
    from fastdata.storage.s3 import Stats, list_prefix, release

    try:
        urls, _ = list_prefix(url, config, Stats())
    finally:
        release(config)
    return [u for u in urls if _is_shard(u)]


def _check(options: dict[str, Any], allowed: set[str], what: str) -> None:
    secrets = sorted(SECRETS & set(options))
    if secrets:
        raise ConfigError(
            f"s3 backend: {', '.join(secrets)} cannot be an option (options are written to the "
            "report); use the AWS chain (AWS_ACCESS_KEY_ID ..., AWS_PROFILE) or, from Python, "
            "config=S3Config(...), whose repr hides them"
        )
    unknown = set(options) - allowed
    if unknown:
        raise ConfigError(
            f"s3 backend ({what}): unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(allowed))}"
        )


def open(spec: str, **options: Any) -> Any:
    """An :class:`~fastdata.S3Dataset` over the objects of ``spec``, or a tar-shard dataset over its shards."""
    import fastdata as fd
    from fastdata.storage.s3 import S3Config

    s3_fields = _config_fields()
    _check(options, _COMMON | _OBJECTS | _SHARDS | _READER | s3_fields, "any SPEC")
    config = S3Config.from_options(
        options.pop("config", None), **{k: options.pop(k) for k in list(options) if k in s3_fields}
    )
    shards = options.pop("shards", None)
    first = next(iter(braceexpand(spec)), spec)
    if shards is None:
        if _is_shard(first):
            shards = True
        elif first.endswith((".json", ".txt")):
            shards = False  # a manifest of objects
        else:
            shards = _prefix_holds_shards(first, config)
    if not shards:
        _check(options, _COMMON | _OBJECTS, "objects")
        return fd.S3Dataset(spec, config=config, **options)
    _check(options, _COMMON | _SHARDS | _READER, "tar shards")
    urls: str | list[str] = spec if _is_shard(first) else _shard_urls(first, config)
    if not urls:
        raise ConfigError(f"{spec}: no .tar shards under this prefix; pass -o shards=false to read its objects")
    storage = {"config": config, **{k: options.pop(k) for k in list(options) if k in _READER}}
    if options.pop("indexed", False):
        options.pop("shuffle", None)  # map-style: the sweep's sampler shuffles
        options.pop("shuffle_window", None)
        return fd.IndexedTarDataset(urls, storage_options=storage, **options)
    options.setdefault("shuffle", True)
    return fd.TarShardDataset(urls, storage_options=storage, **options)


def upload_demo_objects(
    client: Any,
    bucket: str,
    prefix: str,
    *,
    objects: int = DEMO_OBJECTS,
    size: tuple[int, int] = DEMO_SIZE,
    seed: int = 0,
) -> list[str]:
    """``objects`` photo-like JPEGs (``prefix/NNNNNN.jpg``) put into ``bucket`` by a few threads;
    returns their URLs."""
    from fastdata.bench.backends._tar import DemoImages

    images = DemoImages(np.random.default_rng(seed), size)
    keys = [f"{prefix}{i:06d}.jpg" for i in range(objects)]
    bodies = [images.jpeg() for _ in keys]  # made here: the generator is not thread-safe
    with ThreadPoolExecutor(DEMO_UPLOAD_THREADS) as pool:  # a boto3 client may be shared by threads
        list(pool.map(lambda kb: client.put_object(Bucket=bucket, Key=kb[0], Body=kb[1]), zip(keys, bodies)))
    return [f"s3://{bucket}/{k}" for k in keys]


@contextlib.contextmanager
def demo(folder: Path, scale: float = 1.0) -> Iterator[tuple[str, dict[str, Any]]]:
    """A local S3 server (moto, its own process, 127.0.0.1, a free port) holding 384 JPEGs (128x128, about
    3 MB; ``scale`` times as many), read one object per sample. The endpoint and the server's dummy
    credentials reach the dataset explicitly, in an :class:`~fastdata.storage.s3.S3Config` (whose
    repr, the form written to the report, hides the credentials); nothing is set in the environment. The
    listing is kept in ``folder``, so that the sweep lists the prefix once. The server stops on exit, also
    after an error or Ctrl-C.

    Raises:
        DemoUnavailable: moto (the ``demo`` extra) is not installed.
    """
    from fastdata.bench import _local_s3 as local_s3
    from fastdata.storage.s3 import S3Config

    why = local_s3.missing()
    if why is not None:
        raise DemoUnavailable(f"the S3 demo needs a local S3 server: {why}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with local_s3.MotoServer() as server:
        client = server.client()
        try:
            client.create_bucket(Bucket=DEMO_BUCKET)
            upload_demo_objects(client, DEMO_BUCKET, "images/", objects=max(32, round(DEMO_OBJECTS * scale)))
        finally:
            client.close()
        yield (
            f"s3://{DEMO_BUCKET}/images/",
            {"config": S3Config(**server.options()), "cache": str(folder / "listing.json")},
        )
