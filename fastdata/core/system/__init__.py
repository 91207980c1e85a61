"""Readings of the operating system: the one reader of ``/proc`` (``_procfs``), what a thread waits on
(``_waits``), the cores and memory this process may use (``_machine``), glibc's freed heap (``_heap``) and
the kernel's names of fastdata's threads (``_thread_name``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.core.system._heap import keep_freed_heap
    from fastdata.core.system._machine import (
        affinity_cpus,
        cpu_quota,
        memory_available,
        usable_cores,
        usable_memory,
        usable_physical_cores,
    )
    from fastdata.core.system._procfs import (
        ProcessCounters,
        ProcessProbe,
        ThreadSampler,
        cpu_model,
        delay_accounting,
        machine_busy,
        memory_of,
        open_fds,
        own_counters,
        procs_blocked,
        python_thread_names,
        rss,
        thread_runq,
        usable_cpus,
    )
    from fastdata.core.system._thread_name import name_this_thread
    from fastdata.core.system._waits import KINDS, split

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "KINDS",
    "ProcessCounters",
    "ProcessProbe",
    "ThreadSampler",
    "affinity_cpus",
    "cpu_model",
    "cpu_quota",
    "delay_accounting",
    "keep_freed_heap",
    "machine_busy",
    "memory_available",
    "memory_of",
    "name_this_thread",
    "open_fds",
    "own_counters",
    "procs_blocked",
    "python_thread_names",
    "rss",
    "split",
    "thread_runq",
    "usable_cores",
    "usable_cpus",
    "usable_memory",
    "usable_physical_cores",
]
