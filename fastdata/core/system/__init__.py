"""Readings of the operating system: the one reader of ``/proc`` (``_procfs``), what a thread waits on
(``_waits``), the cores and memory this process may use (``_machine``), glibc's freed heap (``_heap``) and
the kernel's names of fastdata's threads (``_thread_name``)."""
