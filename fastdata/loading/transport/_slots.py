"""Reused batch slots in shared memory: the worker's ring and the main process's side of it.

Each DataLoader worker owns a :class:`WorkerRing`: up to ``slots`` preallocated slots of shared memory
(torch shared tensors, so torch's own machinery maps them into the main process under ``fork`` and
``spawn``, and the kernel frees them when both processes have let go: nothing is left in ``/dev/shm``
even when a worker is killed), sized from the first batches (a quarter more than the batch that made
the slot) and bounded by ``max_bytes``. A control array in shared memory holds one word per slot: 0 when
the slot is free, else the ticket of the batch in it.

In the worker, :meth:`WorkerRing.pack` writes a collated batch into a free slot (see
:mod:`fastdata.loading.transport`), marks it with the batch's ticket and returns a :class:`SlotBatch`,
which pickles to a small descriptor: the slot's tensor and the control array travel only the first time.
In the main process, unpickling it maps the slot once and builds the batch as views of it; once the
user has dropped them, the main process writes 0 into the slot's control word (if it still holds this
batch's ticket) and the worker may reuse the slot (see :mod:`fastdata.loading.transport`).

Each control word has one writer at a time (the worker writes a ticket only into a 0, the main process a
0 only over its own ticket), so no lock crosses processes. A worker that finds no free slot waits up to
``wait_s`` for one, then sends that batch the stock way (:class:`PipeBatch`: correct, only slower), and
stops waiting until a slot is free again: a consumer that keeps every batch never blocks its workers.

A batch that takes the pipe has its tensors moved to shared memory here, in the worker's own thread, as
torch would do later in the queue's feeder thread: there a "No space left on device" from a full
``/dev/shm`` is printed and the batch dropped, and the main process waits for it forever. Where shared
memory is short, its tensors travel through the pipe as bytes instead (and a warning says how to give the
worker more ``/dev/shm``).

Steady state: no page is touched for the first time per batch (slots are written over and mapped once)
and no payload is pickled. Written by hand because torch shares a fresh tensor per batch and no library
hands a DataLoader reusable shared buffers.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from fastdata.core import process
from fastdata.core.process import BufferPool
from fastdata.loading.transport import _layout as slot_layout
from fastdata.loading.transport._registry import _receive, _receive_pipe, _tensor_from_pipe


def _round_up(n: int, to: int = 64 << 10) -> int:
    return max(to, -(-n // to) * to)


class _WorkerSlot:
    __slots__ = ("array", "nbytes", "sent", "tensor", "uid", "view")

    def __init__(self, uid: int, nbytes: int) -> None:
        # share_memory_ copies the (uninitialised) tensor into fresh shared memory: every page of the
        # slot is touched once here, in the worker, and never again for the first time
        self.tensor = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
        self.array = self.tensor.numpy()
        self.view = memoryview(self.array)
        self.uid, self.nbytes, self.sent = uid, nbytes, False


SHM_DIR = "/dev/shm"  # where torch's shared memory lives on Linux (shm_open)


class _ShmShort(Exception):
    pass


def _shm_free() -> int | None:
    """Bytes free in :data:`SHM_DIR`, or None where there is no such folder to ask."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _out_of_shm(error: RuntimeError) -> bool:
    """Whether torch failed to allocate shared memory (``unable to allocate shared memory(shm) ...: No
    space left on device``, or a mapping it could not make)."""
    text = str(error)
    return "shared memory" in text or "No space left" in text or "Cannot allocate memory" in text


_SHM_FIX = (
    "give it more shared memory (docker run --shm-size=2g; Kubernetes: an emptyDir volume with medium: "
    "Memory on /dev/shm), or pass transport='stock' to fd.Loader"
)


def _shm_size_text() -> str:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return SHM_DIR
    return f"{SHM_DIR} ({st.f_blocks * st.f_frsize / 1e6:.0f} MB, {st.f_bavail * st.f_frsize / 1e6:.0f} MB free)"


