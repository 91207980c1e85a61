"""``fastdata inspect PATH``: what a shard, a brace pattern of shards or a folder holds.

For each file: samples, bytes, member extensions, bad members (named, with the reason), and whether
its sidecar index matches; for a folder with a ``manifest.json``: the manifest's summary and where the
files disagree with it. ``--write-manifest`` writes ``manifest.json`` and ``.idx`` sidecars for shards
made by other tools (webdataset's ``ShardWriter``, ``tar``), so fastdata plans epochs without
scanning them.

One inspector per format, chosen by file suffix (:data:`INSPECTORS`, :func:`register_inspector`), so
other backends (HDF5, video, S3 listings) add theirs without touching the rest.
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


def find_files(path: str) -> list[str]:
    """The data files named by ``path``: one file, a brace pattern or glob, or a folder's known files."""
    from fastdata.storage import expand_urls, scheme

    if not scheme(path) and os.path.isdir(path):
        found = sorted(os.path.join(path, e) for e in os.listdir(path)
                       if not e.startswith(".") and any(e.endswith(s) for s in INSPECTORS))
        if not found:
            raise SourceNotFound(f"{path}: holds no file fastdata can inspect (suffixes: {', '.join(INSPECTORS)})")
        return found
    urls = expand_urls(path)
    unknown = [u for u in urls if not any(u.endswith(s) for s in INSPECTORS)]
    if unknown:
        raise ConfigError(f"{unknown[0]}: fastdata cannot inspect this kind of file "
                          f"(suffixes: {', '.join(INSPECTORS)})")
    return urls


def inspect_paths(path: str, *, checksum: bool = False, progress: bool = False) -> dict[str, Any]:
    """Inspect every file named by ``path``; compare with the manifests beside them.

    Returns:
        dict: ``{"files": [FileReport as dict, ...], "totals": {...}, "manifests": {folder: summary}}``.
    """
    from tqdm import tqdm

    urls = find_files(path)
    reports = []
    for url in tqdm(urls, desc="fastdata inspect", unit="file", disable=not progress or len(urls) < 20, leave=False):
        suffix = next(s for s in INSPECTORS if url.endswith(s))
        reports.append(INSPECTORS[suffix](url, checksum))
    exts: Counter[str] = Counter()
    for r in reports:
        exts.update(r.extensions)
    totals = {"files": len(reports), "samples": sum(r.samples for r in reports),
              "bytes": sum(r.bytes for r in reports), "extensions": dict(sorted(exts.items())),
              "bad": sum(len(r.bad) for r in reports), "incomplete": sum(not r.complete for r in reports)}
    manifests = {}
    for folder in sorted({posixpath.dirname(r.url) for r in reports}):
        manifest = read_manifest(folder)
        if manifest is not None:
            manifests[folder or "."] = manifest_summary(manifest, folder,
                                                        [r for r in reports if posixpath.dirname(r.url) == folder])
    return {"files": [asdict(r) for r in reports], "totals": totals, "manifests": manifests}


def manifest_summary(manifest: dict[str, Any], folder: str, reports: list[FileReport]) -> dict[str, Any]:
    """The manifest's totals, and each way the files found disagree with it."""
    listed = {s["name"]: s for s in manifest.get("shards", [])}
    found = {posixpath.basename(r.url): r for r in reports}
    problems = []
    for name, entry in listed.items():
        r = found.get(name)
        if r is None:
            if not os.path.isfile(os.path.join(folder, name)):
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
    p = sub.add_parser("inspect", help="what a shard, a pattern of shards or a folder holds; bad members",
                       description="Report samples, bytes, extensions and bad members of tar shards (a file, a "
                                   "brace pattern like 'train-{000000..000009}.tar', or a folder), and check "
                                   "them against manifest.json.")
    p.add_argument("path", help="a shard, a brace pattern or glob of shards, or a folder")
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


def print_report(report: dict[str, Any], out: Any = None) -> None:
    """The report as text, one line per file, then totals and manifest summaries."""
    out = out or sys.stdout
    for r in report["files"]:
        exts = " ".join(f"{e}:{n}" for e, n in r["extensions"].items())
        state = "" if r["complete"] else "  INCOMPLETE"
        print(f"{r['url']}  {r['samples']} samples  {_mb(r['bytes'])}  {exts}{state}", file=out)
        for line in r["bad"]:
            print(f"  bad: {line}", file=out)
        for line in r["notes"]:
            print(f"  note: {line}", file=out)
    t = report["totals"]
    exts = " ".join(f"{e}:{n}" for e, n in t["extensions"].items())
    print(f"total: {t['files']} file(s), {t['samples']} samples, {_mb(t['bytes'])}, {exts}; "
          f"{t['bad']} bad, {t['incomplete']} incomplete", file=out)
    for folder, m in report["manifests"].items():
        classes = m.get("classes") or []
        print(f"manifest {folder}/{MANIFEST}: {m.get('samples')} samples in {m['shards']} shard(s), "
              f"{len(classes)} classes, skipped {m.get('skipped', 0)}, by {m.get('created_by', '?')}", file=out)
        for line in m["problems"]:
            print(f"  mismatch: {line}", file=out)
