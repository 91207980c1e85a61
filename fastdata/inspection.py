"""``fastdata inspect PATH``: what a shard, a brace pattern of shards, a folder or an S3 prefix holds.

For each tar shard: samples, bytes, member extensions, bad members (named, with the reason), and
whether its sidecar index matches; for each HDF5 file: its fields (shapes, dtypes, lengths, chunking,
compression), attributes (classes) and problems such as fields of unequal lengths; for each video: its
codec, frame count, frame rate and size as the video index probes them, or why it cannot be read. For a
folder or prefix with a ``manifest.json``: the manifest's summary and where the files disagree with it;
for an ``s3://`` prefix also its object count and bytes. ``--write-manifest`` writes ``manifest.json``
and ``.idx`` sidecars for shards made by other tools (webdataset's ``ShardWriter``, ``tar``), so
fastdata plans epochs without scanning them.

One inspector per format, chosen by file suffix (:data:`INSPECTORS`, :func:`register_inspector`); the
HDF5 and video ones live in :mod:`fastdata.inspection_media`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import posixpath
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fastdata.errors import ConfigError, SourceNotFound
from fastdata.manifest import MANIFEST, read_manifest


@dataclass
class FileReport:
    """What one data file holds.

    Attributes:
        url (str): the file.
        format (str): ``"tar"``, ...
        samples (int): readable and bad samples, as a reader counts them.
        bytes (int): file size.
        extensions (dict[str, int]): members per extension.
        bad (list[str]): one line per bad member or damaged region, naming it and why.
        complete (bool): False when the file is truncated or damaged (samples after it are lost).
        notes (list[str]): other findings (a stale sidecar index ...).
        sha256 (str | None): the file's digest, when asked for.
        details (dict[str, Any]): format-specific facts (HDF5 fields and attributes, a video's codec ...).
    """

    url: str
    format: str
    samples: int = 0
    bytes: int = 0
    extensions: dict[str, int] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    complete: bool = True
    notes: list[str] = field(default_factory=list)
    sha256: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


Inspector = Callable[[str, bool], FileReport]  # (url, compute sha256) -> report
INSPECTORS: dict[str, Inspector] = {}


def register_inspector(suffix: str, inspector: Inspector) -> None:
    """Make :func:`inspect_paths` use ``inspector`` for files ending in ``suffix`` (like ``".h5"``)."""
    INSPECTORS[suffix] = inspector


def _sha256(reader: Any) -> str:
    h = hashlib.sha256()
    step = 8 << 20
    for at in range(0, reader.size, step):
        h.update(reader.read(at, step))
    return h.hexdigest()


def sha256_of(url: str) -> str:
    """The SHA-256 of a whole file or object, read through its storage reader."""
    from fastdata.storage import open_reader

    reader = open_reader(url)
    try:
        return _sha256(reader)
    finally:
        reader.close()


def inspect_tar(url: str, checksum: bool = False) -> FileReport:
    """Index a tar shard by scanning its headers (never extracting anything) and report on it."""
    from fastdata.formats.tar import ShardIndex, index_url, scan
    from fastdata.storage import open_reader

    reader = open_reader(url)
    try:
        index = scan(reader)
        report = FileReport(url, "tar", len(index), reader.size)
        report.extensions = dict(sorted(Counter(m[0] for ms in index.members for m in ms).items()))
        report.bad = [str(index.bad[i]) for i in sorted(index.bad)]
        report.complete = index.complete
        if index.tail_error is not None and str(index.tail_error) not in report.bad:
            report.bad.append(str(index.tail_error))
        try:
            side = open_reader(index_url(url))
        except (SourceNotFound, PermissionError):
            report.notes.append("no sidecar index (.idx): readers scan the shard when they open it")
        else:
            try:
                stored = ShardIndex.from_bytes(url, side.read(0, side.size))
                if stored.size != reader.size or stored.keys != index.keys or stored.members != index.members:
                    report.notes.append("sidecar index (.idx) does not match the shard: readers rescan it; "
                                        "rewrite it with 'fastdata inspect --write-manifest'")
            except Exception as e:  # noqa: BLE001 - any damage means the sidecar is not used
                report.notes.append(f"sidecar index (.idx) is unreadable ({type(e).__name__}); readers rescan")
            finally:
                side.close()
        if checksum:
            report.sha256 = _sha256(reader)
    finally:
        reader.close()
    return report


register_inspector(".tar", inspect_tar)


def _known(name: str) -> bool:
    return any(name.lower().endswith(s) for s in INSPECTORS)


def is_prefix(path: str) -> bool:
    """True for an ``s3://bucket/prefix`` (listed) rather than an object or a pattern of objects."""
    from fastdata.storage import scheme

    return scheme(path) == "s3" and not _known(path) and "{" not in path


def find_files(path: str) -> list[str]:
    """The data files named by ``path``: one file, a brace pattern or glob, or a folder's known files
    (searched recursively, hidden entries left out, as video folders often have one folder per class)."""
    from fastdata.storage import expand_urls, scheme

    if not scheme(path) and os.path.isdir(path):
        found = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(folder, e) for e in sorted(names) if not e.startswith(".") and _known(e)]
        if not found:
            raise SourceNotFound(f"{path}: holds no file fastdata can inspect (suffixes: {', '.join(INSPECTORS)})")
        return found
    urls = expand_urls(path)
    unknown = [u for u in urls if not _known(u)]
    if unknown:
        raise ConfigError(f"{unknown[0]}: fastdata cannot inspect this kind of file "
                          f"(suffixes: {', '.join(INSPECTORS)})")
    return urls


