"""Inspecting what a path names (a file, a pattern, a folder, an ``s3://`` prefix) and checking it
against the manifests beside the files; writing manifests for shards made by other tools."""

from __future__ import annotations

import json
import os
import posixpath
from collections import Counter
from dataclasses import asdict
from typing import Any

from fastdata.core import entry_digest, tracked
from fastdata.core.errors import ConfigError, SourceNotFound
from fastdata.formats import MANIFEST, missing_local, read_manifest
from fastdata.inspection._registry import INSPECTORS, inspector_for, is_known, worth_sniffing
from fastdata.inspection._report import FileReport, sha256_of
from fastdata.inspection._report import _sha256 as sha256_of_reader


def is_prefix(path: str) -> bool:
    """True for an ``s3://bucket/prefix`` (listed) rather than an object or a pattern of objects."""
    from fastdata.storage import scheme

    return scheme(path) == "s3" and not is_known(path) and "{" not in path


def find_files(path: str) -> list[str]:
    """The data files named by ``path``: one file, a brace pattern or glob, or a folder's files that an
    inspector reads (searched recursively, hidden entries left out, as video folders often have one
    folder per class), each told by its content (magic bytes) where its name does not say.

    Raises:
        SourceNotFound: ``path`` names nothing on disk ("no such file or folder", with the nearest names),
            or a folder that holds nothing to inspect.
        ConfigError: a file no inspector reads.
    """
    from fastdata.storage import expand_urls, scheme

    missing = missing_local(path)
    if missing is not None:
        raise missing
    if not scheme(path) and os.path.isdir(path):
        found = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                full = os.path.join(folder, name)
                if name.startswith("."):
                    continue
                if is_known(name) or (worth_sniffing(name) and inspector_for(full) is not None):
                    found.append(full)
        if not found:
            raise SourceNotFound(f"{path}: holds no shards, HDF5 files or videos (by name or by content)", path)
        return found
    urls = expand_urls(path)
    unknown = [u for u in urls if inspector_for(u) is None]
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: fastdata cannot inspect this kind of file: by its first bytes it is no tar shard, "
            f"HDF5 file or video, nor by its name ({', '.join(INSPECTORS)})"
        )
    return urls


def list_s3_prefix(url: str) -> tuple[dict[str, int], dict[str, Any]]:
    """Every object under an ``s3://`` prefix (one paginated listing, through the standard AWS chain:
    ``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` ...) and the prefix's summary: objects, bytes, suffixes."""
    from fastdata.storage.s3 import S3Config, Stats, list_prefix

    prefix = url if url.endswith("/") else url + "/"
    urls, sizes = list_prefix(prefix, S3Config(), Stats())
    objects = dict(zip(urls, sizes))
    suffixes = Counter(posixpath.splitext(u)[1] or "(none)" for u in urls)
    summary = {
        "objects": len(urls),
        "bytes": sum(sizes),
        "suffixes": dict(suffixes.most_common()),
        "inspected": sum(is_known(u) for u in urls),
    }
    return objects, summary


def inspect_paths(path: str, *, checksum: bool = False, progress: bool = False) -> dict[str, Any]:
    """Inspect every file named by ``path``; compare with the manifests beside them.

    ``path`` may be an ``s3://bucket/prefix``: every object under it is counted, and those fastdata can
    inspect (tar shards; HDF5 files and videos are listed but not opened, as their readers need local
    files) are inspected as local ones are.

    Returns:
        dict: ``{"files": [FileReport as dict, ...], "totals": {...}, "manifests": {folder: summary},
        "prefixes": {s3 prefix: {"objects", "bytes", "suffixes", "inspected"}}}``.
    """
    prefixes: dict[str, Any] = {}
    present: set[str] | None = None  # every object of an s3 prefix, to tell a missing shard from one not asked for
    if is_prefix(path):
        objects, prefixes[path] = list_s3_prefix(path)
        present = set(objects)
        urls = [u for u in objects if is_known(u)]
    else:
        urls = find_files(path)
    reports = []
    for url in tracked(urls, "fastdata inspect", unit="files", enabled=progress and len(urls) >= 20):
        inspector = inspector_for(url)
        assert inspector is not None  # find_files and the prefix listing keep only those
        reports.append(inspector(url, checksum))
    exts: Counter[str] = Counter()
    for r in reports:
        exts.update(r.extensions)
    totals = {
        "files": len(reports),
        "samples": sum(r.samples for r in reports),
        "bytes": sum(r.bytes for r in reports),
        "extensions": dict(sorted(exts.items())),
        "bad": sum(len(r.bad) for r in reports),
        "incomplete": sum(not r.complete for r in reports),
        "split": sum(bool(r.details.get("split_keys")) for r in reports),
    }
    folders = {posixpath.dirname(r.url) for r in reports}
    if is_prefix(path):
        folders.add(path.rstrip("/"))  # a prefix of shards listed in its manifest, all missing
    manifests = {}
    for folder in sorted(folders):
        manifest = read_manifest(folder)
        if manifest is not None:
            manifests[folder or "."] = manifest_summary(
                manifest, folder, [r for r in reports if posixpath.dirname(r.url) == folder], present
            )
    return {"files": [asdict(r) for r in reports], "totals": totals, "manifests": manifests, "prefixes": prefixes}


