"""Uploading one local file to S3, verified (size and SHA-256), multipart when large.

The conversion's ordering of uploads (shards as they are finished, the manifest last) lives in
:mod:`fastdata.convert`; this module knows files and objects only.

An S3 object appears whole or not at all (a multipart upload becomes visible only when completed).
Multipart uploads, their parallel parts and retries are boto3's transfer manager's.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from fastdata.core.errors import FastdataError, SourceNotFound
from fastdata.storage.s3._client import MiB, S3Config, Stats, client, parse_url
from fastdata.storage.s3._fetch import call, translate

SHA256_KEY = "sha256"  # object metadata (x-amz-meta-sha256) holding the file's digest


class UploadFailed(FastdataError, OSError):
    """A file could not be uploaded, or the object does not match the file afterwards."""


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a local file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 * MiB):
            digest.update(block)
    return digest.hexdigest()


def transfer_config(config: S3Config, multipart_threshold: int, part_size: int) -> Any:
    """boto3's ``TransferConfig``: multipart above ``multipart_threshold`` bytes, ``config.threads`` at once."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=multipart_threshold,
        multipart_chunksize=part_size,
        max_concurrency=config.threads,
        use_threads=True,
    )


def _remote(config: S3Config, stats: Stats, url: str) -> dict[str, Any] | None:
    """The object's HEAD response, or None when there is no such key."""
    bucket, key = parse_url(url)
    try:
        return call(config, stats, url, lambda s3: s3.head_object(Bucket=bucket, Key=key))  # type: ignore[no-any-return]
    except SourceNotFound as e:
        if "no such bucket" in str(e):
            raise
        return None


def _verify(config: S3Config, stats: Stats, url: str, size: int, sha256: str) -> None:
    head = _remote(config, stats, url)
    if head is None or int(head["ContentLength"]) != size or head.get("Metadata", {}).get(SHA256_KEY) != sha256:
        got = "missing" if head is None else f"{head['ContentLength']} bytes"
        raise UploadFailed(
            f"{url}: after the upload the object is {got}, the file has {size} bytes "
            "(or another sha256); upload it again"
        )


def _existing_matches(config: S3Config, stats: Stats, url: str, size: int, sha256: str) -> bool:
    head = _remote(config, stats, url)
    return (
        head is not None and int(head["ContentLength"]) == size and head.get("Metadata", {}).get(SHA256_KEY) == sha256
    )


def upload_file(
    path: str | os.PathLike[str],
    url: str,
    *,
    config: S3Config | None = None,
    sha256: str | None = None,
    skip_existing: bool = False,
    multipart_threshold: int = 64 * MiB,
    part_size: int = 16 * MiB,
    stats: Stats | None = None,
    **options: Any,
) -> bool:
    """Upload a finished local file to ``url`` (``s3://bucket/key``) and check the object afterwards.

    Files from ``multipart_threshold`` bytes up go in ``part_size`` parts, ``config.threads`` at a
    time. The file's SHA-256 is stored as object metadata (``x-amz-meta-sha256``) and checked, with
    the size, by a HEAD after the upload.

    Args:
        path: the local file.
        url (str): where it goes.
        config (S3Config | None): endpoint, credentials ... Defaults to ``S3Config(**options)``.
        sha256 (str | None): the file's hex SHA-256 if already known (the converter computes it for the
            manifest). Defaults to computing it.
        skip_existing (bool): leave an object that already has this size and SHA-256 alone (a resumed
            conversion). Defaults to False.
        multipart_threshold (int): bytes from which to upload in parts. Defaults to 64 MiB.
        part_size (int): bytes per part (S3's minimum is 5 MiB). Defaults to 16 MiB.

    Returns:
        bool: True if uploaded, False if skipped as already there.

    Raises:
        SourceNotFound: no such bucket (or local file). SourceUnreadable: access denied.
        UploadFailed: the object does not match the file afterwards.
    """
    config = S3Config.from_options(config, **options)
    stats = stats or Stats()
    future, size, digest = start_upload(path, url, config, stats, sha256, skip_existing, multipart_threshold, part_size)
    if future is None:
        return False
    finish_upload(future, url, config, stats, size, digest)
    return True


def start_upload(
    path: str | os.PathLike[str],
    url: str,
    config: S3Config,
    stats: Stats,
    sha256: str | None,
    skip_existing: bool,
    multipart_threshold: int,
    part_size: int,
    manager: Any = None,
) -> tuple[Any, int, str]:
    """Begin uploading ``path`` to ``url`` (``manager``: a shared transfer manager, else one of its own);
    ``(future, size, sha256)``, the future None when an intact copy is there already (``skip_existing``)."""
    if not os.path.isfile(path):
        raise SourceNotFound(f"{os.fspath(path)}: no such file to upload")
    bucket, key = parse_url(url)
    if not key or key.endswith("/"):
        raise FastdataError(f"{url}: names a prefix; give the object's full key")
    size = os.path.getsize(path)
    digest = sha256 or file_sha256(path)
    if skip_existing and _existing_matches(config, stats, url, size, digest):
        return None, size, digest
    from boto3.s3.transfer import create_transfer_manager

    own = manager is None
    manager = manager or create_transfer_manager(
        client(config), transfer_config(config, multipart_threshold, part_size)
    )
    stats.add("s3_requests")
    future = manager.upload(os.fspath(path), bucket, key, extra_args={"Metadata": {SHA256_KEY: digest}})
    if own:
        future = _Owned(future, manager)
    return future, size, digest


class _Owned:
    """A transfer future that shuts its own transfer manager down once it is done."""

    def __init__(self, future: Any, manager: Any) -> None:
        self.future, self.manager = future, manager

    def result(self) -> Any:
        try:
            return self.future.result()
        finally:
            self.manager.shutdown()


def finish_upload(future: Any, url: str, config: S3Config, stats: Stats, size: int, digest: str) -> None:
    """Wait for an upload :func:`start_upload` began, then check the object's size and SHA-256 by a HEAD."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        future.result()
    except (ClientError, BotoCoreError, S3UploadFailedError, OSError) as e:
        cause = e.__context__ if isinstance(e, S3UploadFailedError) and e.__context__ is not None else e
        raise translate(cause, url, config) from e
    stats.add("s3_bytes", size)
    _verify(config, stats, url, size, digest)
