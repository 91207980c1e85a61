"""Local files: read through a read-only memory map, so that reading a member is a slice of pages
already in the page cache (no fresh buffer per read).

A mapped file that shrinks under the reader (``cp new.tar shard.tar`` over a shard in use, ``rsync
--inplace``, a writer on a full disk) turns a read of its lost pages into SIGBUS, which kills the process
with no traceback. So before each read the reader asks the kernel whether the file is still the size it
mapped (``mmap.size()``: an ``fstat`` of the descriptor the map holds anyway) and, when its path still
names the same file, the version (a ``stat`` of the path: size and mtime), and raises
:class:`~fastdata.core.errors.SourceChanged` naming it when not (a microsecond or two per read call, a
few hundred calls per epoch): a truncation is caught before its pages are touched, and a file rewritten in
place is never read as the one that was mapped. A file renamed over (``mv``) leaves the reader the one it
opened, intact. Only a truncation landing during the copy of one read itself is not caught.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Sequence

from fastdata.core.errors import SourceChanged, SourceNotFound, SourceUnreadable


def identity(st: os.stat_result) -> tuple[int, int, int]:
    """What a file is (size, mtime in ns, inode), to notice later that its path names another one."""
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def file_identity(path: str) -> tuple[int, int, int] | None:
    """:func:`identity` of the file at ``path`` now, or None when there is none."""
    try:
        return identity(os.stat(path))
    except OSError:
        return None


class LocalReader:
    """Random-access reads of one local file.

    Args:
        path (str): the file.
        sequential (bool): hint the kernel that reads go forward (more read-ahead). Defaults to False.
    """

    def __init__(self, path: str, *, sequential: bool = False) -> None:
        self.url = path
        try:
            # O_NONBLOCK: opening a FIFO by mistake must not block; it is refused below like a folder
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise SourceNotFound(f"{path}: no such file; check the path (and the brace range, if any)", path) from None
        except PermissionError:
            raise SourceUnreadable(f"{path}: permission denied; check the file's mode and owner", path) from None
        except OSError as e:
            raise SourceUnreadable(f"{path}: cannot be opened ({e.strerror})", path) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
                raise SourceUnreadable(f"{path}: is {kind}, not a file fastdata can read", path)
            self.size = st.st_size
            self.identity = identity(st)
            # mmap cannot map an empty file; an empty file simply has nothing to read
            self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ) if self.size else None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the map keeps its own descriptor of the file
        if self._map is not None and sequential:
            self._map.madvise(mmap.MADV_SEQUENTIAL)

    def _check(self) -> mmap.mmap:
        """The map, once the file is known to be the one mapped (see the module doc)."""
        m = self._map
        if m is None:
            raise ValueError(f"{self.url}: read after close")
        now = m.size()  # the mapped file's size now, whatever its path names
        if now == self.size:
            try:
                st = os.stat(self.url)
            except OSError:  # removed: the mapped file lives on until unmapped
                return m
            if st.st_ino != self.identity[2] or (st.st_size, st.st_mtime_ns) == self.identity[:2]:
                return m  # renamed over (the mapped file is intact), or unchanged
            now = st.st_size
        what = "shrank" if now < self.size else "was rewritten"
        raise SourceChanged(
            f"{self.url}: the file {what} while it was being read ({self.size} bytes when opened, "
            f"{now} now): something writes over it in place (cp over it, rsync --inplace, a "
            "writer on a full disk). Replace a file that is in use by writing the new one beside it and "
            "renaming it over the old (mv, rsync without --inplace): readers keep the file they opened",
            self.url,
        )

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer at the end of the file)."""
        if self.size == 0 and self._map is None:
            return b""
        return self._check()[offset : offset + length]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)`` range, in order."""
        if self.size == 0 and self._map is None:
            return [b"" for _ in ranges]
        m = self._check()
        return [m[o : o + n] for o, n in ranges]

    def read_views(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview | bytes]:
        """Like :meth:`read_ranges`, but each range a read-only view of the mapped file (no copy, no
        allocation): for a caller that copies the bytes on at once (a batch written into a worker's slot
        reads each byte once instead of twice). A view keeps the mapping alive after :meth:`close`."""
        if self.size == 0 and self._map is None:
            return [b"" for _ in ranges]
        whole = memoryview(self._check())
        try:
            return [whole[o : o + n] for o, n in ranges]
        finally:
            whole.release()  # the slices keep the mapping; close() can unmap once they are gone

    def buffer(self) -> memoryview | bytes:
        """The whole file as a buffer (no copy), for parsers that scan it."""
        return memoryview(self._check()) if self._map is not None else b""

    def close(self) -> None:
        """Unmap the file. Idempotent."""
        m, self._map = self._map, None
        if m is not None:
            try:
                m.close()
            except BufferError:
                # a memoryview from buffer() is still alive; the map goes when it does
                pass

    def __enter__(self) -> LocalReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalReader({self.url!r})"
