"""Converting a small-file corpus (an ImageFolder tree or a flat folder, local or under an ``s3://``
prefix) into tar shards or HDF5 parts, on this machine or on a Ray cluster.

``fastdata.convert.convert(src, out, format="tar")`` is what ``fastdata convert`` and
``tools/make_shards.py`` run; docs/convert.md tells the whole story.

Bad input policy: the corpus is listed first, and every problem found (unreadable files, broken links,
links that would convert a file twice, empty class folders, a ``.cls`` file that would clash with the
label member) is reported at once, before anything is written. ``skip_bad=True`` (``--skip-bad``)
converts the rest instead; the manifest then lists the problems and counts the files left out
(``"skipped"``). A file that becomes unreadable during the conversion (or, for HDF5 with ``decode``, an
image that does not decode) is handled the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastdata.convert._corpus import Corpus, scan_corpus
from fastdata.convert._options import ConversionPlan, Engine, Format
from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.convert._run import CorpusProblems
    from fastdata.convert._upload import ShardUploader

# the uploader needs boto3, the run the writers: imported when asked for
__getattr__, __dir__ = lazy_exports(__name__)


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: Format = "tar",
    shard_size: int | str | None = "256MB",
    shard_count: int | None = None,
    workers: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    prefix: str = "shard",
    skip_bad: bool = False,
    restart: bool = False,
    fsync: bool = True,
    decode: bool = False,
    size: tuple[int, int] | None = None,
    progress: bool = True,
    staging: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    source_options: dict[str, Any] | None = None,
    engine: Engine = "local",
    address: str | None = None,
    on_shard: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Convert the corpus at ``src`` into ``out``; return the manifest written to ``out/manifest.json``.

    Resumable: rerun the same call after an interruption (even ``SIGKILL``) and finished shards (tar)
    or parts (HDF5) are kept, the rest written; no file is lost or written twice. The output depends
    only on the corpus and the options (not on ``workers`` nor ``engine``), so the rerun may use others.

    Args:
        src: an ImageFolder tree (a folder per class; labels become ``.cls``) or a flat folder of files;
            or ``s3://bucket/prefix/`` laid out the same way (listed once; objects read by the tasks).
        out: the output folder; must be empty or new, or hold an interrupted run of the same conversion.
            Or, for tar, ``s3://bucket/prefix``: shards are written to a local staging folder and uploaded
            as each is finished, the manifest last (docs/convert.md); the prefix must hold nothing else.
        format ("tar" | "hdf5"): Defaults to "tar".
        shard_size (int | str | None): most bytes per shard or part, like ``"256MB"`` or ``"1GiB"`` (a
            single larger file gets a shard of its own). Defaults to "256MB".
        shard_count (int | None): instead, exactly this many shards of equal sample counts.
        workers (int): processes writing shards in parallel (``engine="local"``). Defaults to 1.
        shuffle (bool): tar: shuffle the files across shards (seeded by ``seed``). Defaults to False
            (path order). HDF5 rows are always in a shuffled order (seeded by ``seed``).
        seed (int): Defaults to 0.
        prefix (str): shards are named ``PREFIX-000000.tar`` (HDF5: ``PREFIX-000000.h5``) ... Defaults
            to "shard".
        skip_bad (bool): convert what can be converted and list the rest in the manifest. Defaults to False.
        restart (bool): discard an interrupted run in ``out`` made with other options. Defaults to False.
        fsync (bool): flush every shard to disk before recording it as finished, so that finished
            shards survive a power loss too (a killed process never loses them). Defaults to True.
        decode (bool): hdf5 only: store decoded pixels instead of encoded bytes. Defaults to False.
        size (tuple[int, int] | None): hdf5 with ``decode``: resize images to (height, width).
        progress (bool): show a progress bar (files and MB/s). Defaults to True.
        staging (str | PathLike | None): s3:// output: the local folder to stage shards in (a subfolder
            named after ``out`` is used, and deleted once the conversion is complete). Defaults to
            ``$FASTDATA_CACHE_DIR/convert-staging`` (``~/.cache/fastdata/convert-staging``).
        storage_options (dict | None): s3:// output: :class:`fastdata.storage.s3.S3Config`
            fields (``endpoint_url``, ``profile_name``, credentials, ``max_attempts`` ...). Defaults to the
            standard AWS chain (``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` ...).
        source_options (dict | None): s3:// source: the same fields. Defaults to ``storage_options``
            when the output is on S3 too, else the AWS chain.
        engine ("local" | "ray"): where the shard tasks run: this machine (``workers`` processes), or
            a Ray cluster (tar only; docs/convert.md). Defaults to "local".
        address (str | None): ``engine="ray"``: the cluster to connect to (``ray.init(address=...)``).
            Defaults to ``$RAY_ADDRESS``, else a cluster running on this machine, else a new local one.
        on_shard (Callable[[dict], None] | None): called in this process with each finished shard's
            record (``name``, ``samples``, ``bytes``, its digest: ``sha256`` for an ``s3://`` output, else
            ``xxh3_128`` ...), as it is finished. Defaults to None.

    Raises:
        CorpusProblems: the corpus has problems and ``skip_bad`` is False (nothing is written).
        ConfigError: bad options, or ``out`` holds something else (or is a file).
        DiskFull: not enough free space for the planned output (checked before writing), or the disk
            filled up while writing (the unfinished shard is removed; a rerun resumes).
        SourceNotFound: ``src`` does not exist.
    """
    plan = ConversionPlan(
        os.fspath(src),
        os.fspath(out),
        format=format,
        shard_size=shard_size,
        shard_count=shard_count,
        workers=workers,
        shuffle=shuffle,
        seed=seed,
        prefix=prefix,
        skip_bad=skip_bad,
        restart=restart,
        fsync=fsync,
        decode=decode,
        size=size,
        progress=progress,
        staging=None if staging is None else os.fspath(staging),
        storage_options=storage_options,
        source_options=source_options,
        engine=engine,
        address=address,
        on_shard=on_shard,
    )
    from fastdata.convert._run import run

    return run(plan)


__all__ = ["ConversionPlan", "Corpus", "CorpusProblems", "Engine", "Format", "ShardUploader", "convert", "scan_corpus"]
