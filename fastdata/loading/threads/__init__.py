"""Reading in threads: :class:`ThreadLoader` (threads of the training process, each standing for one
DataLoader worker, ``fd.Loader(workers="threads")``), the gang of threads with their dataset copies
(``_gang``), and the hybrid, threads inside each worker process (``_hybrid``,
``fd.Loader(threads_per_worker=T)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core import lazy_exports

if TYPE_CHECKING:
    from fastdata.loading.threads._loader import ThreadLoader, thread_loader_for

__getattr__, __dir__ = lazy_exports(__name__)

__all__ = [
    "ThreadLoader",
    "thread_loader_for",
]
