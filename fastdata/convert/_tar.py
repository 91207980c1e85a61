"""Small-file corpus -> WebDataset tar shards, in parallel, resumable, with a manifest.

The work is planned first (:mod:`fastdata.convert._plan`: which file goes into which shard under which
key), then each shard is written whole by one task (:class:`~fastdata.convert._tar_task.TarTask`) on an
engine (:mod:`fastdata.convert._pool`: this process or worker processes; :mod:`fastdata.convert._ray_engine`:
a Ray cluster) and recorded as finished (:mod:`fastdata.convert._resume`). The manifest is written last,
from the records. For an ``s3://`` output the shards are written into a local staging folder and the
main process uploads each one as it is reported finished, the manifest last
(:mod:`fastdata.convert._remote`); Ray tasks upload their shards themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from fastdata.convert._corpus import Corpus
from fastdata.convert._driver import Engine, OnShard, progress_bar, run_shards
from fastdata.convert._plan import Plan, brace_pattern, plan_shards, tar_bytes
from fastdata.convert._resume import ConversionState, open_state, sync_dir
from fastdata.convert._space import DiskFull, check_space, full_disk_is_an_error
from fastdata.convert._tar_task import TarTask
from fastdata.core.errors import ConfigError, FastdataError, check_choice
from fastdata.formats._manifest import MANIFEST
from fastdata.formats.tar._reader import BLOCK
from fastdata.formats.tar._writer import RECORD, write_atomic
from fastdata.storage import scheme

if TYPE_CHECKING:
    from fastdata.convert._remote import RemoteOutput


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

    def __reduce__(self) -> Any:
        return (type(self), (str(self).split(":", 1)[0], self.problems))


def file_problem(message: str) -> bool:
    """Whether a corpus problem is about a file left out (counted in ``skipped``)."""
    return "class folder has no readable file" not in message


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
    engine: Engine = "local",
    address: str | None = None,
    on_shard: OnShard | None = None,
) -> dict[str, Any]:
    """Convert ``corpus`` into tar shards in folder ``out`` (or under ``s3://bucket/prefix``); resume an
    interrupted run there.

    See :func:`fastdata.convert.convert` for the options. Returns the manifest written.
    """
    check_choice("engine", engine, Engine)
    if engine == "ray":
        from fastdata.convert._ray_engine import check_cluster

        check_cluster(address)
    remote = None
    if scheme(out):
        # imported here: the S3 client brings torch (2 s of start-up) that a local conversion never needs
        from fastdata.convert._remote import RemoteOutput, check_remote, staging_folder

        check_remote(out)
        folder = staging_folder(out, staging)
        remote = RemoteOutput(out, folder, workers=max(1, workers), storage_options=storage_options)
    elif staging is not None or storage_options:
        raise ConfigError("staging and storage_options apply to s3:// outputs only")
    else:
        folder = out
    if not scheme(corpus.root) and os.path.commonpath([os.path.realpath(folder), corpus.root]) == corpus.root:
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
        stack.enter_context(full_disk_is_an_error(folder))
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
            engine=engine,
            address=address,
            on_shard=on_shard,
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
    engine: Engine,
    address: str | None,
    on_shard: OnShard | None,
) -> dict[str, Any]:
    folder = state.out
    resumed = state.check_or_start(plan, src=corpus.root, restart=restart)
    state.clean_temporaries()
    staged: list[dict[str, Any]] = []
    if remote is None:
        records = state.finished(plan)
    else:
        records, staged = remote.done_records(state, plan)
    ray_uploads = engine == "ray" and remote is not None
    if ray_uploads and staged:  # Ray tasks upload what they write: write these again (the same bytes)
        records = {n: r for n, r in records.items() if n not in {s["name"] for s in staged}}
        staged = []
    todo = [i for i, name in enumerate(plan.names) if name not in records]
    labelled = bool(corpus.classes)
    if not ray_uploads:
        # a local output holds every shard; a staging folder at most max_staged of them at once
        need = [shard_need(plan, i, labelled) for i in todo]
        if remote is not None:
            need = sorted(need, reverse=True)[: remote.max_staged]
        try:
            check_space(folder, sum(need), what=f"writing {len(todo)} shard(s)")
        except DiskFull:
            if not resumed and remote is None:
                state.forget()
            raise
    else:
        assert remote is not None
        remote.remove_stale_manifest()
    task = TarTask(
        folder,
        labelled=labelled,
        skip_bad=skip_bad,
        fsync=fsync,
        source_options=corpus.storage_options,
        upload=remote.url if ray_uploads and remote is not None else None,
        upload_options=remote.options if ray_uploads and remote is not None else None,
        # a thread per writer pays only with a core free for it (measured: docs/convert.md)
        hash_thread=engine == "local" and max(1, workers) < usable_cores(),
    )
    bar = progress_bar(plan, set(records), resumed=resumed, enabled=progress)
    with bar:
        run_shards(
            state,
            plan,
            task,
            todo,
            workers=workers,
            engine=engine,
            address=address,
            bar=bar,
            remote=None if ray_uploads else remote,
            staged=staged,
            on_shard=_saving(state, on_shard) if ray_uploads else on_shard,
        )
        if remote is not None and not ray_uploads:
            bar.set_description_str("fastdata convert: waiting for the uploads")
            remote.poll(wait=True)
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
    write_atomic(manifest_path, dumps(manifest), fsync=fsync)
    if remote is not None:
        remote.finish(manifest_path)
    return manifest


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def shard_need(plan: Plan, i: int, labelled: bool) -> int:
    """Bytes shard ``i`` and its sidecar take on disk."""
    entries = plan.shards[i]
    return sum(tar_bytes(e.size, labelled) for e in entries) + RECORD + 2 * BLOCK + 128 * len(entries) + 4096


def _saving(state: ConversionState, on_shard: OnShard | None) -> OnShard:
    """For shards that Ray tasks uploaded themselves: the driver records each one, then passes it on."""

    def save(record: dict[str, Any]) -> None:
        state.save_record(record)
        if on_shard is not None:
            on_shard(record)

    return save


def build_manifest(plan: Plan, records: list[dict[str, Any]], corpus: Corpus, problems: list[str]) -> dict[str, Any]:
    """The manifest (layout in :mod:`fastdata.formats._manifest`) from the records of every shard."""
    from fastdata.core._version import __version__

    labels: Counter[int] = Counter()
    write_skips: list[str] = []
    renamed: Counter[str] = Counter()
    for r in records:
        labels.update({int(k): v for k, v in r["labels"].items()})
        write_skips.extend(r["skipped"])
        renamed.update(r.get("renamed", {}).values())
    all_problems = problems + write_skips
    shards = []
    for r in records:
        shard = {"name": r["name"], "samples": r["samples"], "bytes": r["bytes"], "sha256": r["sha256"]}
        if r.get("renamed"):
            shard["renamed"] = r["renamed"]
        shards.append(shard)
    manifest: dict[str, Any] = {
        "format": "tar",
        "version": 1,
        "samples": sum(r["samples"] for r in records),
        "fields": dict(sorted(sum((Counter(r.get("fields", {})) for r in records), Counter()).items())),
        "bytes": sum(r["bytes"] for r in records),
        "classes": corpus.classes,
        "class_counts": {c: labels.get(i, 0) for i, c in enumerate(corpus.classes)},
        "shards": shards,
        "pattern": brace_pattern(plan.names),
        "skipped": sum(1 for p in problems if file_problem(p)) + len(write_skips),
        "problems": all_problems,
        "source": corpus.root,
        "options": plan.options,
        "created_by": f"fastdata {__version__} convert",
    }
    image = next((e.ext for s in plan.shards for e in s if e.src_ext != e.ext), None)
    if image is not None:  # a corpus of mixed image extensions, stored under one (see plan.py)
        manifest["image_ext"] = image
        manifest["image_exts"] = dict(
            sorted(Counter(e.src_ext for s in plan.shards for e in s if e.ext == image).items())
        )
    return manifest


def dumps(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()
