"""The methods of a fastdata dataset that core itself calls: ``worker_world()``, ``begin_pass()`` and ``warm()``.

The whole protocol of a fastdata dataset is declared in :mod:`fastdata.loading`, which builds on
these. They live here because :class:`fastdata.core.epoch.WorkerInit` calls them on any dataset in a
DataLoader worker, and core may import nothing above it. All are ``runtime_checkable``: ``WorkerInit``
asks ``isinstance(dataset, PassAware)`` (or ``WorkerAware``) and leaves a foreign dataset to torch's own
seeding.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fastdata.core.epoch._world import World


@runtime_checkable
class WorkerAware(Protocol):
    """A dataset that knows the :class:`~fastdata.core.epoch.World` of the process reading it."""

    def worker_world(self) -> World:
        """The calling process's world: rank and world size, worker and worker count, seed, epoch."""
        ...


@runtime_checkable
class Warmable(Protocol):
    """A dataset that can open the calling worker's first handles before its first item is asked for."""

    def warm(self) -> None:
        """Open what the first read needs; a failure is left for that read to report."""
        ...


@runtime_checkable
class PassAware(WorkerAware, Protocol):
    """A dataset that logs its passes (iterations), so that :data:`fastdata.worker_init_fn` can tell
    whether the epoch was set for the pass a worker starts (see :mod:`fastdata.core.epoch`)."""

    def begin_pass(self, *, first: bool = False) -> bool:
        """Start a pass in the calling process (``first``: its first, from ``worker_init_fn``, which the
        dataset's own start of the pass then joins); reseed it (``fastdata.core.epoch._seeding.on_pass``); return
        whether the epoch was set for it."""
        ...


__all__ = ["PassAware", "Warmable", "WorkerAware"]
