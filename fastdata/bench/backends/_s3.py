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
the report; from Python, pass ``config=S3Config(...)`` (its repr hides them).

The pipeline measured is the local tar backend's (:mod:`fastdata.bench.backends`): ``decode`` defaults
to "torch" and images of different sizes are resized so that they batch; ``size`` (``HxW``),
``batch_size`` (shards batch in the dataset, ``--batch-size`` by default, ``null`` for the DataLoader;
objects are batched by the DataLoader at ``batch_size``), ``on_error``, ``seed``; ``cache_dir``,
``cache_limit``, ``cache_check`` (the command gives the sweep a temporary fetch cache unless
``cache_dir`` is given; ``false`` reads uncached); for objects ``lookahead``, ``on_missing``, ``cache``
(the listing), ``page_size``; for shards the tar backend's ``fields``, ``indexed``, ``shuffle``,
``shuffle_window``, ``max_open`` and the reader's ``readahead``, ``part_size``, ``coalesce_gap``,
``prefetch``, ``max_prefetch``, ``cache_bytes``, ``open_bytes``.
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
from fastdata.bench.backends._shards import OPTIONS as SHARD_OPTIONS
from fastdata.bench.backends._shards import fetched_bytes, open_shards, peek
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
DEFAULT_DECODE = "torch"  # as the tar backend: what training reads (fastdata.bench.backends._shards)
DATASET_BATCHES = True  # shards do (batches_in_dataset); objects hand -o batch_size to the DataLoader
FETCH_CACHE = True  # the command gives the sweep a fetch cache: each remote byte fetched once per run
_CACHE = {"cache_dir", "cache_limit", "cache_check"}
_COMMON = {"decode", "size", "on_error", "seed", "config", "shards", "batch_size", *_CACHE}
_OBJECTS = {"lookahead", "on_missing", "cache", "page_size"}
_SHARDS = set(SHARD_OPTIONS) - _COMMON
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


def _listing(url: str, config: Any) -> dict[str, int]:
    """Every object under prefix ``url`` and its size in bytes."""
    from fastdata.storage.s3 import Stats, list_prefix, release

    try:
        urls, sizes = list_prefix(url, config, Stats())
    finally:
        release(config)
    return dict(zip(urls, sizes))


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


@dataclasses.dataclass
class _Source:
    """What an ``s3://`` SPEC reads, resolved from its options: the client settings, shards or objects,
    and the options left for the dataset."""

    spec: str
    config: Any
    shards: bool
    options: dict[str, Any]

    @property
    def first(self) -> str:
        return next(iter(braceexpand(self.spec)), self.spec)

    def shard_urls(self) -> list[str]:
        if _is_shard(self.first):
            return list(braceexpand(self.spec))
        urls = [u for u in _listing(self.first, self.config) if _is_shard(u)]
        if not urls:
            raise ConfigError(
                f"{self.spec}: no .tar shards under this prefix; pass -o shards=false to read its objects"
            )
        return urls

    def stored_bytes(self, shard_urls: list[str] | None = None) -> int | None:
        """The bytes of the data read (``shard_urls``, or the objects under the prefix); None where they are
        not all listed (a manifest of objects, a pattern naming shards that are not there)."""
        if self.first.endswith((".json", ".txt")):
            return None
        folder = posixpath.dirname(self.first) + "/" if _is_shard(self.first) else self.first
        sizes = _listing(folder, self.config)
        if shard_urls is None:
            return sum(sizes.values())
        found = [sizes[u] for u in shard_urls if u in sizes]
        return sum(found) if len(found) == len(shard_urls) else None


def _resolve(spec: str, options: dict[str, Any]) -> _Source:
    from fastdata.storage.s3 import S3Config

    s3_fields = _config_fields()
    _check(options, _COMMON | _OBJECTS | _SHARDS | _READER | s3_fields, "any SPEC")
    options = dict(options)
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
    if shards:
        _check(options, _COMMON | _SHARDS | _READER, "tar shards")
    else:
        _check(options, _COMMON | _OBJECTS, "objects")
    return _Source(spec, config, bool(shards), options)


def batches_in_dataset(spec: str, options: dict[str, Any]) -> bool:
    """Tar shards batch in the dataset, as local ones; objects (one sample per object) do not."""
    return _resolve(spec, options).shards


def prepare(spec: str, options: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The options to sweep (``decode`` chosen so that batches batch, as for local shards: see
    :mod:`fastdata.bench.backends`), which decode that is, and facts for the report: what is read
    (``source``), the bytes stored and the bytes this preparation fetched (a few samples looked at,
    through the sweep's fetch cache when it has one), and for objects the DataLoader's batch size."""
    from fastdata.bench.backends._sizing import PEEK, plan_decode

    src = _resolve(spec, options)
    opts = dict(src.options)
    cache = {k: opts.pop(k) for k in list(opts) if k in _CACHE}
    facts: dict[str, Any] = {"fetched_bytes": 0}
    urls: list[str] | None = None  # the shards, or None: objects

    if src.shards:
        urls = src.shard_urls()
        reader = {k: opts.pop(k) for k in list(opts) if k in _READER}
        facts["source"] = f"s3 tar shards ({len(urls)})"

        def look() -> list[Any]:
            # the first shard only: through the fetch cache it is then read by the sweep, not fetched again
            samples, fetched = peek(urls[:1], PEEK, storage_options={"config": src.config, **reader}, **cache)
            facts["fetched_bytes"] += fetched
            return samples

        out, note = plan_decode(opts, DEFAULT_DECODE, look, batches=True)
        out.update(reader)
    else:
        batch = opts.pop("batch_size", None)
        if batch is not None:
            facts["loader_batch_size"] = batch  # one sample per object: the DataLoader batches
        facts["source"] = "s3 objects (one sample per object)"

        def look_objects() -> list[Any]:
            import fastdata as fd

            ds = fd.S3Dataset(spec, config=src.config, decode="raw", lookahead=0, **cache)
            try:
                picks: Any = np.unique(np.linspace(0, len(ds) - 1, min(PEEK, len(ds))).astype(int)) if len(ds) else []
                samples = [ds[int(i)] for i in picks]
                facts["fetched_bytes"] += fetched_bytes(ds)
                return samples
            finally:
                ds.close()

        out, note = plan_decode(opts, DEFAULT_DECODE, look_objects, batches=True)
    facts["stored_bytes"] = src.stored_bytes(urls)
    out.update(cache)
    out["config"], out["shards"] = src.config, src.shards
    return out, note, facts


def open(spec: str, **options: Any) -> Any:
    """An :class:`~fastdata.S3Dataset` over the objects of ``spec``, or a tar-shard dataset over its
    shards, with the options the local tar backend takes (``decode`` defaults to "torch")."""
    import fastdata as fd
    from fastdata.bench.backends._sizing import parse_size

    src = _resolve(spec, options)
    opts = dict(src.options)
    cache = {k: opts.pop(k) for k in list(opts) if k in _CACHE}
    if not src.shards:
        opts.pop("batch_size", None)  # one sample per object: the DataLoader batches (prepare says so)
        opts.setdefault("decode", DEFAULT_DECODE)
        size = opts.pop("size", None)
        if size is not None:
            opts["decode"] = fd.Decoder(opts["decode"], size=parse_size(size))
        return fd.S3Dataset(spec, config=src.config, **opts, **cache)
    urls: str | list[str] = spec if _is_shard(src.first) else src.shard_urls()
    storage = {"config": src.config, **{k: opts.pop(k) for k in list(opts) if k in _READER}}
    return open_shards(urls, opts, storage_options=storage, **cache)


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