def manifest_summary(
    manifest: dict[str, Any], folder: str, reports: list[FileReport], present: set[str] | None = None
) -> dict[str, Any]:
    """The manifest's totals, and each way the files found disagree with it.

    Args:
        present: every object under an S3 ``folder``, when it was listed; a shard of an S3 manifest is
            reported missing only then (a local folder is checked file by file).
    """
    from fastdata.storage import scheme

    listed = {s["name"]: s for s in manifest.get("shards", [])}
    found = {posixpath.basename(r.url): r for r in reports}
    problems = []
    for name, entry in listed.items():
        r = found.get(name)
        if r is None:
            if scheme(folder):
                missing = present is not None and posixpath.join(folder, name) not in present
            else:
                missing = not os.path.isfile(os.path.join(folder, name))
            if missing:
                problems.append(f"{name}: listed in the manifest but missing")
            continue
        if r.samples != entry.get("samples"):
            problems.append(f"{name}: manifest says {entry.get('samples')} samples, the shard has {r.samples}")
        if r.bytes != entry.get("bytes"):
            problems.append(f"{name}: manifest says {entry.get('bytes')} bytes, the file has {r.bytes}")
        kind, want = entry_digest(entry) or ("sha256", "")
        if r.sha256 and want and want != (r.sha256 if kind == "sha256" else sha256_of(r.url, kind)):
            problems.append(f"{name}: {kind} differs from the manifest's (the file changed or is damaged)")
    problems += [f"{n}: not listed in the manifest" for n in sorted(set(found) - set(listed))]
    return {
        k: manifest.get(k)
        for k in ("format", "samples", "bytes", "classes", "class_counts", "skipped", "created_by")
        if k in manifest
    } | {"shards": len(listed), "problems": problems}


def write_manifest(path: str, *, force: bool = False) -> list[str]:
    """Write ``manifest.json`` and ``.idx`` sidecars for the tar shards named by ``path``, one manifest
    per folder. Returns the manifests written.

    The manifest counts samples as readers do, every member of one key in one sample wherever it lies;
    a shard whose keys are split across it (``tar cf`` of a folder) gets no sidecar: readers scan it.

    ``path`` may be local or on S3: an ``s3://bucket/prefix/`` (its ``.tar`` objects), a pattern of them, or
    one; there the sidecars and manifests are uploaded beside the shards (credentials and endpoint from the
    environment: ``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` ...).

    Raises:
        ConfigError: a folder already has a manifest (unless ``force``), or ``path`` names no tar shard.
    """
    from fastdata.formats.tar import index_url, scan
    from fastdata.storage import open_reader, scheme

    if is_prefix(path):
        urls = sorted(u for u in list_s3_prefix(path)[0] if u.endswith(".tar"))
        if not urls:
            raise ConfigError(f"{path}: no .tar object under this prefix; name the shards' prefix or a pattern")
    else:
        urls = [u for u in find_files(path) if u.endswith(".tar")]
    by_folder: dict[str, list[str]] = {}
    for u in urls:
        by_folder.setdefault(posixpath.dirname(u) if scheme(u) else os.path.dirname(u), []).append(u)
    written = []
    for folder, shard_urls in sorted(by_folder.items()):
        target = posixpath.join(folder, MANIFEST) if scheme(folder) else os.path.join(folder, MANIFEST)
        if _exists(target) and not force:
            raise ConfigError(f"{target}: exists already; delete it or pass --force to replace it")
        shards: list[dict[str, Any]] = []
        for url in shard_urls:
            reader = open_reader(url)
            try:
                index = scan(reader)
                if index.complete and not index.bad and not index.split:
                    # a damaged shard's index would not pass the readers' check of the sidecar: they scan it
                    _put(index_url(url), index.to_bytes())
                elif index.split and not scheme(url) and os.path.isfile(index_url(url)):
                    # a sidecar lists members in file order, which a key gathered from all over the shard
                    # breaks: readers scan such a shard (and group its keys); an older sidecar would split them
                    os.remove(index_url(url))
                shards.append(
                    {
                        "name": os.path.basename(url),
                        "samples": len(index),
                        "bytes": reader.size,
                        "sha256": sha256_of_reader(reader),
                    }
                )
            finally:
                reader.close()
        from fastdata.core import __version__

        manifest = {
            "format": "tar",
            "version": 1,
            "samples": sum(s["samples"] for s in shards),
            "bytes": sum(s["bytes"] for s in shards),
            "classes": [],
            "class_counts": {},
            "shards": shards,
            "created_by": f"fastdata {__version__} inspect --write-manifest",
        }
        _put(target, (json.dumps(manifest, indent=1) + "\n").encode())
        written.append(target)
    return written


def _exists(url: str) -> bool:
    from fastdata.storage import open_reader, scheme

    if not scheme(url):
        return os.path.isfile(url)
    try:
        open_reader(url).close()
    except SourceNotFound:
        return False
    return True


def _put(url: str, data: bytes) -> None:
    """Write ``data`` to ``url``: a local file replaced atomically, or an S3 object uploaded (and checked)."""
    import tempfile

    from fastdata.formats.tar import write_atomic
    from fastdata.storage import scheme

    if not scheme(url):
        write_atomic(url, data, fsync=False)
        return
    from fastdata.storage.s3 import upload_file

    with tempfile.TemporaryDirectory(prefix="fastdata-manifest-") as tmp:
        local = os.path.join(tmp, "object")
        with open(local, "wb") as f:
            f.write(data)
        upload_file(local, url)
