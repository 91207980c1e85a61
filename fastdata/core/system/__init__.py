"""Readings of the operating system: the one reader of ``/proc`` (``_procfs``), what a thread waits on
(``_waits``), the cores and memory this process may use (``_machine``), glibc's freed heap (``_heap``) and
the kernel's names of fastdata's threads (``_thread_name``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.core.system._heap import keep_freed_heap
    from fastdata.core.system._thread_name import name_this_thread

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "keep_freed_heap": "._heap",
        "name_this_thread": "._thread_name",
    },
)

__all__ = [
    "keep_freed_heap",
    "name_this_thread",
]
