"""A small-file corpus -> HDF5 parts (``fastdata convert SRC OUT --format hdf5``).

The output folder gets several HDF5 files, ``PREFIX-000000.h5`` ... (``shard_size`` bytes or
``shard_count`` parts, like tar shards), each holding three fields of one row per sample:

* ``image``: the JPEG (or PNG ...) bytes as variable-length ``uint8`` rows; or, with ``decode=True``,
  decoded RGB images as a fixed-shape ``(N, H, W, 3)`` ``uint8`` array (every image resized to ``size``,
  or all of one size already);
* ``label``: ``int64`` class numbers (``-1`` for a flat folder without classes);
* ``key``: each sample's path below the corpus root (a string), so every row traces back to its file.

``fd.HDF5Dataset("OUT/PREFIX-{000000..000003}.h5")`` (the manifest's ``"pattern"``) reads them as one
dataset; ``fastdata bench OUT`` finds them. Class names go into each file's attributes and into
``manifest.json`` (the layout of :mod:`fastdata.formats._manifest`, ``"format": "hdf5"``). Rows are written
in an order shuffled with ``seed`` (default 0), because a corpus is sorted by class folder and readers
that keep neighbouring rows together (:class:`~fastdata.loading._chunk_sampler.ChunkBatchSampler`,
sequential reads) would otherwise get batches of a single class.

Resumable by parts: each part is written under a temporary name and renamed only when complete, then
recorded (``OUT/.fastdata-convert/``, as for tar). A run killed part way loses only the parts being
written; the rerun keeps the finished ones and writes the rest, with the same bytes (an HDF5 file cut off
mid-write cannot be trusted, so there is no resuming inside one part). Parts are written in parallel
with ``workers``. The manifest comes last.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.convert._corpus import Corpus
from fastdata.convert._driver import OnShard, progress_bar, run_shards
from fastdata.convert._hdf5_task import ROW_OVERHEAD, Hdf5Task, decode_image
from fastdata.convert._plan import Entry, Plan, brace_pattern, check_prefix, cut, shard_names, split_ext
from fastdata.convert._resume import open_state, sync_dir
from fastdata.convert._space import DiskFull, check_space, full_disk_is_an_error
from fastdata.core.errors import ConfigError, DecodeFailed, FastdataError, SourceNotFound, SourceUnreadable
from fastdata.formats._manifest import MANIFEST
from fastdata.formats.tar._writer import write_atomic
from fastdata.storage import scheme

WRITE_ORDER_SEED = 0
"""The default seed of the order in which samples are written."""


def plan_parts(
    corpus: Corpus,
    *,
    decode: bool,
    size: tuple[int, int] | None,
    shard_size: int | None,
    shard_count: int | None,
    seed: int,
    prefix: str,
    skip_bad: bool,
) -> tuple[Plan, tuple[int, int, int] | None]:
    """Rows in their shuffled order, cut into parts; and the decoded image shape (None without decode)."""
    check_prefix(prefix)
    order = np.random.default_rng(seed).permutation(len(corpus.items))
    entries = []
    for i in order:
        item = corpus.items[i]
        ext = split_ext(item.relpath)[1]
        entries.append(Entry(item.path, item.relpath, item.relpath, ext, item.label, item.size, item.mtime, ext))
    shape: tuple[int, int, int] | None = None
    if decode:
        shape = (size[0], size[1], 3) if size is not None else _first_shape(entries, skip_bad)
        cost = [int(np.prod(shape)) + ROW_OVERHEAD] * len(entries)
    else:
        cost = [e.size + ROW_OVERHEAD for e in entries]
    parts = cut(entries, cost if shard_size is not None else [], shard_size=shard_size, shard_count=shard_count)
    options: dict[str, object] = {
        "format": "hdf5",
        "decode": decode,
        "size": list(size) if size is not None else None,
        "shard_size": shard_size,
        "shard_count": shard_count,
        "seed": seed,
        "prefix": prefix,
        "skip_bad": skip_bad,
    }
    return Plan(shard_names(prefix, len(parts), "h5"), parts, options), shape


def _first_shape(entries: list[Entry], skip_bad: bool) -> tuple[int, int, int]:
    """The shape of the first image that decodes: what every decoded image must have without ``size``."""
    from fastdata.convert._hdf5_task import _read

    for e in entries:
        try:
            return tuple(decode_image(e.path, _read(e), None).shape)  # type: ignore[return-value]
        except (DecodeFailed, SourceNotFound, SourceUnreadable):
            if not skip_bad:
                raise
    raise ConfigError("no file of the corpus decodes as an image; convert without --decode to keep the bytes")


def convert_hdf5(
    corpus: Corpus,
    out: str,
    *,
    decode: bool = False,
    size: tuple[int, int] | None = None,
    shard_size: int | None = 256 * 10**6,
    shard_count: int | None = None,
    workers: int = 1,
    seed: int = WRITE_ORDER_SEED,
    prefix: str = "shard",
    skip_bad: bool = False,
    restart: bool = False,
    fsync: bool = True,
    progress: bool = True,
    on_shard: OnShard | None = None,
) -> dict[str, Any]:
    """Write ``corpus`` into HDF5 parts and a ``manifest.json`` in folder ``out``; resume an interrupted
    run there; return the manifest.

    Args:
        corpus (Corpus): the files, from :func:`fastdata.convert._corpus.scan_corpus`.
        out (str): the output folder: new, empty, or holding an interrupted run of the same conversion.
        decode (bool): store decoded RGB images as a fixed-shape ``uint8`` array instead of their bytes.
        size (tuple[int, int] | None): ``(height, width)`` to resize every decoded image to; None keeps
            the images' own size, which must then be the same for all. Needs ``decode``.
        shard_size (int | None): most bytes per part (of image bytes, or decoded pixels). Defaults to 256 MB.
        shard_count (int | None): instead, exactly this many parts of equal row counts.
        workers (int): processes writing parts (and decoding) in parallel. Defaults to 1.
        seed (int): seed of the rows' shuffled order. Defaults to 0.
        prefix (str): parts are ``PREFIX-000000.h5`` ... Defaults to "shard".
        skip_bad (bool): leave out (and list) files that cannot be read or decoded. Defaults to False.
        restart (bool): discard an interrupted run with other options. Defaults to False.
        fsync (bool): flush each part to disk before recording it. Defaults to True.
        progress (bool): show a progress bar (tqdm).
        on_shard: called with each finished part's record. Defaults to None.

    Raises:
        ConfigError: ``size`` without ``decode``, a bad ``size``, images of different sizes without one,
            or ``out`` not a folder.
        DecodeFailed: with ``decode``, a file that is not a readable image (without ``skip_bad``).
        DiskFull: not enough space for the planned parts.
        SourceNotFound: a corpus file vanished after the corpus was scanned (without ``skip_bad``).
    """
    if size is not None:
        if not decode:
            raise ConfigError("size=(H, W) resizes decoded images: pass decode=True (--decode) with it")
        if len(size) != 2 or min(size) < 1:
            raise ConfigError(f"size={size!r} must be (height, width) of at least 1 pixel")
    if scheme(corpus.root):
        raise ConfigError(f"{corpus.root}: format='hdf5' converts local folders; use format='tar' for s3:// sources")
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    if Path(out).exists() and not os.path.isdir(out):
        raise ConfigError(
            f"{out}: is a file; the HDF5 parts and their manifest go into a folder: give a new or empty one"
        )
    if out.lower().endswith((".h5", ".hdf5")) and not os.path.isdir(out):
        raise ConfigError(
            f"{out}: looks like a file name; the conversion writes several HDF5 files (PREFIX-000000.h5 ...) "
            "and a manifest into a folder: give the folder"
        )
    if corpus.problems:
        if not skip_bad:
            from fastdata.convert._tar import CorpusProblems

            raise CorpusProblems(corpus.root, corpus.problems)
        warnings.warn(
            f"fastdata convert: {len(corpus.problems)} file(s) of the corpus cannot be used and are "
            f"left out (listed in the manifest's 'problems'); first: {corpus.problems[0]}",
            stacklevel=2,
        )
    plan, shape = plan_parts(
        corpus,
        decode=decode,
        size=size,
        shard_size=shard_size if shard_count is None else None,
        shard_count=shard_count,
        seed=seed,
        prefix=prefix,
        skip_bad=skip_bad,
    )
    os.makedirs(out, exist_ok=True)
    with full_disk_is_an_error(out), open_state(out, fsync=fsync) as state:
        resumed = state.check_or_start(plan, src=corpus.root, restart=restart)
        state.clean_temporaries()
        records = state.finished(plan)
        todo = [i for i, name in enumerate(plan.names) if name not in records]
        row = int(np.prod(shape)) if shape is not None else 0
        need = sum(
            (row * len(plan.shards[i]) if decode else plan.shard_bytes(i)) + 64 * len(plan.shards[i]) for i in todo
        )
        try:
            check_space(out, int(need * 1.05) + (1 << 20) * len(todo), what=f"writing {len(todo)} HDF5 part(s)")
        except DiskFull:
            if not resumed:
                state.forget()
            raise
        task = Hdf5Task(
            out, list(corpus.classes), decode=decode, size=size, shape=shape, skip_bad=skip_bad, fsync=fsync, seed=seed
        )
        bar = progress_bar(plan, set(records), resumed=resumed, enabled=progress)
        with bar:
            run_shards(state, plan, task, todo, workers=workers, bar=bar, on_shard=on_shard)
        if fsync:
            sync_dir(out)
        records = state.finished(plan)
        missing = [n for n in plan.names if n not in records]
        if missing:
            raise FastdataError(
                f"{out}: parts {missing[:3]} were written but are not on disk as recorded (removed "
                "meanwhile?); rerun the same command to redo them"
            )
        manifest = _manifest(corpus, plan, [records[n] for n in plan.names], decode=decode, shape=shape)
        write_atomic(os.path.join(out, MANIFEST), (json.dumps(manifest, indent=1) + "\n").encode(), fsync=fsync)
    return manifest


def _manifest(
    corpus: Corpus, plan: Plan, records: list[dict[str, Any]], *, decode: bool, shape: tuple[int, int, int] | None
) -> dict[str, Any]:
    from fastdata.core._version import __version__

    labels: Counter[int] = Counter()
    skips: list[str] = []
    for r in records:
        labels.update({int(k): v for k, v in r["labels"].items()})
        skips.extend(r["skipped"])
    image: dict[str, Any] = (
        {"kind": "array", "dtype": "uint8", "shape": list(shape)} if shape is not None else {"kind": "bytes"}
    )
    with contextlib.suppress(KeyError):
        del labels[-1]
    return {
        "format": "hdf5",
        "version": 1,
        "samples": sum(r["samples"] for r in records),
        "bytes": sum(r["bytes"] for r in records),
        "classes": list(corpus.classes),
        "class_counts": {c: labels.get(i, 0) for i, c in enumerate(corpus.classes)},
        "shards": [
            {"name": r["name"], "samples": r["samples"], "bytes": r["bytes"], "sha256": r["sha256"]} for r in records
        ],
        "pattern": brace_pattern(plan.names),
        "fields": {"image": image, "label": {"kind": "array", "dtype": "int64", "shape": []}, "key": {"kind": "str"}},
        "decoded": decode,
        "write_order_seed": plan.options["seed"],
        "skipped": sum(1 for p in corpus.problems if "class folder has no readable file" not in p) + len(skips),
        "problems": list(corpus.problems) + skips,
        "source": corpus.root,
        "options": plan.options,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_by": f"fastdata {__version__} convert",
    }
