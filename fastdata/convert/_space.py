"""Disk space: checked against the planned output before a conversion writes anything, and a full disk
met while writing turned into one clear error (HDF5 itself can crash on a full disk, so an HDF5
part is also checked before each batch it writes).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from fastdata.core.errors import FastdataError

MARGIN = 16 << 20
"""Bytes kept free beyond the planned need (state files, the manifest, filesystem slack)."""

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFull(FastdataError, OSError):
    """The output's filesystem has no room for what the conversion still has to write."""

    def __str__(self) -> str:
        return str(self.strerror) if self.strerror else super().__str__()


def free_bytes(folder: str) -> int:
    """Bytes free for us on the filesystem holding ``folder`` (or its nearest existing parent)."""
    path = os.path.abspath(folder)
    while not Path(path).exists():
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return shutil.disk_usage(path).free


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def check_space(folder: str, need: int, *, what: str = "the conversion") -> None:
    """Raise :class:`DiskFull` unless ``need`` bytes (plus :data:`MARGIN`) are free under ``folder``."""
    free = free_bytes(folder)
    if need + MARGIN > free:
        raise DiskFull(
            errno.ENOSPC,
            f"{folder}: {what} needs about {_mb(need)} more, but only {_mb(free)} are free there; free "
            f"at least {_mb(need + MARGIN - free)} or convert somewhere else (nothing was written "
            "for it; a rerun of the same command resumes)",
        )


def is_full(error: BaseException) -> bool:
    """Whether ``error`` is a full disk (or quota)."""
    return isinstance(error, OSError) and error.errno in FULL


@contextlib.contextmanager
def full_disk_is_an_error(folder: str, need: int = 0) -> Iterator[None]:
    """Turn a full disk met inside the block (writing state, records, the manifest) into :class:`DiskFull`."""
    try:
        yield
    except OSError as e:
        if not is_full(e) or isinstance(e, DiskFull):
            raise
        raise disk_full(folder, e, need) from e


def disk_full(folder: str, error: OSError, need: int) -> DiskFull:
    """The :class:`DiskFull` to raise for ``error``, met while writing into ``folder``."""
    return DiskFull(
        errno.ENOSPC,
        f"{folder}: the disk filled up while writing ({error.strerror}); the unfinished shard was "
        f"removed. Free at least {_mb(need + MARGIN)} and rerun the same command: the finished "
        "shards are kept",
    )
