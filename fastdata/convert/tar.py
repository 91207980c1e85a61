"""Small-file corpus -> WebDataset tar shards, in parallel, resumable, with a manifest.

The work is planned first (:mod:`fastdata.convert.plan`: which file goes into which shard under which
key), then each shard is written by one process (:class:`~fastdata.formats.tar_writer.TarShardWriter`),
published (:func:`publish_shard`), and recorded as finished (:mod:`fastdata.convert.resume`). The
manifest is written last, from the records.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from tqdm import tqdm

from fastdata.convert.corpus import Corpus
from fastdata.convert.plan import LABEL_EXT, Entry, Plan, brace_pattern, plan_shards
from fastdata.convert.resume import ConversionState, open_state, sync_dir
from fastdata.errors import ConfigError, FastdataError, SourceNotFound, SourceUnreadable
from fastdata.formats.tar_writer import TarShardWriter, write_atomic
from fastdata.manifest import MANIFEST
from fastdata.storage import scheme

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
        super().__init__(f"{src}: {len(problems)} problem(s) in the corpus; nothing was written:\n  {shown}{more}\n"
                         "Fix them, or pass --skip-bad (skip_bad=True) to convert the rest; the manifest then "
                         "counts what was left out")
        self.problems = problems


def publish_shard(local_path: str, out: str) -> None:
    """Called in the writing process once a shard and its ``.idx`` are complete at ``local_path``.

    For a local output folder the shard already lies in place (written under a temporary name and
    renamed), so there is nothing to do. This is the one place where an upload to a remote ``out``
    (``s3://``) hooks in.
    """
    if scheme(out):
        raise ConfigError(f"{out}: fastdata convert writes to local folders only for now; convert to a "
                          "local folder, then upload it")


def _file_problem(message: str) -> bool:
    return "class folder has no readable file" not in message


def write_shard(out: str, name: str, entries: list[Entry], *, labelled: bool, skip_bad: bool, fsync: bool,
                progress: Progress | None = None) -> dict[str, Any]:
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
    publish_shard(path, out)
    return {"name": name, "samples": result.samples, "bytes": result.bytes, "sha256": result.sha256,
            "labels": {str(k): v for k, v in sorted(labels.items())}, "skipped": skipped}


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


def _write_shard_task(out: str, name: str, entries: list[Entry], labelled: bool, skip_bad: bool,
                      fsync: bool, state_fsync: bool) -> dict[str, Any]:
    record = write_shard(out, name, entries, labelled=labelled, skip_bad=skip_bad, fsync=fsync, progress=_report)
    ConversionState(out, state_fsync).save_record(record)
    return record


def _mp_context() -> multiprocessing.context.BaseContext:
    # fork starts writers in milliseconds and they need nothing from the parent but the plan
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _run_parallel(state: ConversionState, plan: Plan, todo: list[int], *, labelled: bool, skip_bad: bool,
                  fsync: bool, workers: int, bar: tqdm) -> None:
    ctx = _mp_context()
    counter = ctx.Array("q", 2)
    seen = [0, 0]
    pending: set[Future[dict[str, Any]]] = set()
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(counter, state.lock_fd if ctx.get_start_method() == "fork" else -1)) as pool:
        try:
            for i in todo:
                pending.add(pool.submit(_write_shard_task, state.out, plan.names[i], plan.shards[i], labelled,
                                        skip_bad, fsync, fsync))
            while pending:
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                with counter.get_lock():
                    files, nbytes = counter[0], counter[1]
                _advance(bar, files - seen[0], nbytes - seen[1])
                seen = [files, nbytes]
                for fut in done:
                    fut.result()  # raises a writer's error here
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _advance(bar: tqdm, files: int, nbytes: int) -> None:
    bar.files += files  # type: ignore[attr-defined]
    bar.set_postfix_str(f"{bar.files}/{bar.total_files} files", refresh=False)  # type: ignore[attr-defined]
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
) -> dict[str, Any]:
    """Convert ``corpus`` into tar shards in folder ``out``; resume an interrupted run there.

    See :func:`fastdata.convert.convert` for the options. Returns the manifest written.
    """
    publish_shard("", out)  # refuses remote output early
    if os.path.commonpath([os.path.realpath(out), corpus.root]) == corpus.root:
        raise ConfigError(f"{out}: is inside the corpus {corpus.root}; its shards would be converted next "
                          "time; write them somewhere else")
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    if shard_count is not None:
        shard_size = None
    plan = plan_shards(corpus, shard_size=shard_size, shard_count=shard_count, shuffle=shuffle, seed=seed,
                       prefix=prefix)
    problems = corpus.problems + plan.problems
    if problems and not skip_bad:
        raise CorpusProblems(corpus.root, problems)
    plan.options["skip_bad"] = skip_bad
    labelled = bool(corpus.classes)
    with open_state(out, fsync=fsync) as state:
        resumed = state.check_or_start(plan, src=corpus.root, restart=restart)
        state.clean_temporaries()
        records = state.finished(plan)
        todo = [i for i, name in enumerate(plan.names) if name not in records]
        total_files, total_bytes = plan.samples, sum(plan.shard_bytes(i) for i in range(len(plan.names)))
        done_files = sum(len(plan.shards[i]) for i, n in enumerate(plan.names) if n in records)
        done_bytes = sum(plan.shard_bytes(i) for i, n in enumerate(plan.names) if n in records)
        bar = tqdm(total=total_bytes, initial=done_bytes, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=f"fastdata convert{' (resumed)' if resumed and records else ''}", disable=not progress,
                   dynamic_ncols=True)
        bar.files, bar.total_files = done_files, total_files  # type: ignore[attr-defined]
        with bar:
            if todo and (workers == 1 or len(todo) == 1):
                for i in todo:
                    record = write_shard(out, plan.names[i], plan.shards[i], labelled=labelled, skip_bad=skip_bad,
                                         fsync=fsync, progress=lambda f, b: _advance(bar, f, b))
                    state.save_record(record)
            elif todo:
                _run_parallel(state, plan, todo, labelled=labelled, skip_bad=skip_bad, fsync=fsync,
                              workers=min(workers, len(todo)), bar=bar)
        if fsync:
            sync_dir(out)
        records = state.finished(plan)
        missing = [n for n in plan.names if n not in records]
        if missing:
            raise FastdataError(f"{out}: shards {missing[:3]} were written but are not on disk as recorded "
                                "(removed meanwhile?); rerun the same command to redo them")
        manifest = build_manifest(plan, [records[n] for n in plan.names], corpus, problems)
        manifest["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_atomic(os.path.join(out, MANIFEST), _dumps(manifest), fsync=fsync)
    return manifest


def build_manifest(plan: Plan, records: list[dict[str, Any]], corpus: Corpus, problems: list[str]) -> dict[str, Any]:
    """The manifest (layout in :mod:`fastdata.manifest`) from the records of every shard."""
    from fastdata import __version__

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
        "shards": [{"name": r["name"], "samples": r["samples"], "bytes": r["bytes"], "sha256": r["sha256"]}
                   for r in records],
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
