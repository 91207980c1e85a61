"""Page-locking (pinning) shared-memory slots once, in the process that copies them to the GPU.

``DataLoader(pin_memory=True)`` copies every batch into page-locked memory so that the host-to-device
copy can run asynchronously: one more pass over every byte, per batch. A slot registered with
``cudaHostRegister`` is page-locked for as long as it is mapped, so ``Tensor.pin_memory()`` returns a
view of it unchanged (torch checks ``is_pinned()`` first) and ``.to("cuda", non_blocking=True)`` reads
straight from the slot.

Nothing here runs unless a slot asks for pinning and ``torch.cuda.is_available()``: the CPU path never
touches CUDA. Registration happens once per slot mapping and is undone just before the mapping goes.

The one hazard of pinned memory that is reused: an asynchronous copy may still be reading a slot when
the batch's tensors are dropped. :class:`PendingFrees` therefore lets a pinned slot go back to its
worker only once a CUDA event, recorded on the current stream when the batch was dropped, has completed.
Copies issued on another stream must be synchronised with the current one before the batch is dropped
(the same rule as ``Tensor.record_stream`` for torch's own allocator).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fastdata.core import process

_warned = False


def available() -> bool:
    """Whether pinning can work here (CUDA present). Only called when pinning was asked for."""
    global _warned
    if torch.cuda.is_available():
        return True
    if not _warned:
        _warned = True
        warnings.warn("pin=True: CUDA is not available, so slots are not pinned", RuntimeWarning, stacklevel=3)
    return False


def register(tensor: torch.Tensor) -> int | None:
    """Page-lock the memory of ``tensor`` (a mapped slot); its address, or None when CUDA refused."""
    ptr, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    # 1 = cudaHostRegisterPortable: pinned for every CUDA context, as torch's own _pin_memory_utils does
    err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 1)
    if int(err) != 0:
        warnings.warn(
            f"cudaHostRegister of a {nbytes}-byte slot failed (cudaError {int(err)}); this slot is not "
            "pinned, so pin_memory=True copies its batches as usual (raise the locked-memory limit, "
            "ulimit -l, or use fewer or smaller slots)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return ptr


def unregister(ptr: int, owner: int) -> None:
    """Undo :func:`register`, in the process that registered (never in a forked child)."""
    if process.pid() == owner:
        try:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        except RuntimeError:  # interpreter or driver shutting down: the mapping goes with the process
            pass


class PendingFrees:
    """Frees of pinned slots, each waiting for the CUDA work queued before the batch was dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[tuple[Any, Callable[[], None]]] = []

    def add(self, free: Callable[[], None]) -> None:
        """Run ``free`` once the work queued on the current stream so far has finished."""
        try:
            event = torch.cuda.Event()
            event.record()
        except RuntimeError:  # no usable CUDA context any more (shutdown): nothing can be reading
            free()
            return
        with self._lock:
            self._waiting.append((event, free))
        self.poll()

    def poll(self) -> None:
        """Run the frees whose events have completed."""
        if not self._waiting:
            return
        with self._lock:
            flags = [(e.query(), e, f) for e, f in self._waiting]
            self._waiting = [(e, f) for ok, e, f in flags if not ok]
        for free in [f for ok, _, f in flags if ok]:
            free()

    def clear(self) -> None:
        """Forget every pending free (in a forked child, whose CUDA state is unusable)."""
        self._waiting = []
