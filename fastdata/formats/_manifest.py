"""``manifest.json``: what a converted folder holds, written last by ``fastdata convert``.

Readers use it to know each shard's sample count without opening the shard, so that every rank can
plan the epoch at construction, and to read the folder itself as a dataset's input
(:func:`resolve_sources`: ``TarShardDataset("shards/train")`` reads the shards its manifest lists).
Layout::

    {"format": "tar", "version": 1, "samples": 10000, "bytes": 312000000,
     "classes": ["cat", "dog"], "class_counts": {"cat": 5000, "dog": 5000},
     "shards": [{"name": "train-000000.tar", "samples": 1000, "bytes": 31200000, "xxh3_128": "..."}]}

Each shard's digest is keyed by its kind (:data:`fastdata.core.DIGESTS`): ``"sha256"`` where a store keeps
it (an ``s3://`` output, and every manifest written before the fast digest), else ``"xxh3_128"``.
"""

from __future__ import annotations

import glob
import json
import os
import posixpath
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from fastdata.core.errors import ConfigError, FastdataError, SourceNotFound
from fastdata.storage import Reader, expand_urls, open_reader, scheme

MANIFEST = "manifest.json"
RESUME_FOLDER = ".fastdata-convert"  # what `fastdata convert` keeps beside the shards (its resume records)
Kind = Literal["tar", "hdf5"]
# the files a folder without a manifest is read as, per kind (compressed tars are named so that their own
# reader says what it makes of them)
SUFFIXES: dict[str, tuple[str, ...]] = {
    "tar": (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar.zst"),
    "hdf5": (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".h5ad"),
}
_READER = {"tar": "fastdata.TarShardDataset", "hdf5": "fastdata.HDF5Dataset"}


def parent(url: str) -> str:
    """The folder (or prefix) holding ``url``."""
    return posixpath.dirname(url)


def read_manifest(folder: str, opener: Callable[[str], Reader] = open_reader) -> dict[str, Any] | None:
    """The manifest in ``folder``, or None when there is none.

    Args:
        folder (str): a local folder or an ``s3://bucket/prefix``.
        opener: opens a URL for reading. Defaults to :func:`fastdata.storage.open_reader`.
    """
    url = posixpath.join(folder, MANIFEST) if folder else MANIFEST
    try:
        reader = opener(url)
    except SourceNotFound:
        return None
    try:
        data = reader.read(0, reader.size)
    finally:
        reader.close()
    try:
        manifest: dict[str, Any] = json.loads(data)
    except ValueError as e:
        raise FastdataError(f"{url}: not valid JSON ({e}); delete it or rerun 'fastdata convert'") from None
    return manifest


def shard_listing(urls: list[str], opener: Callable[[str], Reader] = open_reader) -> dict[str, tuple[int, int]]:
    """``(samples, bytes)`` of the shards in ``urls`` that a manifest beside them lists (bytes -1 where it
    gives none)."""
    listed: dict[str, tuple[int, int]] = {}
    for folder in sorted({parent(u) for u in urls}):
        manifest = read_manifest(folder, opener)
        if not manifest:
            continue
        for shard in manifest.get("shards", []):
            url = posixpath.join(folder, shard["name"]) if folder else shard["name"]
            listed[url] = (int(shard["samples"]), int(shard.get("bytes", -1)))
    return {u: listed[u] for u in urls if u in listed}


def sample_counts(urls: list[str], opener: Callable[[str], Reader] = open_reader) -> dict[str, int]:
    """Sample counts of the shards in ``urls`` that a manifest beside them lists."""
    return {u: n for u, (n, _) in shard_listing(urls, opener).items()}


def is_folder(url: str) -> bool:
    """Whether ``url`` names a folder: a local directory, or an ``s3://`` prefix given with a trailing
    slash. A directory named like a data file (``x.tar``, ``a.h5``) is not: it stands where a file was
    expected, and its reader says so (an unreadable source, skipped under ``on_error="skip"``)."""
    if scheme(url):
        return url.endswith("/")
    named_like_a_file = url.lower().rstrip("/").endswith(tuple(s for kind in SUFFIXES.values() for s in kind))
    return os.path.isdir(url) and not named_like_a_file


def folder_sources(folder: str, kind: Kind, opener: Callable[[str], Reader] = open_reader) -> list[str]:
    """The files of a folder that ``fastdata convert`` (or ``fastdata inspect --write-manifest``) wrote,
    in the order its manifest lists them; without a manifest, a local folder's files of ``kind`` (by
    suffix, sorted, not searched below the folder).

    Args:
        folder (str): a local folder or an ``s3://bucket/prefix/``.
        kind ("tar" | "hdf5"): what the dataset reads.
        opener: opens the manifest. Defaults to :func:`fastdata.storage.open_reader`.

    Raises:
        SourceNotFound: the folder holds no shards (an empty folder, a manifest listing none, or an S3
            prefix without a manifest), or holds an unfinished conversion.
        ConfigError: the manifest says the folder holds the other kind (HDF5 parts given to a tar dataset).
    """
    base = folder.rstrip("/") or folder
    manifest = read_manifest(base, opener)
    if manifest is not None:
        fmt = manifest.get("format", "tar")
        if fmt != kind and fmt in _READER:
            raise ConfigError(
                f"{base}: holds {'HDF5 parts' if fmt == 'hdf5' else 'tar shards'} (its {MANIFEST} says "
                f"format {fmt!r}); read it with {_READER[fmt]}({base!r})"
            )
        names = [str(s["name"]) for s in manifest.get("shards", [])]
        if not names:
            raise SourceNotFound(f"{base}: holds no shards (its {MANIFEST} lists none)", base)
        return [posixpath.join(base, n) for n in names]
    if scheme(base):
        raise SourceNotFound(
            f"{folder}: holds no {MANIFEST}, so fastdata cannot tell its shards; give them as a pattern "
            f"({posixpath.join(base, 'shard-{000000..000099}.tar')}), or list it with 'fastdata inspect {folder}'",
            folder,
        )
    if os.path.isdir(os.path.join(base, RESUME_FOLDER)):
        raise SourceNotFound(
            f"{base}: holds an unfinished conversion (no {MANIFEST} yet): rerun the same 'fastdata convert' "
            "command to finish it, or give the shards written so far as a pattern",
            base,
        )
    suffixes = SUFFIXES[kind]
    found = sorted(
        os.path.join(base, name)
        for name in os.listdir(base)
        if not name.startswith(".") and name.lower().endswith(suffixes) and os.path.isfile(os.path.join(base, name))
    )
    if not found:
        inside = sorted(
            os.path.join(base, d)
            for d in os.listdir(base)
            if not d.startswith(".") and os.path.isfile(os.path.join(base, d, MANIFEST))
        )
        hint = f"; converted folders in it: {', '.join(inside[:5])}" if inside else ""
        raise SourceNotFound(
            f"{base}: holds no shards (no {MANIFEST} and no {', '.join(suffixes)} files in it){hint}; give the "
            f"files or a pattern, or write the folder with 'fastdata convert SRC {base}'",
            base,
        )
    return found


def missing_local(spec: str) -> SourceNotFound | None:
    """The error for a local ``spec`` (a path, a glob or a brace pattern) that names nothing on disk, or
    None when something it names exists (or it is a URL): "no such file or folder", with the names
    nearest to it in its folder (a typo: ``shards/trian`` -> ``shards/train``)."""
    import difflib

    if scheme(spec):
        return None
    if "{" in spec or glob.has_magic(spec):
        try:
            names = expand_urls(spec)
        except SourceNotFound as e:
            return e
        if any(Path(n).exists() for n in names):
            return None
        return SourceNotFound(
            f"{spec}: no such file or folder (none of the {len(names)} paths the pattern names exists, the first "
            f"is {names[0]}); check the folder and the range",
            spec,
        )
    if Path(spec).exists():
        return None
    folder, name = os.path.split(os.path.normpath(spec))
    try:
        near = difflib.get_close_matches(name, os.listdir(folder or "."), n=3, cutoff=0.6)
    except OSError:
        near = []
    hint = f"; did you mean {' or '.join(os.path.join(folder, n) for n in near)}?" if near else ""
    return SourceNotFound(f"{spec}: no such file or folder{hint}", spec)


def resolve_sources(
    spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    kind: Kind,
    opener: Callable[[str], Reader] = open_reader,
) -> list[str]:
    """A dataset's files: each folder of ``spec`` (see :func:`is_folder`) as the files it holds
    (:func:`folder_sources`), everything else expanded as brace ranges and globs
    (:func:`fastdata.storage.expand_urls`).

    Raises:
        SourceNotFound: a pattern that matches nothing, a folder that holds no shards.
        ConfigError: a folder of the other kind.
    """
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    out: list[str] = []
    for item in items:
        url = os.fspath(item)
        if "{" not in url and not (not scheme(url) and glob.has_magic(url)) and is_folder(url):
            out.extend(folder_sources(url, kind, opener))
        else:
            out.extend(expand_urls(url))
    if not out:
        raise SourceNotFound(f"{spec!r}: no files given")
    return out
