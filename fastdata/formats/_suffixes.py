"""File suffixes that name a kind of file, in a module with no imports: a command that only needs to
recognise a video by its name (``fastdata convert``'s summary) must not load the video stack (numpy, the
decoders' interface) to do it."""

from __future__ import annotations

VIDEO_EXTENSIONS = frozenset(
    {".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".ts", ".flv", ".wmv", ".3gp"}
)
"""File suffixes taken for videos when a folder is searched (by the dataset and by ``fastdata inspect``)."""

__all__ = ["VIDEO_EXTENSIONS"]
