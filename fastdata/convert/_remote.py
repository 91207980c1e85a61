"""Converting straight to S3: ``fastdata convert SRC s3://bucket/prefix --format tar``.

Shards are written exactly as for a local output (same plan, same bytes, same resume records), into a
local *staging folder*, and each finished shard and its ``.idx`` are uploaded from the main process
while the next shards are written (:class:`~fastdata.convert.ShardUploader`: multipart for
large files, size and sha256 checked by a HEAD afterwards). A shard's local copy is deleted once its
upload is verified, so the staging folder holds only the shards between "written" and "uploaded": at
most ``2 x workers + 2`` of them (writing pauses while that many wait for their upload). The manifest
goes last, after every upload is verified, so a reader never sees a manifest that lists a missing or
half-written shard (S3 shows an object whole or not at all).

Staging folder: ``STAGING/<bucket>-<prefix>-<hash of the URL>/`` where ``STAGING`` is ``staging=``
(``--staging``), by default ``$FASTDATA_CACHE_DIR/convert-staging`` (``~/.cache/fastdata/...``). It is
named after the output URL, so rerunning the same command finds it again; it holds the resume state
(``.fastdata-convert/``) and is deleted once the manifest is uploaded. A killed run leaves it behind:
rerun the same command to resume, or delete it.

Resuming: a shard whose record says it was uploaded counts as done when the listing of the prefix (one
LIST at the start) shows it and its ``.idx`` with the recorded sizes; a shard still in staging is
uploaded (skipped when the object is already there with the same size and sha256); anything else is
written again (the same bytes), and its upload skipped if the object is already intact. The prefix must
hold nothing but what this conversion writes: other objects there are refused before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Any

from fastdata.convert._plan import Plan
from fastdata.convert._resume import ConversionState
from fastdata.core.errors import ConfigError
from fastdata.formats import MANIFEST
from fastdata.storage.s3 import S3Config, Stats, call, parse_url, upload_file


def prefix_url(out: str) -> str:
    """``s3://bucket/prefix/`` (one trailing slash; ``s3://bucket/`` for the whole bucket)."""
    bucket, key = parse_url(out)
    key = key.strip("/")
    return f"s3://{bucket}/{key}/" if key else f"s3://{bucket}/"


def staging_folder(out: str, staging: str | os.PathLike[str] | None = None) -> str:
    """The local staging folder of a conversion to ``out`` (see the module's docstring).

    Args:
        out (str): ``s3://bucket/prefix``.
        staging (str | PathLike | None): the folder to put it in. Defaults to
            ``<cache folder>/convert-staging``.
    """
    from fastdata.core import default_cache_dir

    url = prefix_url(out)
    base = Path(staging) if staging is not None else default_cache_dir() / "convert-staging"
    bucket, key = parse_url(url)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{bucket}-{key}").strip("-.")[:60]
    digest = hashlib.sha1(url.encode()).hexdigest()[:12]
    return str(base / f"{slug}-{digest}")


def list_sizes(url: str, config: S3Config, stats: Stats) -> dict[str, int]:
    """``{name below the prefix: size}`` of every object under ``url`` (empty when there is none).

    Raises:
        SourceNotFound: no such bucket. SourceUnreadable: access denied.
    """
    bucket, prefix = parse_url(url)
    sizes: dict[str, int] = {}
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kwargs["ContinuationToken"] = token
        page = call(config, stats, url, lambda s3, kw=kwargs: s3.list_objects_v2(**kw))  # type: ignore[misc]
        for obj in page.get("Contents", []):
            sizes[obj["Key"][len(prefix) :]] = int(obj["Size"])
        if not page.get("IsTruncated"):
            return sizes
        token = page["NextContinuationToken"]