def list_s3_prefix(url: str) -> tuple[dict[str, int], dict[str, Any]]:
    """Every object under an ``s3://`` prefix (one paginated listing, through the standard AWS chain:
    ``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` ...) and the prefix's summary: objects, bytes, suffixes."""
    from fastdata.storage.s3_client import S3Config, Stats
    from fastdata.storage.s3_list import list_prefix

    prefix = url if url.endswith("/") else url + "/"
    urls, sizes = list_prefix(prefix, S3Config(), Stats())
    objects = dict(zip(urls, sizes))
    suffixes = Counter(posixpath.splitext(u)[1] or "(none)" for u in urls)
    summary = {"objects": len(urls), "bytes": sum(sizes), "suffixes": dict(suffixes.most_common()),
               "inspected": sum(_known(u) for u in urls)}
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
    from tqdm import tqdm

    prefixes: dict[str, Any] = {}
    present: set[str] | None = None  # every object of an s3 prefix, to tell a missing shard from one not asked for
    if is_prefix(path):
        objects, prefixes[path] = list_s3_prefix(path)
        present = set(objects)
        urls = [u for u in objects if _known(u)]
    else:
        urls = find_files(path)
    reports = []
    for url in tqdm(urls, desc="fastdata inspect", unit="file", disable=not progress or len(urls) < 20, leave=False):
        suffix = next(s for s in INSPECTORS if url.lower().endswith(s))
        reports.append(INSPECTORS[suffix](url, checksum))
    exts: Counter[str] = Counter()
    for r in reports:
        exts.update(r.extensions)
    totals = {"files": len(reports), "samples": sum(r.samples for r in reports),
              "bytes": sum(r.bytes for r in reports), "extensions": dict(sorted(exts.items())),
              "bad": sum(len(r.bad) for r in reports), "incomplete": sum(not r.complete for r in reports)}
    folders = {posixpath.dirname(r.url) for r in reports}
    if is_prefix(path):
        folders.add(path.rstrip("/"))  # a prefix of shards listed in its manifest, all missing
    manifests = {}
    for folder in sorted(folders):
        manifest = read_manifest(folder)
        if manifest is not None:
            manifests[folder or "."] = manifest_summary(
                manifest, folder, [r for r in reports if posixpath.dirname(r.url) == folder], present)
    return {"files": [asdict(r) for r in reports], "totals": totals, "manifests": manifests, "prefixes": prefixes}


def manifest_summary(manifest: dict[str, Any], folder: str, reports: list[FileReport],
                     present: set[str] | None = None) -> dict[str, Any]:
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
        if r.sha256 and entry.get("sha256") and r.sha256 != entry["sha256"]:
            problems.append(f"{name}: sha256 differs from the manifest's (the file changed or is damaged)")
    problems += [f"{n}: not listed in the manifest" for n in sorted(set(found) - set(listed))]
    return {k: manifest.get(k) for k in ("format", "samples", "bytes", "classes", "class_counts", "skipped",
                                         "created_by") if k in manifest} | \
        {"shards": len(listed), "problems": problems}


def write_manifest(path: str, *, force: bool = False) -> list[str]:
    """Write ``manifest.json`` and ``.idx`` sidecars for the tar shards named by ``path``, one manifest
    per folder. Returns the manifests written.

    Raises:
        ConfigError: a folder already has a manifest (unless ``force``), or the shards are not local.
    """
    from fastdata.formats.tar import index_url, scan
    from fastdata.formats.tar_writer import write_atomic
    from fastdata.storage import open_reader, scheme

    urls = [u for u in find_files(path) if u.endswith(".tar")]
    if any(scheme(u) for u in urls):
        raise ConfigError("--write-manifest writes local folders only")
    by_folder: dict[str, list[str]] = {}
    for u in urls:
        by_folder.setdefault(os.path.dirname(u), []).append(u)
    written = []
    for folder, shard_urls in sorted(by_folder.items()):
        target = os.path.join(folder, MANIFEST)
        if os.path.isfile(target) and not force:
            raise ConfigError(f"{target}: exists already; delete it or pass --force to replace it")
        shards: list[dict[str, Any]] = []
        for url in shard_urls:
            reader = open_reader(url)
            try:
                index = scan(reader)
                write_atomic(index_url(url), index.to_bytes(), fsync=False)
                shards.append({"name": os.path.basename(url), "samples": len(index), "bytes": reader.size,
                               "sha256": _sha256(reader)})
            finally:
                reader.close()
        from fastdata import __version__

        manifest = {"format": "tar", "version": 1, "samples": sum(s["samples"] for s in shards),
                    "bytes": sum(s["bytes"] for s in shards), "classes": [], "class_counts": {},
                    "shards": shards, "created_by": f"fastdata {__version__} inspect --write-manifest"}
        write_atomic(target, (json.dumps(manifest, indent=1) + "\n").encode(), fsync=False)
        written.append(target)
    return written


