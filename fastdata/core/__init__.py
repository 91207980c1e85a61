"""What every other part of fastdata stands on, imported by none of them in reverse: the error tree
(:mod:`fastdata.core.errors`), the world (rank, world size, worker), sharding plans, per-process handles,
shared state, seeding and ``worker_init_fn``, stage timing (:mod:`fastdata.core.stages`, the hook a
dataset calls), the resume protocol, and the one reader of ``/proc`` (``_proc``).

``errors`` and ``stages`` are public modules; the rest is private, its public names listed here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.core.epoch._resume import ResumeState
    from fastdata.core.epoch._seeding import RepeatedEpochWarning, WorkerInit, compose_worker_init, worker_init_fn
    from fastdata.core.epoch._world import World
    from fastdata.core.system._machine import usable_cores, usable_memory

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "usable_cores": ".system._machine",
        "usable_memory": ".system._machine",
        "ResumeState": ".epoch._resume",
        "RepeatedEpochWarning": ".epoch._seeding",
        "WorkerInit": ".epoch._seeding",
        "compose_worker_init": ".epoch._seeding",
        "worker_init_fn": ".epoch._seeding",
        "World": ".epoch._world",
    },
)

__all__ = [
    "RepeatedEpochWarning",
    "ResumeState",
    "WorkerInit",
    "World",
    "compose_worker_init",
    "usable_cores",
    "usable_memory",
    "worker_init_fn",
]
