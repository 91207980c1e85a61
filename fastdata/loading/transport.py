"""Moving batches of bytes from DataLoader workers to the main process through shared memory.

A DataLoader worker hands each batch to the main process through a pipe: the batch is pickled (a copy),
written to the pipe and read back (two more copies, and a system call per 64 KiB), and unpickled (a
fourth copy). For batches of raw ~30 KB samples this, not reading, caps what workers deliver
(~330-420 MB/s on two cores; costs: docs/tar.md). :class:`SharedMemoryCollate` takes the bytes out of the pipe:

* each worker owns a ring buffer in shared memory (a torch shared tensor, so torch's own machinery
  maps it into the main process and frees it when both sides are done, under ``fork`` and ``spawn``);
* in the worker, the collated batch's ``bytes`` values are copied into the ring, and what goes
  through the pipe is the batch with small ``(offset, length)`` markers and a handle to the ring;
* in the main process, unpickling the batch copies each value out of the ring into ``bytes`` and
  marks that part of the ring free. Batches are unpickled in the order a worker sent them, so the ring
  is consumed in order.

When the ring is full (the main process is behind) the worker waits up to ``wait_s`` for room, then
sends that value through the pipe as usual: never a deadlock, never a lost sample. Tensors and other
values travel as the DataLoader sends them anyway. In the main process (``num_workers=0``) the
collate function is applied unchanged.

Written by hand because neither torch nor webdataset moves byte strings between processes without the
pipe; torch shares tensors, which is the piece used here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from fastdata.core import process
from fastdata.core.errors import check_positive

_HEADER = 64  # two int64 counters (bytes written, bytes consumed), padded to a cache line
_rings: dict[int, _Ring] = {}  # this worker's ring, by capacity
# Rings received in the main process, by worker pid. Holding them keeps torch's cache of shared
# storages warm (no new mapping, and no fresh pages to fault in, per batch); rings of workers that
# have exited are let go when a new ring arrives.
_received: dict[int, torch.Tensor] = {}


class _Ring:
    """A ring of ``capacity`` bytes in shared memory, written by one worker, read by the main process."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tensor = torch.empty(_HEADER + capacity, dtype=torch.uint8).share_memory_()
        self.array = self.tensor.numpy()
        self.counters = self.array[:16].view(np.int64)  # [written, consumed], both ever-growing
        self.counters[:] = 0
        self.data = memoryview(self.array)[_HEADER:]
        self.pid = process.pid()

    def put(self, value: bytes | bytearray | memoryview, wait_s: float) -> tuple[int, int] | None:
        """Copy ``value`` in; return ``(position, length)``, or None when there is no room in time."""
        n = len(value)
        if n > self.capacity:
            return None
        written = int(self.counters[0])
        at = written % self.capacity
        if at + n > self.capacity:  # keep each value contiguous: skip the ring's tail
            written += self.capacity - at
            at = 0
        deadline = None
        while written + n - int(self.counters[1]) > self.capacity:
            now = time.monotonic()
            deadline = deadline or now + wait_s
            if now > deadline:
                return None
            time.sleep(0.0002)  # the main process frees room as it unpickles earlier batches
        self.data[at : at + n] = value
        self.counters[0] = written + n
        return written, n


class _Slot:
    """Where one value lies in the ring (what travels through the pipe instead of the bytes)."""

    __slots__ = ("length", "position")

    def __init__(self, position: int, length: int) -> None:
        self.position, self.length = position, length

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Slot, (self.position, self.length))


class SharedMemoryBatch:
    """A batch whose ``bytes`` values wait in a worker's ring; unpickling it gives the plain batch."""

    def __init__(self, ring: torch.Tensor, capacity: int, batch: Any, end: int, pid: int) -> None:
        self.ring, self.capacity, self.batch, self.end, self.pid = ring, capacity, batch, end, pid

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpack, (self.ring, self.capacity, self.batch, self.end, self.pid))


def _map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with ``leaf`` applied to everything inside its dicts, lists and plain tuples (named
    tuples are leaves: rebuilding them positionally could fail)."""
    if isinstance(value, dict):
        return {k: _map_leaves(v, leaf) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_leaves(v, leaf) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_map_leaves(v, leaf) for v in value)
    return leaf(value)


def _pack(value: Any, ring: _Ring, wait_s: float) -> Any:
    def put(leaf: Any) -> Any:
        if isinstance(leaf, (bytes, bytearray)) and len(leaf) >= 1024:
            slot = ring.put(leaf, wait_s)
            return leaf if slot is None else _Slot(*slot)
        return leaf

    return _map_leaves(value, put)


def _copy_out(value: Any, data: np.ndarray, capacity: int) -> Any:
    def take(leaf: Any) -> Any:
        if isinstance(leaf, _Slot):
            at = leaf.position % capacity
            return data[at : at + leaf.length].tobytes()
        return leaf

    return _map_leaves(value, take)


def _unpack(ring: torch.Tensor, capacity: int, batch: Any, end: int, pid: int) -> Any:
    if _received.get(pid) is not ring:
        for old in [p for p in _received if p != pid and not _alive(p)]:
            del _received[old]
        _received[pid] = ring
    array = ring.numpy()
    out = _copy_out(batch, array[_HEADER:], capacity)
    counters = array[:16].view(np.int64)
    counters[1] = max(int(counters[1]), end)  # this worker's earlier batches were unpickled before
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedMemoryCollate:
    """A ``collate_fn`` that sends the ``bytes`` of each batch through shared memory (see the module).

    Use it where the batch is built in the worker::

        from fastdata.loading.transport import SharedMemoryCollate

        ds = fd.TarShardDataset(urls, batch_size=64, collate_fn=SharedMemoryCollate())
        loader = DataLoader(ds, batch_size=None, num_workers=4)
        # or, map-style:
        loader = DataLoader(ids, batch_size=64, sampler=ids.sampler(), num_workers=4,
                            collate_fn=SharedMemoryCollate())

    Args:
        collate_fn (Callable | None): builds the batch first. Defaults to
            ``torch.utils.data.default_collate`` (which keeps ``bytes`` values as lists).
        capacity (int): ring size per worker, in bytes. Defaults to 32 MiB; hold several batches, as
            the DataLoader keeps ``prefetch_factor`` batches per worker in flight.
        wait_s (float): how long a worker waits for room in a full ring before sending a value through
            the pipe instead, in seconds. Defaults to 0.05.
    """

    def __init__(
        self, collate_fn: Callable[[list[Any]], Any] | None = None, *, capacity: int = 32 << 20, wait_s: float = 0.05
    ) -> None:
        check_positive("capacity", capacity)
        check_positive("wait_s", wait_s, allow_zero=True)
        self.collate_fn = collate_fn or default_collate
        self.capacity, self.wait_s = capacity, wait_s

    def __call__(self, samples: list[Any]) -> Any:
        batch = self.collate_fn(samples)
        if get_worker_info() is None:
            return batch
        ring = _rings.get(self.capacity)
        if ring is None or ring.pid != process.pid():
            ring = _rings[self.capacity] = _Ring(self.capacity)
        packed = _pack(batch, ring, self.wait_s)
        return SharedMemoryBatch(ring.tensor, ring.capacity, packed, int(ring.counters[0]), ring.pid)

    def __repr__(self) -> str:
        return f"SharedMemoryCollate({self.collate_fn!r}, capacity={self.capacity})"


__all__ = ["SharedMemoryBatch", "SharedMemoryCollate"]
