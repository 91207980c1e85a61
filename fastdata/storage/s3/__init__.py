"""S3 and S3-compatible object stores: a pooled botocore client per process and per settings
(:class:`S3Config`), ranged reads with retries (:class:`S3Reader`), listings, uploads, and the request
counters of this process. Imports boto3."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.storage.s3._reader import (
        COUNTERS,
        ObjectChanged,
        S3Config,
        S3CredentialsMissing,
        S3Reader,
        S3Unavailable,
        S3Unreachable,
        Stats,
        process_counters,
        release,
        upload_file,
    )
    from fastdata.storage.s3._upload import UploadFailed

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "COUNTERS": "._reader",
        "ObjectChanged": "._reader",
        "S3Config": "._reader",
        "S3CredentialsMissing": "._reader",
        "S3Reader": "._reader",
        "S3Unavailable": "._reader",
        "S3Unreachable": "._reader",
        "Stats": "._reader",
        "process_counters": "._reader",
        "release": "._reader",
        "upload_file": "._reader",
        "UploadFailed": "._upload",
    },
)

__all__ = [
    "COUNTERS",
    "ObjectChanged",
    "S3Config",
    "S3CredentialsMissing",
    "S3Reader",
    "S3Unavailable",
    "S3Unreachable",
    "Stats",
    "UploadFailed",
    "process_counters",
    "release",
    "upload_file",
]
