"""Which objects an S3 dataset reads: a prefix listed once, a list of URLs, or a manifest file.

Listing is paginated (``list_objects_v2``, ``page_size`` keys a request) with a progress bar once a
prefix needs more than one page, and its result can be cached to a file, so that a job restarted on
ten million objects does not list them again. A cache or manifest file is JSON::

    {"format": "fastdata-s3-objects", "version": 1, "source": "s3://bucket/prefix/",
     "urls": ["s3://bucket/prefix/a.jpg", ...], "sizes": [30512, ...]}

A manifest may also be a JSON list of URLs, or a ``.txt`` file with one URL per line (``#`` comments).
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fastdata.core import Bar, progress_bar
from fastdata.core.errors import ConfigError, FastdataError, SourceNotFound
from fastdata.storage import scheme
from fastdata.storage.s3._client import S3Config, Stats, parse_url
from fastdata.storage.s3._fetch import call

FORMAT = "fastdata-s3-objects"
MANIFEST_SUFFIXES = (".json", ".txt")


def list_prefix(
    url: str, config: S3Config, stats: Stats, *, page_size: int = 1000, progress: bool | None = None
) -> tuple[list[str], list[int]]:
    """Every object under ``s3://bucket/prefix`` (recursively, in key order) and its size in bytes.

    Keys ending in ``/`` (folder markers made by consoles) are left out.

    Args:
        page_size (int): keys per request (S3 returns at most 1000). Defaults to 1000.
        progress (bool | None): show a progress bar; None shows one once a second page is needed.

    Raises:
        SourceNotFound: no such bucket, or nothing under the prefix.
    """
    bucket, prefix = parse_url(url)
    urls: list[str] = []
    sizes: list[int] = []
    token: str | None = None
    bar: Bar | None = None
    with ExitStack() as shown:  # the bar, once a second page says the listing is long
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
            if token:
                kwargs["ContinuationToken"] = token
            page = call(config, stats, url, lambda s3, kw=kwargs: s3.list_objects_v2(**kw))  # type: ignore[misc]
            contents = page.get("Contents", [])
            for obj in contents:
                key = obj["Key"]
                if not key.endswith("/"):
                    urls.append(f"s3://{bucket}/{key}")
                    sizes.append(int(obj["Size"]))
            truncated = bool(page.get("IsTruncated"))
            if bar is None and (progress or (progress is None and truncated)):
                bar = shown.enter_context(progress_bar(f"fastdata: listing {url}", unit="objects"))
            if bar is not None:
                bar.advance(len(contents))
            if not truncated:
                break
            token = page["NextContinuationToken"]
    if not urls:
        raise SourceNotFound(
            f"{url}: no objects under this prefix; check the bucket, the prefix and the endpoint ({config.endpoint})"
        )
    return urls, sizes


def _read_text(path: str, config: S3Config, stats: Stats) -> str:
    if scheme(path) == "s3":
        from fastdata.storage.s3._reader import S3Reader

        with S3Reader(path, config=config, stats=stats) as reader:
            return reader.read(0, reader.size).decode("utf-8")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise SourceNotFound(f"{path}: no such manifest file") from None


def read_object_list(path: str, config: S3Config, stats: Stats) -> tuple[list[str], list[int], str | None]:
    """``(urls, sizes, source)`` from a manifest or cache file (local or ``s3://``); unknown sizes are -1."""
    text = _read_text(path, config, stats)
    if path.endswith(".txt"):
        urls = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        return check_urls(urls, path), [-1] * len(urls), None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise FastdataError(
            f"{path}: not valid JSON ({e}); expected a list of s3:// URLs or {{'urls': [...], 'sizes': [...]}}"
        ) from None
    if isinstance(data, list):
        return check_urls(data, path), [-1] * len(data), None
    if not isinstance(data, dict) or not isinstance(data.get("urls"), list):
        raise FastdataError(f"{path}: expected a list of s3:// URLs or an object with 'urls' (and 'sizes')")
    urls = check_urls(data["urls"], path)
    sizes = [int(s) for s in data.get("sizes", [-1] * len(urls))]
    if len(sizes) != len(urls):
        raise FastdataError(f"{path}: {len(urls)} urls but {len(sizes)} sizes; rewrite it")
    return urls, sizes, data.get("source")


def check_urls(urls: list[Any], where: str) -> list[str]:
    """``urls`` if every one is ``s3://bucket/key`` (a key, not a prefix); else a ConfigError naming it."""
    if not urls:
        raise SourceNotFound(f"{where}: lists no objects")
    for url in urls:
        if not isinstance(url, str):
            raise ConfigError(f"{where}: {url!r} is not an s3:// URL")
        _, key = parse_url(url)
        if not key or key.endswith("/"):
            raise ConfigError(f"{where}: {url!r} names a prefix, not an object")
    return list(urls)


def write_object_list(path: str | os.PathLike[str], urls: list[str], sizes: list[int], source: str | None) -> None:
    """Write a listing to a local file, atomically (a crash leaves the old file or none)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".listing-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "version": 1, "source": source, "urls": urls, "sizes": sizes}, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def resolve(
    source: Any,
    config: S3Config,
    stats: Stats,
    *,
    cache: str | os.PathLike[str] | None = None,
    page_size: int = 1000,
    progress: bool | None = None,
) -> tuple[list[str], list[int]]:
    """The objects of an S3 dataset's ``source``: a prefix (listed, or read from ``cache`` when that
    file lists the same prefix), a manifest file (``.json``/``.txt``), or a list of URLs."""
    if isinstance(source, (str, os.PathLike)):
        spec = os.fspath(source)
        if spec.endswith(MANIFEST_SUFFIXES):
            urls, sizes, _ = read_object_list(spec, config, stats)
            return urls, sizes
        if scheme(spec) != "s3":
            raise ConfigError(
                f"{spec!r}: give an s3://bucket/prefix/, a list of s3:// URLs, or a manifest "
                f"file ending in {' or '.join(MANIFEST_SUFFIXES)}"
            )
        parse_url(spec)
        if cache is not None and Path(cache).exists():
            urls, sizes, listed = read_object_list(os.fspath(cache), config, stats)
            if listed == spec:
                return urls, sizes
        urls, sizes = list_prefix(spec, config, stats, page_size=page_size, progress=progress)
        if cache is not None:
            write_object_list(cache, urls, sizes, spec)
        return urls, sizes
    urls = check_urls([os.fspath(u) for u in source], "the list of URLs")
    return urls, [-1] * len(urls)
