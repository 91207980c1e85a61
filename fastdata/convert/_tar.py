"""Tar shards: writing one planned shard (:class:`TarTask`, the unit of work that every engine runs, so
that each writes the same bytes), the room it takes, and the tar manifest's own fields.

A shard of local files goes through :meth:`fastdata.formats.tar.TarShardWriter.add_files` in batches
(headers built per batch, each file read straight into the output buffer); a shard of ``s3://`` objects
is fetched by a pool of threads (the process's pooled client; botocore's retries, and reads resumed where
a body broke off) and added in plan order. The shard is published (fsync, sidecar index, rename), then
its record is saved: on an executor when one is given, so that the next shard is being written meanwhile.

Its digest: SHA-256 for an ``s3://`` output (the store's metadata and the upload's check need it), the
fast one (:data:`fastdata.core.FAST`) where only fastdata reads it back; the record and the manifest
name it by its key.
"""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastdata.convert._options import ConversionPlan
from fastdata.convert._plan import LABEL_EXT, Entry, Plan, tar_bytes
from fastdata.convert._resume import ConversionState
from fastdata.core import FAST, DigestName, usable_cores
from fastdata.core.errors import FastdataError
from fastdata.formats.tar import BLOCK, RECORD, FileMember, ShardResult, TarShardWriter

if TYPE_CHECKING:
    from fastdata.convert._remote import RemoteOutput

Progress = Callable[[int, int], None]  # (files, bytes) done since the last call
BATCH = 256  # files per add_files call: headers built together, progress reported after each


