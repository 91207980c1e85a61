"""The main process's side of the reused batch slots (see :mod:`fastdata.loading.transport`).

Unpickling a ``SlotBatch`` calls :func:`_receive`: it maps the slot once (the
slot's tensor and the ring's control array come with a ring's first batches only, and are kept here by
ring), builds the batch as views of it, and sets a ``weakref.finalize`` on the array that they all share.
When the user has dropped the last of them (or ``hold`` later batches have arrived, or at once with
``copy=True``), the slot's control word is set back to 0 if it still holds this batch's ticket, and the
worker may reuse the slot. Pinned slots wait for the CUDA work queued before (see
:mod:`fastdata.loading.transport`).
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from typing import Any

import numpy as np
import torch

from fastdata.core import process
from fastdata.core.errors import FastdataError
from fastdata.loading.transport import _layout as slot_layout
from fastdata.loading.transport import _pinning as pinning
from fastdata.loading.transport._layout import BytesAs


class SlotLost(FastdataError, RuntimeError):
    """A descriptor names a slot whose memory never reached this process."""


class _MainSlot:
    __slots__ = ("array", "pinned", "tensor", "uid", "view")

    def __init__(self, uid: int, tensor: torch.Tensor, pin: bool) -> None:
        self.uid, self.tensor = uid, tensor
        self.array = tensor.numpy()
        self.view = self.array.data  # a memoryview: the base of every batch's array: keeps the mapping alive
        self.pinned = False
        if pin and pinning.available():
            ptr = pinning.register(tensor)
            if ptr is not None:
                self.pinned = True
                # undone when the last batch viewing this mapping is gone, just before the unmapping
                weakref.finalize(self.array, pinning.unregister, ptr, process.pid()).atexit = False


class _MainRing:
    __slots__ = ("pid", "slots", "state")

    def __init__(self, pid: int, control: torch.Tensor) -> None:
        self.pid = pid
        self.state = control.numpy()
        self.slots: dict[int, _MainSlot] = {}


class _Free:
    """Give slot ``pos`` back to its worker, if it still holds batch ``ticket`` (called once the batch is
    dropped; only in the process that received it: a forked child must not free its parent's slots)."""

    __slots__ = ("owner", "pinned", "pos", "state", "ticket")

    def __init__(self, state: np.ndarray, pos: int, ticket: int, pinned: bool) -> None:
        self.state, self.pos, self.ticket, self.pinned = state, pos, ticket, pinned
        self.owner = process.pid()

    def __call__(self) -> None:
        if process.pid() != self.owner:
            return
        if self.pinned:
            _pending().add(self.release)
        else:
            self.release()

    def release(self) -> None:
        if self.state[self.pos] == self.ticket:
            self.state[self.pos] = 0


_lock = threading.Lock()  # the registry is used by the pin-memory thread and by finalizers in any thread
_rings: dict[int, _MainRing] = {}  # by ring token
_held: collections.deque[weakref.finalize[Any, Any]] = collections.deque()  # for hold=
_counts = {"slots": 0, "pipe": 0}
_pending_frees: pinning.PendingFrees | None = None


def _pending() -> pinning.PendingFrees:
    global _pending_frees
    if _pending_frees is None:
        _pending_frees = pinning.PendingFrees()
    return _pending_frees


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prune() -> None:
    for token in [t for t, r in _rings.items() if not _alive(r.pid)]:
        del _rings[token]  # the batches still viewing its slots keep their memory


def _receive(
    token: int,
    pid: int,
    control: torch.Tensor | None,
    pos: int,
    uid: int,
    tensor: torch.Tensor | None,
    ticket: int,
    used: int,
    skeleton: Any,
    options: tuple[BytesAs, bool, bool, int | None],
) -> Any:
    bytes_as, copy, pin, hold = options
    with _lock:
        ring = _rings.get(token)
        if ring is None:
            if control is None:
                raise SlotLost(
                    f"a batch from worker pid {pid} names a ring this process never received (its first "
                    "batch was lost); pass the worker's batches to one process, or use copy=True"
                )
            _prune()  # new workers: rings of exited ones can go
            ring = _rings[token] = _MainRing(pid, control)
        if tensor is not None:
            ring.slots[pos] = _MainSlot(uid, tensor, pin)
        slot = ring.slots.get(pos)
        if slot is None or slot.uid != uid:
            raise SlotLost(
                f"a batch from worker pid {pid} names slot {pos} (#{uid}), whose memory never reached this "
                "process; pass the worker's batches to one process, or use copy=True"
            )
        _counts["slots"] += 1
    if _pending_frees is not None:
        _pending_frees.poll()
    flat = np.frombuffer(slot.view, np.uint8, count=used)
    batch = slot_layout.rebuild(skeleton, flat, bytes_as, copy)
    free = _Free(ring.state, pos, ticket, slot.pinned)
    if copy:
        free()
        return batch
    fin = weakref.finalize(flat, free)
    fin.atexit = False
    if hold is not None:
        with _lock:
            _held.append(fin)
            early = [_held.popleft() for _ in range(len(_held) - hold)]
        for f in early:
            f()  # documented: a batch held past ``hold`` later batches may be overwritten
    return batch


def _receive_pipe(batch: Any, bytes_as: BytesAs) -> Any:
    with _lock:
        _counts["pipe"] += 1
    return slot_layout.packed_lists(batch) if bytes_as == "packed" else batch


def _tensor_from_pipe(data: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor that came through the pipe as bytes (its worker's shared memory ran short)."""
    return torch.from_numpy(data).view(dtype).reshape(shape)


def stats() -> dict[str, int]:
    """This process's counts: batches received through slots (``"slots"``) and the stock way
    (``"pipe"``), rings and slots mapped, their bytes, and how many of those bytes are pinned."""
    with _lock:
        slots = [s for r in _rings.values() for s in r.slots.values()]
        return {
            **_counts,
            "rings": len(_rings),
            "mapped_slots": len(slots),
            "mapped_bytes": sum(s.array.nbytes for s in slots),
            "pinned_bytes": sum(s.array.nbytes for s in slots if s.pinned),
        }


def release(everything: bool = False) -> None:
    """Let go of the slots of workers that have exited (all slots with ``everything``); batches still
    held keep their memory until dropped. Call it after a DataLoader's workers stop, to return their
    shared memory at once rather than when the next loader's workers start."""
    with _lock:
        if everything:
            _rings.clear()
            _held.clear()
        else:
            _prune()


def reset_counts() -> None:
    """Zero the ``"slots"`` and ``"pipe"`` counts of :func:`stats`."""
    with _lock:
        _counts.update(slots=0, pipe=0)


def _forget_in_child() -> None:
    # a forked worker inherits the parent's registry: drop it (finalizers check the pid and do nothing
    # here), and a lock that another thread may have held at the fork
    global _lock
    _lock = threading.Lock()
    _rings.clear()
    _held.clear()
    if _pending_frees is not None:
        _pending_frees.clear()


process.at_fork(after_in_child=_forget_in_child)

__all__ = ["SlotLost", "release", "reset_counts", "stats"]
