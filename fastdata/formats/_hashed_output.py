"""An output file fed from reused buffers, with its running digest (:func:`fastdata.core.new_digest`):
hashed and written at once, or by a background thread while the caller fills the next buffer.

:class:`~fastdata.formats.tar.TarShardWriter` fills a buffer and hands it over here. Which way
pays depends on whether a core is free for the thread (``hashlib`` and ``os.write`` release the GIL):

* ``background=True``: one thread hashes then writes each buffer while the caller reads the next files;
  three buffers rotate (one being filled, one being hashed and written, one ready). With a core to spare
  (one writer on a 2-core machine) hashing overlaps reading: the wall time of a shard tends to the
  larger of the two threads' CPU instead of their sum.
* ``background=False``: the caller hashes and writes each buffer right after filling it, while it is
  still in cache. With every core busy (``--workers`` >= cores) the thread can only cost: the reading
  thread gives up and retakes the GIL around every ``open``/``readv``/``close``, and with a second thread
  wanting it each of those became a handoff (measured here: 0.88 s of CPU for 10,000 ~35 KB files with
  the thread against 0.62 s inline, one process).

Buffers come from a per-process pool: fresh memory fills ~10x slower than reused memory on these machines.
"""

from __future__ import annotations

import collections
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from fastdata.core import DigestName, new_digest
from fastdata.core.process import BufferPool

BUFFERS = 3  # with the thread: one being filled, one being hashed and written, one ready
_POOL = BufferPool(keep=2 * BUFFERS)


class HashedOutput:
    """The file ``fd`` written in order from buffers of ``buffer_size`` bytes, and its running digest.

    Args:
        fd (int): the file.
        buffer_size (int): bytes per buffer.
        background (bool): hash and write on a thread of its own (see the module doc). Defaults to False.
        digest ("sha256" | "xxh3_128"): Defaults to "sha256".

    Attributes:
        flushed (int): bytes handed over so far (written, or being written).
        hash: the digest of those bytes once :meth:`drain` returns.
    """

    def __init__(self, fd: int, buffer_size: int, background: bool = False, digest: DigestName = "sha256") -> None:
        self.fd = fd
        self.size = buffer_size
        self.flushed = 0
        self.hash = new_digest(digest)
        self.background = background
        # buffers in the thread's hands, each with its job, oldest first
        self._inflight: collections.deque[tuple[memoryview, Future[Any]]] = collections.deque()
        self._spare: list[memoryview] = []
        self._io: ThreadPoolExecutor | None = None

    def buffer(self) -> memoryview:
        """A free buffer (contents left from earlier use)."""
        if self._spare:
            return self._spare.pop()
        if len(self._inflight) < BUFFERS:
            return memoryview(_POOL.empty((self.size,), np.uint8)).cast("B")  # type: ignore[arg-type]
        return self._reclaim()

    def hand_off(self, buf: memoryview, n: int) -> memoryview:
        """Hash and write the first ``n`` bytes of ``buf`` (now, or on the thread); return the next buffer."""
        if not self.background:
            self._hash_and_write(buf[:n])
            self.flushed += n
            return buf
        if self._io is None:
            self._io = ThreadPoolExecutor(1, thread_name_prefix="fastdata-tar-write")
        self._inflight.append((buf, self._io.submit(self._hash_and_write, buf[:n])))
        self.flushed += n
        return self.buffer()

    def write_through(self, view: memoryview) -> None:
        """Hash and write ``view`` now, after everything handed over before (data bigger than a buffer)."""
        self.drain()
        self._hash_and_write(view)
        self.flushed += len(view)

    def drain(self) -> None:
        """Wait for every buffer in the thread's hands (all of them, even after an error, then raise it:
        a full disk surfaces here)."""
        error: BaseException | None = None
        while self._inflight:
            try:
                self._spare.append(self._reclaim())
            except BaseException as e:  # noqa: BLE001 - raised below, once every buffer is back
                error = error or e
        if error is not None:
            raise error

    def truncate(self, flushed: int, digest: Any) -> None:
        """Go back to ``flushed`` bytes, whose digest state is ``digest`` (a ``hash.copy()`` taken then)."""
        self.drain()
        os.ftruncate(self.fd, flushed)
        os.lseek(self.fd, flushed, os.SEEK_SET)
        self.flushed, self.hash = flushed, digest

    def close(self) -> None:
        """Stop the thread and give the buffers back (the file itself is the caller's to close)."""
        if self._io is not None:
            self._io.shutdown(wait=True)
        self._io = None
        self._spare = []

    def _hash_and_write(self, view: memoryview) -> None:
        _write_all(self.fd, view)
        self.hash.update(view)

    def _reclaim(self) -> memoryview:
        buf, job = self._inflight.popleft()
        job.result()
        return buf


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]