@dataclass(frozen=True)
class TarTask:
    """How to write the shards of one conversion (picklable: it travels to worker processes and Ray
    tasks; the shards' entries travel separately, one shard at a time).

    Attributes:
        out (str): the folder shards are written into (the output, or a staging folder).
        labelled (bool): add a ``.cls`` member to every sample.
        skip_bad (bool): leave out files that cannot be read, listing them in the record.
        fsync (bool): flush each shard to disk before it is recorded.
        save_records (bool): save each shard's record into ``out``'s resume state.
        source_options (dict | None): for an ``s3://`` corpus, the S3Config fields to read it with.
        upload (str | None): ``s3://bucket/prefix/`` to upload each finished shard to from the task
            itself (Ray with an ``s3://`` output); ``out`` is then ignored and a temporary folder on
            the task's machine is used.
        upload_options (dict | None): the S3Config fields for ``upload``.
        hash_thread (bool): hash and write on a thread beside the reading one (a core is free for it:
            fewer writing processes than cores). Defaults to False.
        digest ("sha256" | "xxh3_128"): the shard's digest. Defaults to "sha256".
    """

    out: str
    labelled: bool
    skip_bad: bool
    fsync: bool
    save_records: bool = True
    source_options: dict[str, Any] | None = None
    upload: str | None = None
    upload_options: dict[str, Any] | None = None
    hash_thread: bool = False
    digest: DigestName = "sha256"

    @classmethod
    def of(
        cls,
        plan: ConversionPlan,
        folder: str,
        labelled: bool,
        source_options: dict[str, Any] | None,
        remote: RemoteOutput | None,
        ray_uploads: bool,
    ) -> TarTask:
        """The task of ``plan``, writing into ``folder`` (the output, or the staging folder of ``remote``)."""
        return cls(
            folder,
            labelled=labelled,
            skip_bad=plan.skip_bad,
            fsync=plan.fsync,
            source_options=source_options,
            upload=remote.url if ray_uploads and remote is not None else None,
            upload_options=remote.options if ray_uploads and remote is not None else None,
            # a thread per writer pays only with a core free for it (measured: docs/convert.md)
            hash_thread=plan.engine == "local" and plan.workers < usable_cores(),
            digest="sha256" if remote is not None else FAST,
        )

    def need(self, plan: Plan, i: int) -> int:
        """Bytes shard ``i`` and its sidecar take on disk."""
        entries = plan.shards[i]
        cost = sum(tar_bytes(e.size, self.labelled) for e in entries)
        return cost + RECORD + 2 * BLOCK + 128 * len(entries) + 4096

    def manifest(
        self, plan: Plan, records: list[dict[str, Any]], corpus: Any, problems: list[str], base: dict[str, Any]
    ) -> dict[str, Any]:
        """``base`` with what a tar manifest adds: the one extension of a corpus of mixed images."""
        image = next((e.ext for s in plan.shards for e in s if e.src_ext != e.ext), None)
        if image is not None:  # a corpus of mixed image extensions, stored under one (see _plan.py)
            base["image_ext"] = image
            base["image_exts"] = dict(
                sorted(Counter(e.src_ext for s in plan.shards for e in s if e.ext == image).items())
            )
        return base

    def write(
        self, name: str, entries: list[Entry], progress: Progress | None = None, finisher: Executor | None = None
    ) -> Future[dict[str, Any]]:
        """Write shard ``name``; the returned future holds its record once it is published (and saved).

        The data is written when this returns; with ``finisher`` the fsync, rename and record happen
        there, else before this returns.

        Raises:
            SourceNotFound, SourceUnreadable: a file cannot be read (unless ``skip_bad``); nothing is
                left behind then. OSError: a write failed (a full disk ...), the same.
        """
        if self.upload is not None:
            done: Future[dict[str, Any]] = Future()
            done.set_result(self._write_and_upload(name, entries, progress))
            return done
        return self._write(self.out, name, entries, progress, finisher)

    # -- internals ---------------------------------------------------------------------------------
    def _write(
        self, out: str, name: str, entries: list[Entry], progress: Progress | None, finisher: Executor | None
    ) -> Future[dict[str, Any]]:
        labels: Counter[int] = Counter()
        skipped: list[str] = []
        writer = TarShardWriter(
            os.path.join(out, name), fsync=self.fsync, hash_thread=self.hash_thread, digest=self.digest
        )
        try:
            if self.source_options is None:
                bad = self._add_local(writer, entries, skipped, progress)
            else:
                bad = self._add_s3(writer, entries, skipped, progress)
            kept = [e for k, e in enumerate(entries) if k not in bad]
            if self.labelled:  # one label per sample (the files of one sample are next to each other)
                labels.update(e.label for k, e in enumerate(kept) if k == 0 or kept[k - 1].key != e.key)
            renamed = {e.key: e.src_ext for e in kept if e.src_ext != e.ext}
            fields = Counter(e.ext for e in kept)  # samples holding each member
            if self.labelled:
                fields[LABEL_EXT] = sum(labels.values())
            then = _Record(self, name, labels, skipped, renamed, dict(sorted(fields.items())))
            if finisher is None:
                done: Future[dict[str, Any]] = Future()
                done.set_result(then(writer.close()))
                return done
            closing = writer.close_later(finisher)  # the finisher runs one call at a time, in order
            return finisher.submit(lambda: then(closing.result()))
        except BaseException:
            writer.abort()
            raise

    def _add_local(
        self, writer: TarShardWriter, entries: list[Entry], skipped: list[str], progress: Progress | None
    ) -> set[int]:
        bad: set[int] = set()
        label_bytes = _label_bytes(entries) if self.labelled else []
        for lo, hi in _runs(entries):
            if hi - lo > 1 and entries[lo].key == entries[hi - 1].key:  # one sample of several files
                self._add_sample(writer, entries, lo, hi, label_bytes, skipped, bad)
                if progress is not None:
                    progress(hi - lo, sum(e.size for e in entries[lo:hi]))
                continue
            batch = entries[lo:hi]
            files = [FileMember(e.key, e.ext, e.path, e.size, e.mtime) for e in batch]
            extras = [((LABEL_EXT, label_bytes[e.label]),) for e in batch] if self.labelled else None

            def skip(i: int, error: FastdataError, lo: int = lo) -> None:
                if not self.skip_bad:
                    raise error
                skipped.append(str(error))
                bad.add(lo + i)

            writer.add_files(files, extras=extras, skip=skip)
            if progress is not None:
                progress(len(batch), sum(e.size for e in batch))
        return bad

    def _add_sample(
        self,
        writer: TarShardWriter,
        entries: list[Entry],
        lo: int,
        hi: int,
        label_bytes: list[bytes],
        skipped: list[str],
        bad: set[int],
    ) -> None:
        """Add the sample made of files ``entries[lo:hi]`` (one key), whole or not at all: every file is read
        before any is added, so an unreadable one leaves the sample out (under ``skip_bad``) instead of
        writing the rest of it."""
        from fastdata.convert._hdf5 import _read

        try:
            data = [_read(e) for e in entries[lo:hi]]
        except FastdataError as error:
            if not self.skip_bad:
                raise
            skipped.append(f"{error} (sample {entries[lo].key!r} left out whole)")
            bad.update(range(lo, hi))
            return
        for e, b in zip(entries[lo:hi], data):
            writer.add_bytes(e.key, e.ext, b, mtime=e.mtime)
        if self.labelled:
            writer.add_bytes(entries[lo].key, LABEL_EXT, label_bytes[entries[lo].label])

    def _add_s3(
        self, writer: TarShardWriter, entries: list[Entry], skipped: list[str], progress: Progress | None
    ) -> set[int]:
        from fastdata.storage.s3 import S3Config, Stats, get

        config = S3Config.from_options(None, **(self.source_options or {}))
        stats = Stats()
        label_bytes = _label_bytes(entries) if self.labelled else []
        bad: set[int] = set()
        threads = config.threads
        pending: collections.deque[Future[Any]] = collections.deque()
        files = nbytes = 0
        with ThreadPoolExecutor(threads, thread_name_prefix="fastdata-convert-get") as pool:
            try:
                ahead = iter(entries)
                for e in ahead:  # keep 2 x threads GETs in flight, in plan order
                    pending.append(pool.submit(get, config, stats, e.path, size=e.size))
                    if len(pending) >= 2 * threads:
                        break
                for k, e in enumerate(entries):
                    fut = pending.popleft()
                    nxt = next(ahead, None)
                    if nxt is not None:
                        pending.append(pool.submit(get, config, stats, nxt.path, size=nxt.size))
                    try:
                        data = fut.result().data
                    except (FastdataError, OSError) as error:
                        if not self.skip_bad:
                            raise
                        skipped.append(f"{e.path}: {error}" if e.path not in str(error) else str(error))
                        bad.add(k)
                        continue
                    writer.add_bytes(e.key, e.ext, data, mtime=e.mtime)
                    if self.labelled and (k + 1 == len(entries) or entries[k + 1].key != e.key):
                        writer.add_bytes(e.key, LABEL_EXT, label_bytes[e.label])  # once per sample, at its end
                    files, nbytes = files + 1, nbytes + e.size
                    if progress is not None and files == 64:
                        progress(files, nbytes)
                        files = nbytes = 0
            finally:
                for fut in pending:
                    fut.cancel()
        if progress is not None:
            progress(files + len(bad), nbytes)
        return bad

    def _write_and_upload(self, name: str, entries: list[Entry], progress: Progress | None) -> dict[str, Any]:
        from fastdata.storage.s3 import S3Config, Stats, upload_file

        assert self.upload is not None
        config = S3Config.from_options(None, **(self.upload_options or {}))
        stats = Stats()
        folder = tempfile.mkdtemp(prefix="fastdata-convert-")
        try:
            record = self._write(folder, name, entries, progress, None).result()
            for file, digest in ((name, record["sha256"]), (name + ".idx", record["idx_sha256"])):
                upload_file(
                    os.path.join(folder, file),
                    self.upload + file,
                    config=config,
                    stats=stats,
                    sha256=digest,
                    skip_existing=True,
                )
            record["uploaded"] = True
            return record
        finally:
            shutil.rmtree(folder, ignore_errors=True)


