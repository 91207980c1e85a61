"""The two methods of a fastdata dataset that core itself calls: ``worker_world()`` and ``warm()``.

The whole protocol of a fastdata dataset is declared in :mod:`fastdata.loading.protocol`, which builds on
these. They live here because :class:`fastdata.core.seeding.WorkerInit` calls them on any dataset in a
DataLoader worker, and core may import nothing above it. Both are ``runtime_checkable``: ``WorkerInit``
asks ``isinstance(dataset, WorkerAware)`` and seeds a foreign dataset (one without ``worker_world``) the
plain way instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fastdata.core.world import World


@runtime_checkable
class WorkerAware(Protocol):
    """A dataset that knows the :class:`~fastdata.core.world.World` of the process reading it."""

    def worker_world(self) -> World:
        """The calling process's world: rank and world size, worker and worker count, seed, epoch."""
        ...


@runtime_checkable
class Warmable(Protocol):
    """A dataset that can open the calling worker's first handles before its first item is asked for."""

    def warm(self) -> None:
        """Open what the first read needs; a failure is left for that read to report."""
        ...


__all__ = ["Warmable", "WorkerAware"]
