"""A real S3-compatible server for tests and benchmarks: moto in server mode, in its own process.

The launcher lives in the package (:mod:`fastdata.bench._local_s3`, which ``fastdata bench --demo``
uses too); this module re-exports it for the tests and adds their upload helper.

Usable outside pytest (the benchmarks start one)::

    with MotoServer() as server:
        client = server.client()
        client.create_bucket(Bucket="data")
"""

from __future__ import annotations

import os
from typing import Any

from fastdata.bench._local_s3 import CREDENTIALS, REGION, START_TIMEOUT_S, MotoServer

__all__ = ["CREDENTIALS", "REGION", "START_TIMEOUT_S", "MotoServer", "upload_files"]


def upload_files(client: Any, bucket: str, files: dict[str, bytes | str | os.PathLike[str]]) -> list[str]:
    """Put ``{key: bytes or local path}`` into ``bucket``; returns the ``s3://`` URLs, in order."""
    urls = []
    for key, data in files.items():
        if isinstance(data, bytes):
            client.put_object(Bucket=bucket, Key=key, Body=data)
        else:
            client.upload_file(os.fspath(data), bucket, key)
        urls.append(f"s3://{bucket}/{key}")
    return urls
