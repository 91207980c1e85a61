"""An output file written from a reused buffer, with its running SHA-256.

:class:`~fastdata.formats.tar._writer.TarShardWriter` fills a buffer and hands it over here; it is
hashed and written at once, in the caller's thread. An earlier version hashed and wrote on a
background thread, three buffers rotating, so that reading the next files overlapped hashing: measured
here (``benchmarks/bench_convert.py``, 10,000 ~35 KB files, CPU time of the writing process) that cost
0.88 s of CPU against 0.62 s inline, and was slower in wall time too (1.05 s against 0.68 s, one
writer; 2 writers on 2 cores leave no core for a third thread anyway): the reading thread gives the
GIL up and takes it back around every ``open``/``readv``/``close``, and with a second thread wanting
it each of those became a handoff between threads. ``hashlib`` at ~1.2-1.5 GB/s per core (SHA-NI)
is as fast as the copy into the page cache, so hashing the 4 MiB buffer right after it was filled,
while it is still in cache, is the cheapest place for it.

Buffers come from a per-process pool: fresh memory fills ~10x slower than reused memory on these machines.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from fastdata.core._bufferpool import BufferPool

_POOL = BufferPool(keep=2)


class HashedOutput:
    """The file ``fd`` written in order from a buffer of ``buffer_size`` bytes, and its running SHA-256.

    Attributes:
        fd (int): the file.
        flushed (int): bytes written so far.
        hash: the SHA-256 of those bytes.
    """

    def __init__(self, fd: int, buffer_size: int) -> None:
        self.fd = fd
        self.size = buffer_size
        self.flushed = 0
        self.hash = hashlib.sha256()
        self._buffer: memoryview | None = None

    def buffer(self) -> memoryview:
        """The buffer to fill (contents left from earlier use)."""
        if self._buffer is None:
            self._buffer = memoryview(_POOL.empty((self.size,), np.uint8)).cast("B")  # type: ignore[arg-type]
        return self._buffer

    def hand_off(self, buf: memoryview, n: int) -> memoryview:
        """Hash and write the first ``n`` bytes of ``buf``; return the buffer to fill next.

        Raises:
            OSError: the write failed (a full disk ...); nothing of ``buf`` counts as flushed then.
        """
        view = buf[:n]
        _write_all(self.fd, view)
        self.hash.update(view)
        self.flushed += n
        return buf

    def write_through(self, view: memoryview) -> None:
        """Hash and write ``view`` now (data bigger than a buffer)."""
        _write_all(self.fd, view)
        self.hash.update(view)
        self.flushed += len(view)

    def drain(self) -> None:
        """Nothing is in flight: every hand-off has been written when it returns (kept for the writer's
        undo, which drains before it truncates)."""

    def truncate(self, flushed: int, digest: Any) -> None:
        """Go back to ``flushed`` bytes, whose SHA-256 state is ``digest`` (a ``hash.copy()`` taken then)."""
        os.ftruncate(self.fd, flushed)
        os.lseek(self.fd, flushed, os.SEEK_SET)
        self.flushed, self.hash = flushed, digest

    def close(self) -> None:
        """Let go of the buffer (the file itself is the caller's to close)."""
        self._buffer = None


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]
