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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastdata.convert._corpus import Corpus, scan_corpus
from fastdata.convert._options import Engine, Format
from fastdata.core._lazy import lazy_exports
from fastdata.core.errors import ConfigError, check_choice
from fastdata.storage import scheme

if TYPE_CHECKING:
    from fastdata.convert._upload import ShardUploader

# the uploader needs boto3: imported when asked for
__getattr__, __dir__ = lazy_exports(__name__, {"ShardUploader": "._upload"})


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
            as each is finished, the manifest last (see :mod:`fastdata.convert._remote`); the prefix must
            hold nothing else.
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
        storage_options (dict | None): s3:// output: :class:`~fastdata.storage.s3._client.S3Config`
            fields (``endpoint_url``, ``profile_name``, credentials, ``max_attempts`` ...). Defaults to the
            standard AWS chain (``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` ...).
        source_options (dict | None): s3:// source: the same fields. Defaults to ``storage_options``
            when the output is on S3 too, else the AWS chain.
        engine ("local" | "ray"): where the shard tasks run: this machine (``workers`` processes), or
            a Ray cluster (tar only; see :mod:`fastdata.convert._ray_engine`). Defaults to "local".
        address (str | None): ``engine="ray"``: the cluster to connect to (``ray.init(address=...)``).
            Defaults to ``$RAY_ADDRESS``, else a cluster running on this machine, else a new local one.
        on_shard (Callable[[dict], None] | None): called in this process with each finished shard's
            record (``name``, ``samples``, ``bytes``, ``sha256`` ...), as it is finished. Defaults to None.

    Raises:
        CorpusProblems: the corpus has problems and ``skip_bad`` is False (nothing is written).
        ConfigError: bad options, or ``out`` holds something else (or is a file).
        DiskFull: not enough free space for the planned output (checked before writing), or the disk
            filled up while writing (the unfinished shard is removed; a rerun resumes).
        SourceNotFound: ``src`` does not exist.
    """
    check_choice("format", format, Format)
    check_choice("engine", engine, Engine)
    out = os.fspath(out)
    src = os.fspath(src)
    if not scheme(out) and Path(out).exists() and not os.path.isdir(out):
        raise ConfigError(
            f"{out}: is a file, not a folder; fastdata convert writes shards, their indexes and a "
            "manifest into a folder: give a new or empty folder"
        )
    if engine != "ray" and address is not None:
        raise ConfigError("address applies to engine='ray' only")
    if scheme(src) and source_options is None and scheme(out):
        source_options = storage_options
    if format == "hdf5":
        if scheme(out) or staging is not None or storage_options:
            raise ConfigError(
                f"{out}: format='hdf5' writes local files; convert into a local folder, then "
                "upload the files (fastdata.storage.s3._reader.upload_file)"
            )
        if shuffle:
            raise ConfigError("shuffle applies to format='tar' only: HDF5 rows are always shuffled (seeded by seed)")
        if engine != "local":
            raise ConfigError("engine='ray' converts to tar shards; use format='tar', or engine='local' for HDF5")
        corpus = _scan_checked(src, skip_bad, source_options, progress)
        samples, fields = corpus.sample_fields()
        if samples < len(corpus.items):  # a row holds one file: a caption would be cut from its image
            raise ConfigError(
                f"{src}: {len(corpus.items) - samples} file(s) share their key with another (KEY.jpg, KEY.json: "
                f"{samples} samples of fields {', '.join(fields)}), and an HDF5 row holds one file; convert to "
                "tar shards (format='tar'), which keep each sample's files together"
            )
        try:
            from fastdata.convert._hdf5 import convert_hdf5  # imported on use: it needs h5py
        except ModuleNotFoundError as e:
            if e.name == "fastdata.convert._hdf5":
                raise ConfigError("format='hdf5' is not part of this version of fastdata; use format='tar'") from None
            raise ImportError(f"format='hdf5' needs {e.name}; install it with pip install 'fastdata[hdf5]'") from e
        from fastdata.convert._plan import parse_size

        manifest: dict[str, Any] = convert_hdf5(
            corpus,
            out,
            decode=decode,
            size=size,
            shard_size=None if shard_count is not None else parse_size(shard_size or "256MB"),
            shard_count=shard_count,
            workers=workers,
            seed=seed,
            prefix=prefix,
            skip_bad=skip_bad,
            restart=restart,
            fsync=fsync,
            progress=progress,
            on_shard=on_shard,
        )
        return manifest
    if decode or size is not None:
        raise ConfigError("decode and size apply to format='hdf5' only; tar shards keep the files' bytes")
    from fastdata.convert._plan import parse_size
    from fastdata.convert._tar import convert_tar

    corpus = _scan(src, source_options, progress)
    return convert_tar(
        corpus,
        out,
        shard_size=None if shard_count is not None else parse_size(shard_size or "256MB"),
        shard_count=shard_count,
        workers=workers,
        shuffle=shuffle,
        seed=seed,
        prefix=prefix,
        skip_bad=skip_bad,
        restart=restart,
        fsync=fsync,
        progress=progress,
        staging=staging,
        storage_options=storage_options,
        engine=engine,
        address=address,
        on_shard=on_shard,
    )


def _scan(src: str, source_options: dict[str, Any] | None, progress: bool = True) -> Corpus:
    if scheme(src) == "s3":
        from fastdata.convert._s3_corpus import scan_s3

        # the listing's bar appears once a second page is needed (a small prefix lists in one request)
        return scan_s3(src, source_options, progress=None if progress else False)
    if scheme(src):
        raise ConfigError(f"{src}: fastdata convert reads local folders and s3:// prefixes, not {scheme(src)}://")
    if source_options:
        raise ConfigError("source_options apply to an s3:// source only")
    return scan_corpus(src)


def _scan_checked(src: str, skip_bad: bool, source_options: dict[str, Any] | None, progress: bool) -> Corpus:
    from fastdata.convert._tar import CorpusProblems

    corpus = _scan(src, source_options, progress)
    if corpus.problems and not skip_bad:
        raise CorpusProblems(corpus.root, corpus.problems)
    return corpus


__all__ = ["Corpus", "Engine", "Format", "ShardUploader", "convert", "scan_corpus"]