class _PipedTensor:
    """A tensor that travels through the pipe as bytes (shared memory ran short): rebuilt as a tensor of
    the same dtype and shape in the main process."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        t = self.tensor.detach().contiguous()
        return (_tensor_from_pipe, (t.reshape(-1).view(torch.uint8).numpy(), t.dtype, tuple(t.shape)))


class SlotBatch:
    """A batch written into a slot, as a worker returns it: pickles to a small descriptor, and unpickles
    in the main process into the batch itself (views of the slot)."""

    __slots__ = ("args",)

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args

    def __reduce__(self) -> tuple[Any, ...]:
        return (_receive, self.args)


class PipeBatch:
    """A batch that found no free slot: it travels the stock way (torch shares its tensors, pickle the
    rest) and is counted in :func:`stats` as ``"pipe"``; with ``bytes_as="packed"`` its lists of bytes
    still arrive as ``PackedBytes``."""

    __slots__ = ("batch", "bytes_as")

    def __init__(self, batch: Any, bytes_as: str) -> None:
        self.batch, self.bytes_as = batch, bytes_as

    def __reduce__(self) -> tuple[Any, ...]:
        return (_receive_pipe, (self.batch, self.bytes_as))


class WorkerRing:
    """One worker's slots (see the module doc).

    Args:
        slots (int): most slots at once.
        max_bytes (int): most bytes of slots at once.
    """

    def __init__(self, slots: int, max_bytes: int) -> None:
        self.token = int.from_bytes(os.urandom(8), "little") >> 1  # names this ring across processes
        self.pid = process.pid()
        self.control = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self.state = self.control.numpy()
        self.slots: list[_WorkerSlot | None] = [None] * slots
        self.max_bytes = max_bytes
        self.ticket = 0
        self._uid = 0
        self._control_sent = False
        self._starved = False  # the last wait timed out: do not wait again until a slot is found free
        self._warned_size = False
        self._shm_short = False  # shared memory ran short: make no more slots, use those made
        self._pipe_tensors = False  # a pipe batch's tensors could not be shared: send them as bytes
        self._expected = 0  # the largest batch packed so far, in bytes: what a reserved slot must hold
        self._arena: list[Any] | None = None  # [position, slot, bytes used] reserved by SlotPool.empty
        global _current
        _current = self

    def mapped_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots if s is not None)

    def _take(self, nbytes: int) -> tuple[int, _WorkerSlot] | None:
        state = self.state
        best: tuple[int, _WorkerSlot] | None = None
        for pos, slot in enumerate(self.slots):
            if slot is None or slot.nbytes < nbytes or state[pos] != 0:
                continue
            if best is None or slot.nbytes < best[1].nbytes:
                best = (pos, slot)
        if best is not None:
            return best
        if self._shm_short:
            return None
        size, used = _round_up(nbytes + nbytes // 4), self.mapped_bytes()
        for pos, slot in enumerate(self.slots):
            if slot is None and used + size <= self.max_bytes:
                return self._new(pos, size)
        for pos, slot in enumerate(self.slots):  # a free slot too small for this batch: make it larger
            if slot is not None and state[pos] == 0 and used - slot.nbytes + size <= self.max_bytes:
                self.slots[pos] = None
                return self._new(pos, size)
        return None

    def _new(self, pos: int, nbytes: int) -> tuple[int, _WorkerSlot] | None:
        """A new slot at ``pos``; None (and no slot made from now on) when shared memory is short."""
        free = _shm_free()
        try:
            if free is not None and nbytes > free // 2:
                raise _ShmShort(free)
            slot = _WorkerSlot(self._uid + 1, nbytes)
        except (_ShmShort, RuntimeError) as e:
            # Docker's /dev/shm is 64 MB unless told otherwise: slots (kept, a quarter larger than the batch,
            # several per worker) may not fit where the stock transport's one batch at a time does
            if isinstance(e, RuntimeError) and not _out_of_shm(e):
                raise
            self._shm_short = True
            warnings.warn(
                f"fastdata slots: {SHM_DIR} is too small for another {nbytes / 1e6:.1f} MB batch slot "
                f"({'' if free is None else f'{free / 1e6:.0f} MB free; '}Docker gives containers 64 MB "
                f"unless told otherwise): this worker sends its other batches the stock way (slower); "
                f"{_SHM_FIX}",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        self._uid += 1
        self.slots[pos] = slot
        return pos, slot

    def acquire(self, nbytes: int, wait_s: float) -> tuple[int, _WorkerSlot] | None:
        """A free slot of at least ``nbytes`` (made if the budget allows), waiting up to ``wait_s`` for
        the main process to free one; None when there is none."""
        if _round_up(nbytes + nbytes // 4) > self.max_bytes:
            if not self._warned_size:
                self._warned_size = True
                warnings.warn(
                    f"a batch of {nbytes} bytes does not fit in max_bytes={self.max_bytes} of slots: such "
                    "batches travel the stock way; raise max_bytes",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return None
        deadline, pause = 0.0, 50e-6
        while True:
            got = self._take(nbytes)
            if got is not None:
                self._starved = False
                return got
            if self._starved or wait_s <= 0:
                return None
            now = time.monotonic()
            deadline = deadline or now + wait_s
            if now >= deadline:
                self._starved = True
                return None
            time.sleep(pause)  # the main process frees slots as the user drops batches
            pause = min(2 * pause, 2e-3)

    def reserve(self, nbytes: int, wait_s: float) -> np.ndarray | None:
        """``nbytes`` of the slot that the next packed batch will use (see :class:`SlotPool`), or None when
        no slot is known to be large enough yet (the first batch) or the reserved one is full."""
        if self._arena is None:
            if not self._expected or nbytes > self._expected:
                return None
            got = self.acquire(self._expected, wait_s)
            if got is None:
                return None
            self.state[got[0]] = -1  # reserved: neither free (0) nor a batch's ticket
            self._arena = [got[0], got[1], 0]
        _, slot, used = self._arena
        if used + nbytes > slot.nbytes:
            return None
        self._arena[2] = slot_layout.aligned(used + nbytes)
        return slot.array[used : used + nbytes]

    def pack(self, batch: Any, wait_s: float, options: tuple[Any, ...]) -> SlotBatch | PipeBatch:
        """``batch`` written into a slot, as a :class:`SlotBatch`; a :class:`PipeBatch` when no slot is free."""
        global _current
        _current = self
        arena, self._arena = self._arena, None
        plan = None
        if arena is not None:
            pos, slot, used = arena
            plan = slot_layout.plan(batch, (slot.tensor.data_ptr(), slot.nbytes, used))
            if plan.nbytes > slot.nbytes:  # more than the reserved slot holds: lay it out afresh
                plan = None
            if plan is None:
                self.state[pos] = 0
        if plan is None:
            plan = slot_layout.plan(batch)
            if plan.nbytes == 0:  # nothing worth a slot (no tensor, array or long bytes)
                return PipeBatch(self._shared(plan.skeleton), options[0])
            got = self.acquire(plan.nbytes, wait_s)
            if got is None:
                return PipeBatch(self._shared(slot_layout.materialise(batch)), options[0])
            pos, slot = got
        self._expected = max(self._expected, plan.nbytes)
        slot_layout.write(plan, slot.tensor, slot.array, slot.view)
        self.ticket += 1
        self.state[pos] = self.ticket
        control = None if self._control_sent else self.control
        tensor = None if slot.sent else slot.tensor
        self._control_sent = slot.sent = True
        return SlotBatch(
            (self.token, self.pid, control, pos, slot.uid, tensor, self.ticket, plan.nbytes, plan.skeleton, options)
        )

    def _shared(self, batch: Any) -> Any:
        """``batch`` with its CPU tensors in shared memory (done here so that a full ``/dev/shm`` is met in
        this thread, not in the queue's feeder thread, which would drop the batch), or, once shared memory
        has run short, wrapped to travel through the pipe as bytes."""

        def take(leaf: Any) -> Any:
            if isinstance(leaf, list):
                return leaf if slot_layout._atoms(leaf) else slot_layout._DESCEND
            if not isinstance(leaf, torch.Tensor) or leaf.device.type != "cpu" or leaf.layout != torch.strided:
                return leaf
            if not self._pipe_tensors and not leaf.is_shared():
                try:
                    leaf.share_memory_()
                except RuntimeError as e:
                    if not _out_of_shm(e):
                        raise
                    self._pipe_tensors = True
                    warnings.warn(
                        f"fastdata slots: {_shm_size_text()} cannot hold a {leaf.nbytes / 1e6:.1f} MB tensor of a "
                        f"batch ({e}): this worker sends its batches' tensors through the pipe as bytes "
                        f"(slower); {_SHM_FIX}",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            return _PipedTensor(leaf) if self._pipe_tensors and not leaf.is_shared() else leaf

        return slot_layout._walk(batch, take)


_current: WorkerRing | None = None  # this worker's ring (the latest one made or used in this process)
_stacking_pid = -1  # the process whose SlotCollate passes batches on as the dataset made them


def stack_in_slots() -> None:
    """Mark this worker as one whose batches, made by the dataset itself, go into slots unchanged: from
    now on :func:`stacking` is True here, and a dataset's default collate may leave tensors to be
    stacked straight into the slot (see :func:`fastdata.loading.transport.batch_default_collate`)."""
    global _stacking_pid
    _stacking_pid = process.pid()


def stacking() -> bool:
    """Whether this process packs the dataset's own batches into slots unchanged (see :func:`stack_in_slots`)."""
    return _stacking_pid == process.pid()


class SlotPool:
    """Batch arrays allocated straight in the worker's next slot, so a dataset reads into shared memory
    and packing the batch copies nothing: pass it where a dataset takes a
    :class:`~fastdata.core.process.BufferPool` (it has the same ``empty``).

    In a DataLoader worker whose batches go through :class:`~fastdata.loading.transport.SlotCollate`
    (from its second batch on, once a slot's size is known), :meth:`empty` returns memory of the slot
    that the worker's next batch will be packed into; anywhere else, or when that slot is full, it
    falls back to the :class:`~fastdata.core.process.BufferPool`. The arrays belong to that batch:
    the slot is reused once the main process has dropped it, whatever the worker still holds, so a
    dataset must not keep them past returning the batch.

    Args:
        wait_s (float): how long to wait for a free slot, in seconds. Defaults to 0.05.
    """

    def __init__(self, wait_s: float = 0.05) -> None:
        self.wait_s = wait_s
        self._fallback = BufferPool()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array, in the next slot where there is one."""
        dtype = np.dtype(dtype)
        ring = _current
        if ring is not None and ring.pid == process.pid() and not dtype.hasobject:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            memory = ring.reserve(nbytes, self.wait_s) if nbytes else None
            if memory is not None:
                return memory.view(dtype).reshape(shape)
        return self._fallback.empty(shape, dtype)

    def __getstate__(self) -> dict[str, Any]:
        return {"wait_s": self.wait_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["wait_s"])  # type: ignore[misc]


__all__ = ["PipeBatch", "SlotBatch", "SlotPool", "WorkerRing", "stack_in_slots", "stacking"]
