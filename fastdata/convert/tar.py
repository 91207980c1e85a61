"""Small-file corpus -> WebDataset tar shards, in parallel, resumable, with a manifest.

The work is planned first (:mod:`fastdata.convert.plan`: which file goes into which shard under which
key), then each shard is written by one process (:class:`~fastdata.formats.tar_writer.TarShardWriter`)
and recorded as finished (:mod:`fastdata.convert.resume`). The manifest is written last, from the
records. For an ``s3://`` output the shards are written into a local staging folder and the main process
uploads each one as its writer reports it finished, the manifest last (:mod:`fastdata.convert.remote`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from fastdata.convert.corpus import Corpus
from fastdata.convert.plan import LABEL_EXT, Entry, Plan, brace_pattern, plan_shards
from fastdata.convert.resume import ConversionState, open_state, sync_dir
from fastdata.core.errors import ConfigError, FastdataError, SourceNotFound, SourceUnreadable
from fastdata.formats.manifest import MANIFEST
from fastdata.formats.tar_writer import TarShardWriter, write_atomic
from fastdata.storage import scheme

if TYPE_CHECKING:
    from fastdata.convert.remote import RemoteOutput

Progress = Callable[[int, int], None]  # (files, bytes) done since the last call
_REPORT_EVERY = 64  # files between progress reports from a shard writer


class CorpusProblems(FastdataError):
    """The corpus has files or folders that cannot be converted as they are.

    Attributes:
        problems (list[str]): one line each, naming the file or folder and why.
    """

    def __init__(self, src: str, problems: list[str]) -> None:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(
            f"{src}: {len(problems)} problem(s) in the corpus; nothing was written:\n  {shown}{more}\n"
            "Fix them, or pass --skip-bad (skip_bad=True) to convert the rest; the manifest then "
            "counts what was left out"
        )
        self.problems = problems


def _file_problem(message: str) -> bool:
    return "class folder has no readable file" not in message


def write_shard(
    out: str,
    name: str,
    entries: list[Entry],
    *,
    labelled: bool,
    skip_bad: bool,
    fsync: bool,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write one planned shard to ``out/name`` and return its record (for the manifest).

    Raises:
        SourceNotFound, SourceUnreadable: a file cannot be read (unless ``skip_bad``); the shard's
            temporary file is removed then.
    """
    path = os.path.join(out, name)
    labels: Counter[int] = Counter()
    skipped: list[str] = []
    done = nbytes = 0
    label_bytes = [str(i).encode() for i in range(max((e.label for e in entries), default=0) + 1)]
    writer = TarShardWriter(path, fsync=fsync)
    try:
        for e in entries:
            try:
                nbytes += writer.add_file(e.key, e.ext, e.path)
                if labelled:
                    writer.add_bytes(e.key, LABEL_EXT, label_bytes[e.label])
                    labels[e.label] += 1
            except (SourceNotFound, SourceUnreadable) as err:
                if not skip_bad:
                    raise
                skipped.append(str(err))
                nbytes += e.size
            done += 1
            if progress is not None and done % _REPORT_EVERY == 0:
                progress(_REPORT_EVERY, nbytes)
                nbytes = 0
        result = writer.close()
    except BaseException:
        writer.abort()
        raise
    if progress is not None:
        progress(done % _REPORT_EVERY, nbytes)
    index = result.index.to_bytes()  # the bytes the writer stored as the sidecar: an upload checks them
    return {
        "name": name,
        "samples": result.samples,
        "bytes": result.bytes,
        "sha256": result.sha256,
        "idx_bytes": len(index),
        "idx_sha256": hashlib.sha256(index).hexdigest(),
        "labels": {str(k): v for k, v in sorted(labels.items())},
        "skipped": skipped,
    }


# -- parallel writing --------------------------------------------------------------------------------
_counter: Any = None  # (files, bytes) shared with the main process, set in each worker


