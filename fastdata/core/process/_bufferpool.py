"""Large batch buffers, reused once nothing refers to them any more.

Memory that a process touches for the first time fills at about 0.5 GB/s on these machines, memory it
reuses at about 6 GB/s (measured here): a loader that allocates a fresh multi-megabyte array for every
batch spends most of its time in page faults once the allocator hands pages back to the system, which
glibc does as soon as a couple of batches are alive at once. The pool keeps the buffers of batches that
were dropped and hands them out again.

Safety: an array from :meth:`BufferPool.empty` owns nothing; its memory belongs to a ``bytearray``
that only the pool holds. Every view of the array (a row, a tensor made by ``torch.from_numpy``) keeps
the array alive, and the buffer goes back to the pool only when the array is garbage collected, so a
buffer is never reused while anything can still read it.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from fastdata.core.process import _pid as process

MIN_BYTES = 256 << 10
"""Smaller arrays come from ``np.empty``: the allocator keeps and reuses those well on its own."""


class BufferPool:
    """Reusable buffers for batch arrays, at most ``keep`` idle ones per size, per process.

    Args:
        keep (int): idle buffers kept per size. Defaults to 4.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._idle: dict[int, list[bytearray]] = {}
        self._pid = process.pid()
        self.reused = 0  # buffers handed out again, for tests and probes

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array (contents left from an earlier batch)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < MIN_BYTES or dtype.hasobject:
            return np.empty(shape, dtype=dtype)
        if self._pid != process.pid():  # buffers of the parent are its business
            self._idle, self._pid = {}, process.pid()
        idle = self._idle.get(nbytes)
        try:
            buf = idle.pop() if idle else None
        except IndexError:  # emptied by another thread's pop since the check
            buf = None
        if buf is None:
            buf = bytearray(nbytes)
        else:
            self.reused += 1
        flat = np.frombuffer(buf, dtype=dtype)
        # every view of the result (rows, reshapes, tensors) refers to ``flat``: numpy stops collapsing a
        # view's base chain at an array over a foreign buffer, so ``flat`` dies only after the last view
        weakref.finalize(flat, self._give_back, buf, self._pid)
        return flat.reshape(shape)

    def _give_back(self, buf: bytearray, pid: int) -> None:
        if pid != self._pid:
            return
        idle = self._idle.setdefault(len(buf), [])
        if len(idle) < self.keep:
            idle.append(buf)

    def __getstate__(self) -> dict[str, Any]:
        return {"keep": self.keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["keep"])  # type: ignore[misc]
