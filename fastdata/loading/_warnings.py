"""Warnings raised in DataLoader worker processes, carried to the training process's ``warnings`` machinery.

A worker's warning goes to the worker's stderr and its filters only: the training process's
``warnings.filterwarnings``, ``pytest.warns`` or a logging capture never see it, and each worker prints it
again. :class:`WarningRelay` (one per :class:`fastdata.Loader`) hands each worker a queue: the worker's
``warnings.showwarning`` puts each distinct warning on it once, and the Loader re-issues it in the
training process (``warnings.warn_explicit``, with its category, file and line) as batches arrive, each
distinct warning once per loader. A queue of the start method's context, as the shared-memory slots are
(see :mod:`fastdata.loading.transport`): it is passed to the workers with their ``worker_init_fn``.
"""

from __future__ import annotations

import importlib
import multiprocessing
import queue
import warnings
from typing import Any

# (category module, category name, message, filename, lineno)
Record = tuple[str, str, str, str, int]


class WarningRelay:
    """Carries the warnings of a loader's workers to this process (see the module doc).

    Args:
        context: the workers' start method (a name, a context, or None for the default).
    """

    def __init__(self, context: Any = None) -> None:
        ctx = multiprocessing.get_context(context) if isinstance(context, str) or context is None else context
        self._queue: Any = ctx.Queue()
        self._seen: set[tuple[str, str, str]] = set()

    def install(self, worker_id: int) -> None:
        """In a worker (its ``worker_init_fn``): send each distinct warning to the training process."""
        sent: set[tuple[str, str]] = set()
        out = self._queue

        def show(message: Any, category: type[Warning], filename: str, lineno: int, *_: Any, **__: Any) -> None:
            text = str(message)
            if (category.__qualname__, text) in sent:
                return
            sent.add((category.__qualname__, text))
            out.put((category.__module__, category.__qualname__, text, str(filename), int(lineno)))

        warnings.showwarning = show

    def drain(self) -> None:
        """Re-issue here what the workers sent since the last call, each distinct warning once."""
        while True:
            try:
                record: Record = self._queue.get_nowait()
            except (queue.Empty, OSError, ValueError):  # nothing waiting, or a queue already closed
                return
            module, name, text, filename, lineno = record
            key = (module, name, text)
            if key in self._seen:
                continue
            self._seen.add(key)
            warnings.warn_explicit(text, _category(module, name), filename, lineno)

    def __getstate__(self) -> dict[str, Any]:
        return {"_queue": self._queue, "_seen": set()}


def _category(module: str, name: str) -> type[Warning]:
    """The warning class by its module and name, or ``UserWarning`` where it cannot be imported here."""
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return UserWarning
    return obj if isinstance(obj, type) and issubclass(obj, Warning) else UserWarning


__all__ = ["WarningRelay"]
