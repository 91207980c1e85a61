"""The video index: what a probe found about each video, cached in a small JSON file.

Building a clip index needs every video's frame count and frame rate, which means opening every
video once. The results are kept in an index file (in the user's cache folder by default, or wherever
``index_cache`` points, e.g. beside the videos), keyed by path and checked against each file's size and
modification time, so a second start opens only the videos that are new or changed. Layout::

    {"version": 3, "decoder": "pyav",
     "videos": {"/data/a.mp4": {"size": 123456, "mtime_ns": 1700000000000000000,
                                "meta": {"frames": 300, "fps": 30.0, "height": 224, "width": 224,
                                         "extra": {...}},
                                "check": "5f0c..."},
                "/data/b.mp4": {"size": 0, "mtime_ns": ..., "error": "... cannot open it as a video ...",
                                "check": "..."}}}

Deterministic failures (a file that is not a video) are cached like results; a missing file or a
probe that timed out is not (the next start tries again).

Each entry carries ``check``, a SHA-256 (first 16 hex digits) of the entry's path, size, time and result:
an entry damaged on disk (a flipped bit, a hand edit, a file cut and patched) used to be trusted as soon
as size and time matched, giving a bare ``KeyError``, clips whose pixels are other frames than their
numbers, or a sound video called damaged. An entry that does not check, or does not parse, is probed
again (warned once per index file), and the index rewritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastdata.core import default_cache_dir, tracked
from fastdata.core.errors import BadSample, SourceNotFound, SourceUnreadable
from fastdata.formats.video._base import DecodeTimeout, VideoMeta, VideoUnreadable

VERSION = 3  # 2: the stream info (fastdata.formats.video._stream) in every decoder's meta; 3: "check"
Outcome = VideoMeta | BadSample | SourceNotFound | SourceUnreadable


def entry_check(key: str, record: dict[str, Any]) -> str:
    """The ``check`` of an index entry: a digest of its path, size, time and result."""
    body = {k: record[k] for k in ("size", "mtime_ns", "meta", "error") if k in record}
    text = json.dumps([key, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _trusted(key: str, entry: Any, st: Any, path: str) -> Outcome | None:
    """The outcome an index entry records for the file as it is now, or None when the entry is stale
    (another size or time), damaged (it does not check) or does not parse: probe the file again."""
    if not isinstance(entry, dict) or entry.get("size") != st.st_size or entry.get("mtime_ns") != st.st_mtime_ns:
        return None
    if entry.get("check") != entry_check(key, entry):
        raise _Damaged
    try:
        if "error" in entry:
            return VideoUnreadable(str(entry["error"]), path)
        meta = VideoMeta.from_json(entry["meta"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise _Damaged from None
    if meta.frames <= 0 or meta.height <= 0 or meta.width <= 0:
        raise _Damaged
    return meta


class _Damaged(Exception):
    """An index entry that does not check (see :func:`_trusted`)."""


def _key(path: str) -> str:
    """An index entry's key: the absolute path of a local file, the URL of a remote one."""
    return path if "://" in path else os.path.abspath(path)


def default_index_file(paths: list[str], decoder: str) -> Path:
    """The index file for this list of videos and decoder, in :func:`default_cache_dir`."""
    digest = hashlib.sha1("\n".join([decoder, *map(_key, paths)]).encode()).hexdigest()[:16]
    return default_cache_dir() / "video-index" / f"{digest}.json"


class VideoIndex:
    """Probe results for a list of videos, read from and written back to an index file.

    Args:
        file (Path | None): the index file; None keeps nothing between runs.
        decoder (str): the decoder that probes (results of one decoder are not reused by another).
    """

    def __init__(self, file: Path | None, decoder: str) -> None:
        self.file = file
        self.decoder = decoder
        self.probed = 0  # videos opened by the last build(), for tests and progress reports
        self._entries: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.file is None or not self.file.exists():
            return {}
        try:
            data = json.loads(self.file.read_text())
            if data.get("version") != VERSION or data.get("decoder") != self.decoder:
                return {}
            videos = data["videos"]
            if not isinstance(videos, dict):
                raise TypeError("'videos' is not a mapping")
            return dict(videos)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"{self.file}: unreadable video index ({e}); probing the videos again", stacklevel=3)
            return {}

    def build(
        self, paths: list[str], probe: Callable[[str], VideoMeta], stat: Callable[[str], Any] = os.stat
    ) -> dict[str, Outcome]:
        """Each path's :class:`VideoMeta`, or the error that says why it cannot be read; probes only
        the videos the index file does not know in their current state, and saves the file.

        Args:
            stat (Callable[[str], Any]): a video's state: ``st_size`` and ``st_mtime_ns`` (``os.stat``'s; for
                a remote video, its size and a number that changes with its version). Defaults to os.stat.
        """
        out: dict[str, Outcome] = {}
        todo: list[tuple[str, Any]] = []
        damaged = 0
        for path in paths:
            try:
                st = stat(path)
            except FileNotFoundError:
                out[path] = SourceNotFound(f"{path}: no such video file; check the path")
                continue
            except PermissionError:
                out[path] = SourceUnreadable(f"{path}: permission denied")
                continue
            key = _key(path)
            try:
                known = _trusted(key, self._entries.get(key), st, path)
            except _Damaged:
                damaged += 1
                known = None
            if known is not None:
                out[path] = known
            else:
                todo.append((path, st))
        if damaged:
            warnings.warn(
                f"{self.file}: {damaged} entr{'y' if damaged == 1 else 'ies'} of the video index did not check "
                "(damaged on disk?); probing those videos again",
                stacklevel=2,
            )
        self.probed = len(todo)
        for path, st in tracked(todo, "fastdata: indexing videos", unit="videos", enabled=len(todo) >= 50):
            record: dict[str, Any] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
            try:
                meta = probe(path)
                out[path] = meta
                record["meta"] = meta.to_json()
            except (DecodeTimeout, SourceNotFound, SourceUnreadable) as e:
                out[path] = e  # may work next time: not recorded
                continue
            except BadSample as e:
                out[path] = e
                record["error"] = str(e)
            key = _key(path)
            record["check"] = entry_check(key, record)
            self._entries[key] = record
        if todo:
            self._save()
        return out

    def _save(self) -> None:
        if self.file is None:
            return
        data = {"version": VERSION, "decoder": self.decoder, "videos": self._entries}
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".video-index-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, separators=(",", ":"))
            os.replace(tmp, self.file)  # atomic: a concurrent reader sees the old or the new file
        except OSError as e:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
            warnings.warn(
                f"{self.file}: cannot write the video index ({e}); the next start will probe "
                "the videos again (pass index_cache=PATH to put it somewhere writable)",
                stacklevel=3,
            )
