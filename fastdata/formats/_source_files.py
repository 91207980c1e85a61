"""Reading a corpus's files for a writer, and writing small files atomically: every error names the
file and the fix (:class:`~fastdata.core.errors.SourceNotFound`, :class:`~fastdata.core.errors.SourceUnreadable`).
"""

from __future__ import annotations

import contextlib
import os

from fastdata.core.errors import FastdataError, SourceNotFound, SourceUnreadable

_OPEN = os.O_RDONLY | os.O_CLOEXEC


def open_source(path: str) -> int:
    """``os.open`` for reading, its errors naming the file and the fix."""
    try:
        return os.open(path, _OPEN)
    except OSError as e:
        raise open_error(path, e) from None


def open_error(path: str, e: OSError) -> FastdataError:
    if isinstance(e, FileNotFoundError):
        return SourceNotFound(f"{path}: no such file (removed since the corpus was listed?)")
    return SourceUnreadable(f"{path}: cannot be read ({e.strerror}); check its mode, or skip it with --skip-bad")


def read_error(path: str, e: OSError) -> FastdataError:
    return SourceUnreadable(f"{path}: cannot be read ({e.strerror}); skip it with --skip-bad")


def readv(fd: int, view: memoryview, path: str) -> int:
    try:
        return os.readv(fd, [view])
    except OSError as e:
        raise read_error(path, e) from None


def read_planned_rest(fd: int, view: memoryview, got: int, size: int, path: str) -> None:
    """After a short or long first read of a planned file: read on to ``size``, or raise that it changed."""
    if got > size:
        raise changed(path, size, got, True)
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise changed(path, size, got, True)
        got += n
    if os.read(fd, 1):
        raise changed(path, size, size + 1, True)


def changed(path: str, size: int, found: int, planned: bool) -> SourceUnreadable:
    if not planned:
        return SourceUnreadable(
            f"{path}: shrank by {size - found} bytes while being read (is something writing it?); "
            "rerun when the corpus is stable"
        )
    how = f"holds only {found}" if found < size else "holds more"
    return SourceUnreadable(
        f"{path}: changed since the corpus was listed ({size} bytes then, {how} now); rerun once the "
        "corpus is stable (with --restart), or skip it with --skip-bad"
    )


def write_atomic(path: str, data: bytes, *, fsync: bool) -> None:
    """Write ``data`` to ``path`` under a temporary name, then rename it into place (on an error, a full
    disk included, the temporary file is removed and the old file, if any, is left as it was)."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


__all__ = ["changed", "open_error", "open_source", "read_error", "read_planned_rest", "readv", "write_atomic"]