class RemoteOutput:
    """What a conversion to ``s3://`` does beyond a local one: check the prefix, upload each finished
    shard from the main process, delete its staged copy once verified, and upload the manifest last.

    Args:
        out (str): ``s3://bucket/prefix``.
        staging (str): the staging folder (see :func:`staging_folder`).
        workers (int): shard-writing processes (sizes the staging bound).
        storage_options (dict | None): :class:`~fastdata.storage.s3.S3Config` fields (endpoint,
            credentials, retries ...); the rest comes from the standard AWS chain.
    """

    def __init__(self, out: str, staging: str, *, workers: int, storage_options: dict[str, Any] | None = None) -> None:
        self.url = prefix_url(out)  # a bucket is required
        self.staging = staging
        self.options = dict(storage_options or {})  # what a Ray task rebuilds the config from
        self.config = S3Config.from_options(None, **self.options)
        self.stats = Stats()
        self.max_staged = 2 * workers + 2
        self.state: ConversionState | None = None
        self._uploader: Any = None
        self._waiting: dict[str, dict[str, Any]] = {}  # shard name -> record, staged and queued
        self._verified: set[str] = set()  # URLs whose upload was verified
        self._listed: dict[str, int] = {}  # the prefix's objects when the run started
        self.uploaded = 0  # shards uploaded (or found intact) so far

    # -- before writing ------------------------------------------------------------------------------
    def check_prefix(self, plan: Plan) -> None:
        """List the prefix once; refuse it when it holds objects this conversion would not write.

        Raises:
            ConfigError: it does (nothing is written then). SourceNotFound: no such bucket.
        """
        listed = self._listed = list_sizes(self.url, self.config, self.stats)
        ours = {MANIFEST, *plan.names, *(n + ".idx" for n in plan.names)}
        foreign = sorted(set(listed) - ours)
        if foreign:
            raise ConfigError(
                f"{self.url}: holds {len(foreign)} object(s) this conversion would not write, like "
                f"{foreign[0]!r}; convert into an empty prefix, or delete them first (nothing was written)"
            )

    def done_records(
        self, state: ConversionState, plan: Plan
    ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """Sort the planned shards (after :meth:`check_prefix`): ``(records of the finished ones, records
        of those finished but still staged, to upload)``; the others are to be written."""
        self.state = state
        listed = self._listed
        staged = state.finished(plan)
        done: dict[str, dict[str, Any]] = {}
        for name, record in state.records(plan).items():
            if name in staged:
                continue
            if (
                record.get("uploaded")
                and listed.get(name) == record["bytes"]
                and listed.get(name + ".idx") == record.get("idx_bytes")
            ):
                done[name] = record
        self.uploaded = len(done)
        return {**done, **staged}, [staged[n] for n in plan.names if n in staged]

    def remove_stale_manifest(self) -> None:
        """Delete the manifest of an earlier conversion to this prefix before any new shard lands (what
        :class:`~fastdata.convert.ShardUploader` does on its first upload)."""
        bucket, key = parse_url(self.url + MANIFEST)
        call(self.config, self.stats, self.url + MANIFEST, lambda s3: s3.delete_object(Bucket=bucket, Key=key))

    # -- while writing ---------------------------------------------------------------------------------
    def _up(self) -> Any:
        if self._uploader is None:
            from fastdata.convert._upload import ShardUploader

            self._uploader = ShardUploader(self.url, config=self.config, stats=self.stats, skip_existing=True)
        return self._uploader

    def shard_written(self, record: dict[str, Any]) -> None:
        """Queue the upload of a finished, recorded shard and its ``.idx``; returns at once."""
        name = record["name"]
        up = self._up()
        for file, digest in ((name, record["sha256"]), (name + ".idx", record.get("idx_sha256"))):
            # an object the listing did not show cannot be there intact: no HEAD to find out
            up.skip_existing = file in self._listed
            up.upload(os.path.join(self.staging, file), sha256=digest)
        self._waiting[name] = record
        self.poll()

    def poll(self, wait: bool = False) -> None:
        """Take note of the uploads verified since the last call (all of them with ``wait``): mark each
        such shard uploaded in its record, then delete its staged copy.

        Raises:
            UploadFailed, SourceUnreadable ...: an upload failed (after botocore's retries).
        """
        if self._uploader is None:
            return
        up = self._uploader
        self._verified.update(up.wait() if wait else up.completed())
        self._verified.update(up.skipped)  # already there, intact
        for name in [n for n in self._waiting if self._uploaded(n)]:
            record = self._waiting.pop(name)
            record["uploaded"] = True
            assert self.state is not None
            self.state.save_record(record)  # first the record, then the staged copy: never neither
            for path in (os.path.join(self.staging, name), os.path.join(self.staging, name + ".idx")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            self.uploaded += 1

    def _uploaded(self, name: str) -> bool:
        up = self._uploader
        return up.url_of(name) in self._verified and up.url_of(name + ".idx") in self._verified

    def room(self) -> bool:
        """Whether another shard may be written now (fewer than ``max_staged`` wait for their upload)."""
        self.poll()
        return len(self._waiting) < self.max_staged

    def make_room(self) -> None:
        """Wait for the uploads queued so far when too many shards wait in staging."""
        if not self.room():
            self.poll(wait=True)

    # -- at the end ------------------------------------------------------------------------------------
    def finish(self, manifest: str) -> None:
        """Wait for and verify every upload, then upload the manifest (the local file ``manifest``)."""
        self.poll(wait=True)
        # ShardUploader.finish would do, but with every shard found intact there is no uploader; either
        # way the manifest goes only after every shard is verified
        if self._uploader is not None:
            self._uploader.finish(manifest)
            self._uploader = None
        else:
            upload_file(manifest, self.url + MANIFEST, config=self.config, stats=self.stats)

    def close(self) -> None:
        """Cancel what is still queued (no manifest is uploaded). Idempotent."""
        if self._uploader is not None:
            self._uploader.close()
            self._uploader = None

    def remove_staging(self) -> None:
        """Delete the staging folder (after a complete conversion)."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> RemoteOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
