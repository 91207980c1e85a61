"""Converting a small-file corpus (an ImageFolder tree or a flat folder) into tar shards or HDF5.

``fastdata.convert.convert(src, out, format="tar")`` is what ``fastdata convert`` and
``tools/make_shards.py`` run.

Bad input policy: the corpus is listed first, and every problem found (unreadable files, broken links,
symlink loops, empty class folders, a ``.cls`` file that would clash with the label member) is
reported at once, before anything is written. ``skip_bad=True`` (``--skip-bad``) converts the rest
instead; the manifest then lists the problems and counts the files left out (``"skipped"``). A file
that becomes unreadable during the conversion is handled the same way.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from fastdata.convert.corpus import Corpus, scan_corpus
from fastdata.core.errors import ConfigError, check_choice
from fastdata.storage import scheme

Format = Literal["tar", "hdf5"]


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
) -> dict[str, Any]:
    """Convert the corpus at ``src`` into ``out``; return the manifest written to ``out/manifest.json``.

    Tar output is resumable: rerun the same call after an interruption (even ``SIGKILL``) and finished
    shards are kept, the rest written; no file is lost or written twice. The output depends only on
    the corpus and the options (not on ``workers``), so the rerun may use another ``workers``.

    Args:
        src: an ImageFolder tree (a folder per class; labels become ``.cls``) or a flat folder of files.
        out: the output folder; must be empty or new, or hold an interrupted run of the same conversion.
            Or, for tar, ``s3://bucket/prefix``: shards are written to a local staging folder and uploaded
            as each is finished, the manifest last (see :mod:`fastdata.convert.remote`); the prefix must
            hold nothing else.
        format ("tar" | "hdf5"): Defaults to "tar".
        shard_size (int | str | None): most bytes per shard, like ``"256MB"`` or ``"1GiB"`` (a single larger
            file gets a shard of its own). Defaults to "256MB".
        shard_count (int | None): instead, exactly this many shards of equal sample counts.
        workers (int): processes writing shards in parallel. Defaults to 1.
        shuffle (bool): shuffle the files across shards (seeded by ``seed``). Defaults to False (path order).
        seed (int): Defaults to 0.
        prefix (str): shards are named ``PREFIX-000000.tar`` ... Defaults to "shard".
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
        storage_options (dict | None): s3:// output: :class:`~fastdata.storage.s3_client.S3Config`
            fields (``endpoint_url``, ``profile_name``, credentials, ``max_attempts`` ...). Defaults to the
            standard AWS chain (``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` ...).

    Raises:
        CorpusProblems: the corpus has problems and ``skip_bad`` is False (nothing is written).
        ConfigError: bad options, or ``out`` holds something else.
        SourceNotFound: ``src`` does not exist.
    """
    check_choice("format", format, Format)
    out = os.fspath(out)
    if format == "hdf5":
        if scheme(out) or staging is not None or storage_options:
            raise ConfigError(
                f"{out}: format='hdf5' writes a local file; convert into a local folder, then "
                "upload the file (fastdata.storage.s3.upload_file)"
            )
        if shard_count is not None or shuffle or workers != 1:
            raise ConfigError("shard_count, shuffle and workers apply to format='tar' only")
        corpus = _scan_checked(src, skip_bad)
        try:
            from fastdata.convert.hdf5 import convert_hdf5  # imported on use: it needs h5py
        except ModuleNotFoundError as e:
            if e.name == "fastdata.convert.hdf5":
                raise ConfigError("format='hdf5' is not part of this version of fastdata; use format='tar'") from None
            raise ImportError(f"format='hdf5' needs {e.name}; install it with pip install 'fastdata[hdf5]'") from e

        manifest: dict[str, Any] = convert_hdf5(corpus, out, decode=decode, size=size, progress=progress)
        return manifest
    if decode or size is not None:
        raise ConfigError("decode and size apply to format='hdf5' only; tar shards keep the files' bytes")
    from fastdata.convert.plan import parse_size
    from fastdata.convert.tar import convert_tar

    corpus = scan_corpus(src)
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
    )


def _scan_checked(src: str | os.PathLike[str], skip_bad: bool) -> Corpus:
    from fastdata.convert.tar import CorpusProblems

    corpus = scan_corpus(src)
    if corpus.problems and not skip_bad:
        raise CorpusProblems(corpus.root, corpus.problems)
    return corpus


__all__ = ["Corpus", "Format", "convert", "scan_corpus"]