# -- the command ---------------------------------------------------------------------------------------
def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="what shards, HDF5 files, videos, a folder or an s3:// prefix hold; problems",
                       description="Report samples, bytes, extensions and bad members of tar shards, the fields "
                                   "and attributes of HDF5 files, the codec and frames of videos (a file, a brace "
                                   "pattern like 'train-{000000..000009}.tar', a folder, or an s3://bucket/prefix: "
                                   "S3 through the standard AWS chain, e.g. AWS_ENDPOINT_URL), and check them "
                                   "against manifest.json. Exit status 1 when anything is bad.")
    p.add_argument("path", help="a file, a brace pattern or glob, a folder, or an s3://bucket/prefix")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--checksum", action="store_true", help="also compute each file's sha256 and compare it "
                                                           "with the manifest (reads every byte)")
    p.add_argument("--write-manifest", action="store_true",
                   help="write manifest.json and .idx sidecar indexes beside the shards (for shards made "
                        "by other tools)")
    p.add_argument("--force", action="store_true", help="with --write-manifest: replace an existing manifest")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = inspect_paths(args.path, checksum=args.checksum, progress=not args.json)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    if args.write_manifest:
        for target in write_manifest(args.path, force=args.force):
            print(f"wrote {target} (and an .idx beside each shard)")
    problems = report["totals"]["bad"] + sum(len(m["problems"]) for m in report["manifests"].values())
    return 1 if problems else 0


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _print_details(r: dict[str, Any], out: Any) -> None:
    d = r.get("details") or {}
    if r["format"] == "hdf5":
        for name, f in d.get("fields", {}).items():
            shape = "x".join(map(str, f["shape"])) or "scalar"
            chunks = "x".join(map(str, f["chunks"])) if f["chunks"] else "contiguous"
            packed = f", {f['compression']}" if f["compression"] else ""
            print(f"  field {name}: {shape} {f['dtype']}, chunks {chunks}{packed}", file=out)
        for key, value in d.get("attrs", {}).items():
            print(f"  attr {key}: {_short(value)}", file=out)
    elif r["format"] == "video" and d:
        print(f"  video: {d['codec']}, {d['frames']} frames, {d['fps']} fps, {d['width']}x{d['height']}", file=out)


def print_report(report: dict[str, Any], out: Any = None) -> None:
    """The report as text, one line per file, then totals, prefix and manifest summaries."""
    out = out or sys.stdout
    for r in report["files"]:
        exts = " ".join(f"{e}:{n}" for e, n in r["extensions"].items())
        state = "" if r["complete"] else "  INCOMPLETE"
        unit = "frames" if r["format"] == "video" else "samples"
        print(f"{r['url']}  {r['samples']} {unit}  {_mb(r['bytes'])}  {exts}{state}", file=out)
        _print_details(r, out)
        for line in r["bad"]:
            print(f"  bad: {line}", file=out)
        for line in r["notes"]:
            print(f"  note: {line}", file=out)
    t = report["totals"]
    exts = " ".join(f"{e}:{n}" for e, n in t["extensions"].items())
    print(f"total: {t['files']} file(s), {t['samples']} samples, {_mb(t['bytes'])}, {exts}; "
          f"{t['bad']} bad, {t['incomplete']} incomplete", file=out)
    for prefix, p in report.get("prefixes", {}).items():
        suffixes = " ".join(f"{e}:{n}" for e, n in p["suffixes"].items())
        print(f"prefix {prefix}: {p['objects']} object(s), {_mb(p['bytes'])}, {suffixes}; "
              f"{p['inspected']} inspected", file=out)
    for folder, m in report["manifests"].items():
        classes = m.get("classes") or []
        print(f"manifest {folder}/{MANIFEST}: {m.get('samples')} samples in {m['shards']} shard(s), "
              f"{len(classes)} classes, skipped {m.get('skipped', 0)}, by {m.get('created_by', '?')}", file=out)
        for line in m["problems"]:
            print(f"  mismatch: {line}", file=out)


# registers the HDF5 and video inspectors (last: that module imports this one's names)
import fastdata.inspection_media  # noqa: E402, F401
