"""Running a conversion (:class:`~fastdata.convert.ConversionPlan`), whatever its format and engine.

The corpus is listed, then the work is planned (:mod:`fastdata.convert`: which file goes into which
shard under which key; HDF5 parts: ``plan_parts``), then each shard is written
whole by one task (``TarTask``, ``Hdf5Task``) on
an engine (:mod:`fastdata.convert`: this process or worker processes; :mod:`fastdata.convert`:
a Ray cluster) and recorded as finished (:mod:`fastdata.convert`). The manifest is written last,
from the records. For an ``s3://`` output the shards are written into a local staging folder and the
main process uploads each one as it is reported finished, the manifest last
(:mod:`fastdata.convert`); Ray tasks upload their shards themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

from fastdata.convert._corpus import Corpus, scan_corpus
from fastdata.convert._driver import ConversionBar, run_shards
from fastdata.convert._options import ConversionPlan, OnShard
from fastdata.convert._plan import Plan, brace_pattern, plan_shards
from fastdata.convert._resume import ConversionState, open_state, sync_dir
from fastdata.convert._space import DiskFull, check_space, full_disk_is_an_error
from fastdata.core import DIGESTS, __version__
from fastdata.core.errors import ConfigError, FastdataError
from fastdata.formats import MANIFEST
from fastdata.formats.tar import write_atomic

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


def scan(plan: ConversionPlan) -> Corpus:
    """The corpus at ``plan.src`` (a local folder, or an ``s3://`` prefix listed once)."""
    if plan.src_scheme:
        from fastdata.convert._s3_corpus import scan_s3

        # the listing's bar appears once a second page is needed (a small prefix lists in one request)
        return scan_s3(plan.src, plan.source_options, progress=None if plan.progress else False)
    return scan_corpus(plan.src)


def run(plan: ConversionPlan, corpus: Corpus | None = None) -> dict[str, Any]:
    """Convert as ``plan`` says, resuming an interrupted run in its output; return the manifest written.
    ``corpus``: the source as listed already (else it is listed here)."""
    hdf5: Any = None
    if plan.format == "hdf5":
        try:
            from fastdata.convert import _hdf5 as hdf5  # imported on use: it needs h5py
        except ModuleNotFoundError as e:
            if e.name == "fastdata.convert._hdf5":
                raise ConfigError("format='hdf5' is not part of this version of fastdata; use format='tar'") from None
            raise ImportError(f"format='hdf5' needs {e.name}; install it with pip install 'fastdata[hdf5]'") from e
    if plan.engine == "ray":
        from fastdata.convert._ray_engine import check_cluster

        check_cluster(plan.address)
    remote = None
    folder = plan.out
    if plan.remote:
        # imported here: the S3 client brings torch (2 s of start-up) that a local conversion never needs
        from fastdata.convert._remote import RemoteOutput, staging_folder

        folder = staging_folder(plan.out, plan.staging)
        remote = RemoteOutput(plan.out, folder, workers=plan.workers, storage_options=plan.storage_options)
    corpus = scan(plan) if corpus is None else corpus
    if hdf5 is not None:
        samples, fields = corpus.sample_fields()
        if samples < len(corpus.items):  # a row holds one file: a caption would be cut from its image
            raise ConfigError(
                f"{plan.src}: {len(corpus.items) - samples} file(s) share their key with another (KEY.jpg, "
                f"KEY.json: {samples} samples of fields {', '.join(fields)}), and an HDF5 row holds one file; "
                "convert to tar shards (format='tar'), which keep each sample's files together"
            )
    if hdf5 is not None and corpus.problems:
        if not plan.skip_bad:
            raise CorpusProblems(corpus.root, corpus.problems)
        warnings.warn(
            f"fastdata convert: {len(corpus.problems)} file(s) of the corpus cannot be used and are "
            f"left out (listed in the manifest's 'problems'); first: {corpus.problems[0]}",
            stacklevel=3,
        )
    if not plan.src_scheme and os.path.commonpath([os.path.realpath(folder), corpus.root]) == corpus.root:
        raise ConfigError(
            f"{folder}: is inside the corpus {corpus.root}; its shards would be converted next "
            "time; write them somewhere else"
        )
    shape = None
    if hdf5 is not None:
        shards, shape = hdf5.plan_parts(corpus, plan)
    else:
        shards = plan_shards(
            corpus,
            shard_size=plan.shard_size,  # type: ignore[arg-type]
            shard_count=plan.shard_count,
            shuffle=plan.shuffle,
            seed=plan.seed,
            prefix=plan.prefix,
        )
        shards.options["skip_bad"] = plan.skip_bad
    problems = corpus.problems + shards.problems
    if problems and not plan.skip_bad:
        raise CorpusProblems(corpus.root, problems)
    if remote is not None:
        shards.options["out"] = remote.url  # one staging folder, one destination
        remote.check_prefix(shards)
    with contextlib.ExitStack() as stack:
        if remote is not None:
            stack.enter_context(remote)  # leaving early cancels the uploads still queued: no manifest
        stack.enter_context(full_disk_is_an_error(folder))
        state = stack.enter_context(open_state(folder, fsync=plan.fsync))
        manifest = _convert_in(state, plan, shards, corpus, problems, remote, hdf5, shape)
    if remote is not None:
        remote.remove_staging()  # complete: nothing left to resume
    return manifest


def _convert_in(
    state: ConversionState,
    plan: ConversionPlan,
    shards: Plan,
    corpus: Corpus,
    problems: list[str],
    remote: RemoteOutput | None,
    hdf5: Any,
    shape: tuple[int, int, int] | None,
) -> dict[str, Any]:
    folder = state.out
    resumed = state.check_or_start(shards, src=corpus.root, restart=plan.restart)
    state.clean_temporaries()
    staged: list[dict[str, Any]] = []
    if remote is None:
        records = state.finished(shards)
    else:
        records, staged = remote.done_records(state, shards)
    ray_uploads = plan.engine == "ray" and remote is not None
    if ray_uploads and staged:  # Ray tasks upload what they write: write these again (the same bytes)
        records = {n: r for n, r in records.items() if n not in {s["name"] for s in staged}}
        staged = []
    todo = [i for i, name in enumerate(shards.names) if name not in records]
    if hdf5 is not None:
        task: Any = hdf5.Hdf5Task.of(plan, list(corpus.classes), shape)
        what = f"writing {len(todo)} HDF5 part(s)"
    else:
        from fastdata.convert._tar import TarTask

        task = TarTask.of(plan, folder, bool(corpus.classes), corpus.storage_options, remote, ray_uploads)
        what = f"writing {len(todo)} shard(s)"
    if ray_uploads:
        assert remote is not None
        remote.remove_stale_manifest()
    else:
        # a local output holds every shard; a staging folder at most max_staged of them at once
        need = [task.need(shards, i) for i in todo]
        if remote is not None:
            need = sorted(need, reverse=True)[: remote.max_staged]
        try:
            check_space(folder, sum(need), what=what)
        except DiskFull:
            if not resumed and remote is None:
                state.forget()
            raise
    with ConversionBar(shards, set(records), resumed=resumed, enabled=plan.progress) as bar:
        run_shards(
            state,
            shards,
            task,
            todo,
            workers=plan.workers,
            engine=plan.engine,
            address=plan.address,
            bar=bar,
            remote=None if ray_uploads else remote,
            staged=staged,
            on_shard=_saving(state, plan.on_shard) if ray_uploads else plan.on_shard,
        )
        if remote is not None and not ray_uploads:
            bar.waiting_for_uploads()
            remote.poll(wait=True)
    if plan.fsync:
        sync_dir(folder)
    if remote is None:
        records, where = state.finished(shards), "on disk"
    else:  # each one verified uploaded by now
        records, where = {n: r for n, r in state.records(shards).items() if r.get("uploaded")}, "uploaded"
    missing = [n for n in shards.names if n not in records]
    if missing:
        raise FastdataError(
            f"{folder}: {'parts' if hdf5 else 'shards'} {missing[:3]} were written but are not {where} as "
            "recorded (removed meanwhile?); rerun the same command to redo them"
        )
    done = [records[n] for n in shards.names]
    manifest = task.manifest(shards, done, corpus, problems, base_manifest(shards, done, corpus, problems))
    manifest_path = os.path.join(folder, MANIFEST)
    write_atomic(manifest_path, (json.dumps(manifest, indent=1) + "\n").encode(), fsync=plan.fsync)
    if remote is not None:
        remote.finish(manifest_path)
    return manifest


def base_manifest(shards: Plan, records: list[dict[str, Any]], corpus: Corpus, problems: list[str]) -> dict[str, Any]:
    """What every format's manifest holds (layout in :mod:`fastdata.formats`)."""
    labels: Counter[int] = Counter()
    skips: list[str] = []
    for r in records:
        labels.update({int(k): v for k, v in r["labels"].items()})
        skips.extend(r["skipped"])
    keys = ("name", "samples", "bytes", *DIGESTS, "renamed")
    return {
        "format": shards.options.get("format", "tar"),
        "version": 1,
        "samples": sum(r["samples"] for r in records),
        "fields": dict(sorted(sum((Counter(r.get("fields", {})) for r in records), Counter()).items())),
        "bytes": sum(r["bytes"] for r in records),
        "classes": list(corpus.classes),
        "class_counts": {c: labels.get(i, 0) for i, c in enumerate(corpus.classes)},
        # each shard's digest under its own name: "sha256" where a store or user checks it, else the fast one
        "shards": [{k: r[k] for k in keys if r.get(k)} for r in records],
        "pattern": brace_pattern(shards.names),
        "skipped": sum(1 for p in problems if file_problem(p)) + len(skips),
        "problems": problems + skips,
        "source": corpus.root,
        "options": shards.options,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_by": f"fastdata {__version__} convert",
    }


def _saving(state: ConversionState, on_shard: OnShard | None) -> OnShard:
    """For shards that Ray tasks uploaded themselves: the driver records each one, then passes it on."""

    def save(record: dict[str, Any]) -> None:
        state.save_record(record)
        if on_shard is not None:
            on_shard(record)

    return save
