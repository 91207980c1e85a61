"""S3 and S3-compatible object stores: a pooled botocore client per process and per settings
(:class:`S3Config`), ranged reads with retries (:class:`S3Reader`), listings, uploads, and the request
counters of this process. Imports boto3."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.storage._remote import ObjectChanged
    from fastdata.storage.s3._client import COUNTERS, MiB, S3Config, Stats, client, parse_url, process_counters, release
    from fastdata.storage.s3._download import S3Remote
    from fastdata.storage.s3._fetch import S3CredentialsMissing, S3Unavailable, S3Unreachable, call, get
    from fastdata.storage.s3._list import list_prefix, resolve
    from fastdata.storage.s3._reader import S3Reader, executor
    from fastdata.storage.s3._upload import UploadFailed, finish_upload, start_upload, transfer_config, upload_file

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "COUNTERS",
    "MiB",
    "ObjectChanged",
    "S3Config",
    "S3CredentialsMissing",
    "S3Reader",
    "S3Remote",
    "S3Unavailable",
    "S3Unreachable",
    "Stats",
    "UploadFailed",
    "call",
    "client",
    "executor",
    "finish_upload",
    "get",
    "list_prefix",
    "parse_url",
    "process_counters",
    "release",
    "resolve",
    "start_upload",
    "transfer_config",
    "upload_file",
]
