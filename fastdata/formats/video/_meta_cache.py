"""The video index: what a probe found about each video, cached in a small JSON file.

Building a clip index needs every video's frame count and frame rate, which means opening every
video once. The results are kept in an index file (in the user's cache folder by default, or wherever
``index_cache`` points, e.g. beside the videos), keyed by path and checked against each file's size and
modification time, so a second start opens only the videos that are new or changed. Layout::

    {"version": 2, "decoder": "pyav",
     "videos": {"/data/a.mp4": {"size": 123456, "mtime_ns": 1700000000000000000,
                                "meta": {"frames": 300, "fps": 30.0, "height": 224, "width": 224,
                                         "extra": {...}}},
                "/data/b.mp4": {"size": 0, "mtime_ns": ..., "error": "... cannot open it as a video ..."}}}

Deterministic failures (a file that is not a video) are cached like results; a missing file or a
probe that timed out is not (the next start tries again).
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

from tqdm import tqdm

from fastdata.core.errors import BadSample, SourceNotFound, SourceUnreadable
from fastdata.formats.video._base import DecodeTimeout, VideoMeta, VideoUnreadable

VERSION = 2  # 2: the stream info (fastdata.formats.video._stream) in every decoder's meta
Outcome = VideoMeta | BadSample | SourceNotFound | SourceUnreadable


def default_cache_dir() -> Path:
    """``$FASTDATA_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastdata``, else ``~/.cache/fastdata``."""
    if os.environ.get("FASTDATA_CACHE_DIR"):
        return Path(os.environ["FASTDATA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastdata"


def default_index_file(paths: list[str], decoder: str) -> Path:
    """The index file for this list of videos and decoder, in :func:`default_cache_dir`."""
    digest = hashlib.sha1("\n".join([decoder, *map(os.path.abspath, paths)]).encode()).hexdigest()[:16]
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
            return dict(data["videos"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"{self.file}: unreadable video index ({e}); probing the videos again", stacklevel=3)
            return {}

    def build(self, paths: list[str], probe: Callable[[str], VideoMeta]) -> dict[str, Outcome]:
        """Each path's :class:`VideoMeta`, or the error that says why it cannot be read; probes only
        the videos the index file does not know in their current state, and saves the file."""
        out: dict[str, Outcome] = {}
        todo: list[tuple[str, os.stat_result]] = []
        for path in paths:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                out[path] = SourceNotFound(f"{path}: no such video file; check the path")
                continue
            except PermissionError:
                out[path] = SourceUnreadable(f"{path}: permission denied")
                continue
            entry = self._entries.get(os.path.abspath(path))
            if entry and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
                out[path] = (
                    VideoUnreadable(entry["error"], path) if "error" in entry else VideoMeta.from_json(entry["meta"])
                )
            else:
                todo.append((path, st))
        self.probed = len(todo)
        for path, st in tqdm(todo, desc="fastdata: indexing videos", unit="video", disable=len(todo) < 50, leave=False):
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
            self._entries[os.path.abspath(path)] = record
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