@dataclass
class _Record:
    """Turns a published shard into its record (and saves it), on whichever thread finishes the shard."""

    task: TarTask
    name: str
    labels: Counter[int]
    skipped: list[str]
    renamed: dict[str, str]
    fields: dict[str, int]

    def __call__(self, result: ShardResult) -> dict[str, Any]:
        index = result.index_bytes  # the bytes the writer stored as the sidecar: an upload checks them
        record = {
            "name": self.name,
            "samples": result.samples,
            "bytes": result.bytes,
            result.digest_name: result.digest,
            "idx_bytes": len(index),
            "idx_sha256": hashlib.sha256(index).hexdigest(),
            "labels": {str(k): v for k, v in sorted(self.labels.items())},
            "skipped": self.skipped,
            "fields": self.fields,
        }
        if self.renamed:
            record["renamed"] = self.renamed
        if self.task.save_records and self.task.upload is None:
            ConversionState(os.path.dirname(result.path), self.task.fsync).save_record(record)
        return record


def _runs(entries: list[Entry]) -> list[tuple[int, int]]:
    """``(lo, hi)`` ranges of ``entries`` to add together: each sample of several files alone, the
    one-file samples between them in batches of up to ``BATCH``."""
    out: list[tuple[int, int]] = []
    lo, n = 0, len(entries)
    i = 0
    while i < n:
        j = i + 1
        while j < n and entries[j].key == entries[i].key:
            j += 1
        if j - i > 1:  # a sample of several files
            if lo < i:
                out.append((lo, i))
            out.append((i, j))
            lo = j
        elif j - lo >= BATCH:
            out.append((lo, j))
            lo = j
        i = j
    if lo < n:
        out.append((lo, n))
    return out


def _label_bytes(entries: list[Entry]) -> list[bytes]:
    return [str(i).encode() for i in range(max((e.label for e in entries), default=0) + 1)]