def _init_worker(counter: Any, lock_fd: int) -> None:
    global _counter
    _counter = counter
    if lock_fd >= 0:
        # the lock is the main process's: were it shared, a rerun would wait for a dying writer
        with contextlib.suppress(OSError):
            os.close(lock_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and stops us
    if sys.platform.startswith("linux"):
        # die with the main process: a killed conversion must not leave writers running behind it
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the main process died before prctl took effect
            os._exit(1)


def _report(files: int, nbytes: int) -> None:
    with _counter.get_lock():
        _counter[0] += files
        _counter[1] += nbytes


def _write_shard_task(
    out: str, name: str, entries: list[Entry], labelled: bool, skip_bad: bool, fsync: bool, state_fsync: bool
) -> dict[str, Any]:
    record = write_shard(out, name, entries, labelled=labelled, skip_bad=skip_bad, fsync=fsync, progress=_report)
    ConversionState(out, state_fsync).save_record(record)
    return record


def _mp_context() -> multiprocessing.context.BaseContext:
    # fork starts writers in milliseconds and they need nothing from the parent but the plan
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _run_parallel(
    state: ConversionState,
    plan: Plan,
    todo: list[int],
    *,
    labelled: bool,
    skip_bad: bool,
    fsync: bool,
    workers: int,
    bar: tqdm,
    remote: RemoteOutput | None = None,
    staged: list[dict[str, Any]] | None = None,
) -> None:
    ctx = _mp_context()
    counter = ctx.Array("q", 2)
    seen = [0, 0]
    pending: set[Future[dict[str, Any]]] = set()
    queue = list(reversed(todo))
    # Shards are handed out a few at a time rather than all at once, so that for an s3:// output the
    # writers pause while too many finished shards wait in staging for their upload.
    ahead = 2 * workers
    with ProcessPoolExecutor(
        workers,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(counter, state.lock_fd if ctx.get_start_method() == "fork" else -1),
    ) as pool:
        try:
            while queue or pending:
                while queue and len(pending) < ahead and (remote is None or remote.room()):
                    i = queue.pop()
                    pending.add(
                        pool.submit(
                            _write_shard_task,
                            state.out,
                            plan.names[i],
                            plan.shards[i],
                            labelled,
                            skip_bad,
                            fsync,
                            fsync,
                        )
                    )
                if staged and remote is not None:
                    # only now: under fork the writers were started by the first submit, before any
                    # upload thread exists in this process
                    _upload_staged(remote, staged)
                    staged = None
                if not pending:  # everything left waits for room in staging
                    assert remote is not None
                    remote.make_room()
                    continue
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                with counter.get_lock():
                    files, nbytes = counter[0], counter[1]
                _advance(bar, files - seen[0], nbytes - seen[1], remote)
                seen = [files, nbytes]
                for fut in done:
                    record = fut.result()  # raises a writer's error here
                    if remote is not None:
                        remote.shard_written(record)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _upload_staged(remote: RemoteOutput, records: list[dict[str, Any]]) -> None:
    """Queue the uploads of shards an interrupted run finished but did not upload."""
    for record in records:
        remote.shard_written(record)


def _advance(bar: tqdm, files: int, nbytes: int, remote: RemoteOutput | None = None) -> None:
    bar.files += files  # type: ignore[attr-defined]
    uploaded = f", {remote.uploaded}/{bar.total_shards} shards uploaded" if remote is not None else ""  # type: ignore[attr-defined]
    bar.set_postfix_str(f"{bar.files}/{bar.total_files} files{uploaded}", refresh=False)  # type: ignore[attr-defined]
    bar.update(nbytes)


# -- the conversion ----------------------------------------------------------------------------------
def convert_tar(
    corpus: Corpus,
    out: str,
    *,
    shard_size: int | None = 256 * 10**6,
    shard_count: int | None = None,
    workers: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    prefix: str = "shard",
    skip_bad: bool = False,
    restart: bool = False,
    fsync: bool = True,
    progress: bool = True,
    staging: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Convert ``corpus`` into tar shards in folder ``out`` (or under ``s3://bucket/prefix``); resume an
    interrupted run there.

    See :func:`fastdata.convert.convert` for the options. Returns the manifest written.
    """
    remote = None
    if scheme(out):
        # imported here: the S3 client brings torch (2 s of start-up) that a local conversion never needs
        from fastdata.convert.remote import RemoteOutput, check_remote, staging_folder

        check_remote(out)
        folder = staging_folder(out, staging)
        remote = RemoteOutput(out, folder, workers=max(1, workers), storage_options=storage_options)
    elif staging is not None or storage_options:
        raise ConfigError("staging and storage_options apply to s3:// outputs only")
    else:
        folder = out
    if os.path.commonpath([os.path.realpath(folder), corpus.root]) == corpus.root:
        raise ConfigError(
            f"{folder}: is inside the corpus {corpus.root}; its shards would be converted next "
            "time; write them somewhere else"
        )
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    if shard_count is not None:
        shard_size = None
    plan = plan_shards(
        corpus, shard_size=shard_size, shard_count=shard_count, shuffle=shuffle, seed=seed, prefix=prefix
    )
    problems = corpus.problems + plan.problems
    if problems and not skip_bad:
        raise CorpusProblems(corpus.root, problems)
    plan.options["skip_bad"] = skip_bad
    if remote is not None:
        plan.options["out"] = remote.url  # one staging folder, one destination
        remote.check_prefix(plan)
    with contextlib.ExitStack() as stack:
        if remote is not None:
            stack.enter_context(remote)  # leaving early cancels the uploads still queued: no manifest
        state = stack.enter_context(open_state(folder, fsync=fsync))
        manifest = _convert_in(
            state,
            plan,
            corpus,
            problems,
            workers=workers,
            skip_bad=skip_bad,
            restart=restart,
            fsync=fsync,
            progress=progress,
            remote=remote,
        )
    if remote is not None:
        remote.remove_staging()  # complete: nothing left to resume
    return manifest


def _convert_in(
    state: ConversionState,
    plan: Plan,
    corpus: Corpus,
    problems: list[str],
    *,
    workers: int,
    skip_bad: bool,
    restart: bool,
    fsync: bool,
    progress: bool,
    remote: RemoteOutput | None,
) -> dict[str, Any]:
    folder = state.out
    labelled = bool(corpus.classes)
    resumed = state.check_or_start(plan, src=corpus.root, restart=restart)
    state.clean_temporaries()
    staged: list[dict[str, Any]] = []
    if remote is None:
        records = state.finished(plan)
    else:
        records, staged = remote.done_records(state, plan)
    todo = [i for i, name in enumerate(plan.names) if name not in records]
    total_files, total_bytes = plan.samples, sum(plan.shard_bytes(i) for i in range(len(plan.names)))
    done_files = sum(len(plan.shards[i]) for i, n in enumerate(plan.names) if n in records)
    done_bytes = sum(plan.shard_bytes(i) for i, n in enumerate(plan.names) if n in records)
    bar = tqdm(
        total=total_bytes,
        initial=done_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"fastdata convert{' (resumed)' if resumed and records else ''}",
        disable=not progress,
        dynamic_ncols=True,
    )
    bar.files, bar.total_files, bar.total_shards = done_files, total_files, len(plan.names)  # type: ignore[attr-defined]
    with bar:
        if remote is not None and (workers == 1 or len(todo) <= 1):
            for record in staged:
                remote.shard_written(record)
        if todo and (workers == 1 or len(todo) == 1):
            for i in todo:
                if remote is not None:
                    remote.make_room()
                record = write_shard(
                    folder,
                    plan.names[i],
                    plan.shards[i],
                    labelled=labelled,
                    skip_bad=skip_bad,
                    fsync=fsync,
                    progress=lambda f, b: _advance(bar, f, b, remote),
                )
                state.save_record(record)
                if remote is not None:
                    remote.shard_written(record)
        elif todo:
            _run_parallel(
                state,
                plan,
                todo,
                labelled=labelled,
                skip_bad=skip_bad,
                fsync=fsync,
                workers=min(workers, len(todo)),
                bar=bar,
                remote=remote,
                staged=staged,
            )
        if remote is not None:
            bar.set_description_str("fastdata convert: waiting for the uploads")
            remote.poll(wait=True)
            _advance(bar, 0, 0, remote)
    if fsync:
        sync_dir(folder)
    if remote is None:
        records = state.finished(plan)
        where = "on disk"
    else:
        records = state.records(plan)  # each one verified uploaded by now
        records = {n: r for n, r in records.items() if r.get("uploaded")}
        where = "uploaded"
    missing = [n for n in plan.names if n not in records]
    if missing:
        raise FastdataError(
            f"{folder}: shards {missing[:3]} were written but are not {where} as recorded "
            "(removed meanwhile?); rerun the same command to redo them"
        )
    manifest = build_manifest(plan, [records[n] for n in plan.names], corpus, problems)
    manifest["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    manifest_path = os.path.join(folder, MANIFEST)
    write_atomic(manifest_path, _dumps(manifest), fsync=fsync)
    if remote is not None:
        remote.finish(manifest_path)
    return manifest


def build_manifest(plan: Plan, records: list[dict[str, Any]], corpus: Corpus, problems: list[str]) -> dict[str, Any]:
    """The manifest (layout in :mod:`fastdata.formats.manifest`) from the records of every shard."""
    from fastdata.core.version import __version__

    labels: Counter[int] = Counter()
    write_skips: list[str] = []
    for r in records:
        labels.update({int(k): v for k, v in r["labels"].items()})
        write_skips.extend(r["skipped"])
    all_problems = problems + write_skips
    return {
        "format": "tar",
        "version": 1,
        "samples": sum(r["samples"] for r in records),
        "bytes": sum(r["bytes"] for r in records),
        "classes": corpus.classes,
        "class_counts": {c: labels.get(i, 0) for i, c in enumerate(corpus.classes)},
        "shards": [
            {"name": r["name"], "samples": r["samples"], "bytes": r["bytes"], "sha256": r["sha256"]} for r in records
        ],
        "pattern": brace_pattern(plan.names),
        "skipped": sum(1 for p in problems if _file_problem(p)) + len(write_skips),
        "problems": all_problems,
        "source": corpus.root,
        "options": plan.options,
        "created_by": f"fastdata {__version__} convert",
    }


def _dumps(manifest: dict[str, Any]) -> bytes:
    import json

    return (json.dumps(manifest, indent=1) + "\n").encode()
