"""``fastdata inspect PATH``: the command, and the report as text."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fastdata.formats import MANIFEST


def register(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="what shards, HDF5 files, videos, a folder or an s3:// prefix hold; problems",
        description="Report samples, bytes, extensions and bad members of tar shards, the fields "
        "and attributes of HDF5 files, the codec and frames of videos (a file, a brace "
        "pattern like 'train-{000000..000009}.tar', a folder, or an s3://bucket/prefix: "
        "S3 through the standard AWS chain, e.g. AWS_ENDPOINT_URL), and check them "
        "against manifest.json. Exit status 1 when anything is bad.",
    )
    p.add_argument(
        "path", help="a file, a brace pattern or glob, a folder, an s3://bucket/prefix, or a cache_dir (what it holds)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--checksum",
        action="store_true",
        help="also compute each file's digest and compare it with the manifest's (reads every byte)",
    )
    p.add_argument(
        "--write-manifest",
        action="store_true",
        help="write manifest.json and .idx sidecar indexes beside the shards (for shards made by other tools)",
    )
    p.add_argument("--force", action="store_true", help="with --write-manifest: replace an existing manifest")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: every command's parser is built at start-up, and the inspectors
    # bring numpy and the video readers (~150 ms of `fastdata convert`'s start)
    from fastdata.inspection._cache import cache_folder, run_cache
    from fastdata.inspection._paths import inspect_paths, write_manifest

    cache = cache_folder(args.path)
    if cache is not None:  # a node-local cache folder (cache_dir=): what it holds
        return run_cache(cache, args.json)
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
            shape = "null dataspace" if f["shape"] is None else "x".join(map(str, f["shape"])) or "scalar"
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
    print(
        f"total: {t['files']} file(s), {t['samples']} samples, {_mb(t['bytes'])}, {exts}; "
        f"{t['bad']} bad, {t['incomplete']} incomplete"
        + (f", {t['split']} with keys split across the shard (see the notes)" if t.get("split") else ""),
        file=out,
    )
    for prefix, p in report.get("prefixes", {}).items():
        suffixes = " ".join(f"{e}:{n}" for e, n in p["suffixes"].items())
        print(
            f"prefix {prefix}: {p['objects']} object(s), {_mb(p['bytes'])}, {suffixes}; {p['inspected']} inspected",
            file=out,
        )
    for folder, m in report["manifests"].items():
        classes = m.get("classes") or []
        print(
            f"manifest {folder}/{MANIFEST}: {m.get('samples')} samples in {m['shards']} shard(s), "
            f"{len(classes)} classes, skipped {m.get('skipped', 0)}, by {m.get('created_by', '?')}",
            file=out,
        )
        for line in m["problems"]:
            print(f"  mismatch: {line}", file=out)
