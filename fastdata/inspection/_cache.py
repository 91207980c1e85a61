"""``fastdata inspect CACHE_DIR``: what a node-local cache holds (see :mod:`fastdata.storage.cache`): each
entry's URL, size, version and when it was last opened, whether a reader on the node has it open, and
the downloads under way or left by a killed process."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fastdata.storage.cache import SUBFOLDER, Layout, is_cache, lock, release


def cache_folder(path: str) -> str | None:
    """The cache folder ``path`` names: itself, or its ``remote/`` (a ``$FASTDATA_CACHE_DIR``); None when
    it is not one."""
    if "://" in path or not os.path.isdir(path):
        return None
    for folder in (path, os.path.join(path, SUBFOLDER)):
        if is_cache(folder):
            return folder
    return None


def _held(layout: Layout, name: str) -> bool:
    """Whether a process holds the entry (a reader has it open, or it is being downloaded): its lock
    cannot be taken exclusively without waiting. Taken and let go at once when it can."""
    if not Path(layout.path(name, ".lock")).exists():
        return False
    fd = lock(layout.path(name, ".lock"), shared=False, blocking=False)
    if fd is None:
        return True
    release(fd)
    return False


def inspect_cache(folder: str) -> dict[str, Any]:
    """The report of the cache in ``folder``: entries (least recently used first) and totals."""
    layout = Layout(folder)
    entries = []
    for e in sorted(layout.listing(), key=lambda e: e.last_used):
        held = _held(layout, e.name)
        if e.record is not None:
            state = "open" if held else "complete"
        elif e.size:
            state = "downloading" if held else "left by a killed download (deleted by the next download or eviction)"
        else:
            continue  # a lock file alone: nothing held
        entries.append(
            {
                "name": e.name,
                "url": e.record.url if e.record else None,
                "bytes": e.size,
                "etag": e.record.etag if e.record else None,
                "sha256": (e.record.sha256 or None) if e.record else None,
                "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used / 1e9))
                if e.last_used
                else None,
                "state": state,
            }
        )
    complete = [e for e in entries if e["url"] is not None]
    return {
        "cache": folder,
        "entries": entries,
        "totals": {
            "entries": len(complete),
            "bytes": sum(e["bytes"] for e in entries),
            "open": sum(e["state"] == "open" for e in entries),
            "downloads": len(entries) - len(complete),
            "accounted": layout.read_usage(),
        },
    }


def print_cache(report: dict[str, Any], out: Any = None) -> None:
    out = out or sys.stdout
    for e in report["entries"]:
        what = e["url"] or f"({e['name']})"
        print(f"{what}  {e['bytes'] / 1e6:,.1f} MB  {e['state']}  last used {e['last_used']}", file=out)
    t = report["totals"]
    print(
        f"cache {report['cache']}: {t['entries']} object(s), {t['bytes'] / 1e6:,.1f} MB on disk, {t['open']} open by a "
        f"reader, {t['downloads']} download(s) under way or left by a killed one",
        file=out,
    )


def run_cache(folder: str, as_json: bool) -> int:
    """Print the cache's report (``--json``: as JSON); exit status 0."""
    report = inspect_cache(folder)
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print_cache(report)
    return 0


__all__ = ["cache_folder", "inspect_cache", "print_cache", "run_cache"]
