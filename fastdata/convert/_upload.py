"""Uploading a conversion's finished files to S3 in the background, the manifest last.

Each object is written by one PUT (or one multipart upload that becomes visible only when complete), so a
reader never sees half a shard. What a reader can see is a prefix with some shards and no manifest yet,
or, while a prefix is being rewritten, an old manifest beside new shards. :class:`ShardUploader` removes
a stale manifest before the first new shard lands and uploads the manifest only after every shard (and
sidecar) is uploaded and verified; readers plan from the manifest, so they see the old set or the new.
"""

from __future__ import annotations

import os
from typing import Any

from fastdata.formats import MANIFEST
from fastdata.storage.s3 import (
    MiB,
    S3Config,
    Stats,
    call,
    client,
    finish_upload,
    parse_url,
    start_upload,
    transfer_config,
    upload_file,
)


class ShardUploader:
    """Uploads a converter's finished files to ``s3://bucket/prefix/`` in the background, the manifest
    last, so that readers (who plan from the manifest) never act on a partial set.

    ::

        with ShardUploader("s3://bucket/train/") as up:
            for shard in finished_shards:           # as each one is finished
                up.upload(shard)                    # returns at once
                up.upload(shard + ".idx")
            up.finish("out/manifest.json")          # waits, verifies every upload, then the manifest

    Leaving the ``with`` block without :meth:`finish` (an error, an interrupt) cancels what is still
    queued and uploads no manifest.

    Args:
        prefix (str): ``s3://bucket/prefix/`` (a trailing slash is implied).
        config (S3Config | None): Defaults to ``S3Config(**options)``.
        skip_existing (bool): skip files already uploaded with the same size and SHA-256 (a resumed
            conversion). Defaults to True.
        multipart_threshold, part_size (int): see :func:`upload_file`.
    """

    def __init__(
        self,
        prefix: str,
        *,
        config: S3Config | None = None,
        skip_existing: bool = True,
        multipart_threshold: int = 64 * MiB,
        part_size: int = 16 * MiB,
        stats: Stats | None = None,
        **options: Any,
    ) -> None:
        bucket, key = parse_url(prefix)
        self.prefix = f"s3://{bucket}/{key.rstrip('/') + '/' if key.strip('/') else ''}"
        self.config = S3Config.from_options(config, **options)
        self.stats = stats or Stats()
        self.skip_existing = skip_existing
        self._transfer = transfer_config(self.config, multipart_threshold, part_size)
        self._manager: Any = None
        self._pending: list[tuple[Any, str, int, str]] = []
        self.uploaded: list[str] = []
        self.skipped: list[str] = []
        self._stale_manifest_removed = False

    def url_of(self, name: str) -> str:
        return self.prefix + name.lstrip("/")

    def upload(self, path: str | os.PathLike[str], name: str | None = None, *, sha256: str | None = None) -> None:
        """Queue ``path`` for upload as ``prefix + name`` (default: the file's name); returns at once.

        Raises (now, not later) for a missing file or bucket and for access denied.
        """
        if not self._stale_manifest_removed:
            self._remove_stale_manifest()
        if self._manager is None:
            from boto3.s3.transfer import create_transfer_manager

            self._manager = create_transfer_manager(client(self.config), self._transfer)
        url = self.url_of(name or os.path.basename(path))
        future, size, digest = start_upload(
            path, url, self.config, self.stats, sha256, self.skip_existing, 0, 0, manager=self._manager
        )
        if future is None:
            self.skipped.append(url)
        else:
            self._pending.append((future, url, size, digest))

    def _remove_stale_manifest(self) -> None:
        bucket, key = parse_url(self.url_of(MANIFEST))
        call(self.config, self.stats, self.url_of(MANIFEST), lambda s3: s3.delete_object(Bucket=bucket, Key=key))
        self._stale_manifest_removed = True

    def wait(self) -> list[str]:
        """Wait for every queued upload and verify each object; the URLs uploaded so far."""
        pending, self._pending = self._pending, []
        done = 0
        try:
            for future, url, size, digest in pending:
                done += 1
                finish_upload(future, url, self.config, self.stats, size, digest)
                self.uploaded.append(url)
        except BaseException:
            for future, *_ in pending[done:]:
                future.cancel()
            raise
        return list(self.uploaded)

    def completed(self) -> list[str]:
        """Verify the uploads that have ended, without waiting for the others; the URLs verified by this
        call (a converter deletes its local copies of those).

        Raises:
            UploadFailed, SourceUnreadable ...: an upload that ended failed (the others stay queued).
        """
        newly: list[str] = []
        while self._pending:
            ended = next((item for item in self._pending if item[0].done()), None)
            if ended is None:
                break
            self._pending.remove(ended)
            future, url, size, digest = ended
            finish_upload(future, url, self.config, self.stats, size, digest)
            self.uploaded.append(url)
            newly.append(url)
        return newly

    def finish(self, manifest: str | os.PathLike[str] | None, name: str = MANIFEST) -> list[str]:
        """Wait for every upload, verify them, then upload ``manifest`` (a local file) as ``prefix + name``.

        Returns:
            list[str]: every URL uploaded, the manifest's last.
        """
        self.wait()
        if manifest is not None:
            upload_file(manifest, self.url_of(name), config=self.config, stats=self.stats)
            self.uploaded.append(self.url_of(name))
        self.close()
        return list(self.uploaded)

    def close(self) -> None:
        """Cancel uploads still queued (no manifest is uploaded) and stop the transfer threads. Idempotent."""
        for future, *_ in self._pending:
            future.cancel()
        self._pending = []
        if self._manager is not None:
            self._manager.shutdown(cancel=True)
            self._manager = None

    def __enter__(self) -> ShardUploader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardUploader({self.prefix!r}, {len(self.uploaded)} uploaded, {len(self._pending)} pending)"


__all__ = ["ShardUploader"]
