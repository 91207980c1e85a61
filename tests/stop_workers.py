"""Shut a DataLoader iterator's worker processes down now, for tests that make a worker's error reach them.

The raised error's traceback keeps the iterator alive in a reference cycle (torch's ``reraise`` frame holds
the error that holds the traceback). The cyclic garbage collector finds it later, in whichever test is
running then, and finalizes its queues before calling its ``__del__``: torch's message to stop never
reaches the workers, and it waits 5 s per worker before killing them (``fastdata.Loader.close()`` does
this shutdown itself; a plain ``DataLoader`` has no public way to).
"""

from __future__ import annotations

from typing import Any


def stop_workers(iterator: Any) -> None:
    """Stop the workers of ``iterator`` (a DataLoader's iterator; anything else is left as it is)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
