"""What every other part of fastdata stands on, imported by none of them in reverse: the error tree
(:mod:`fastdata.core.errors`), the world (rank, world size, worker), sharding plans, per-process handles,
shared state, seeding and ``worker_init_fn``, stage timing (:mod:`fastdata.core.stages`, the hook a
dataset calls), the resume protocol, and the one reader of ``/proc`` (``_proc``).

``errors`` and ``stages`` are public modules; the rest is private, its public names listed here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata.core._lazy import lazy_exports

if TYPE_CHECKING:
    from fastdata.core._machine import usable_cores, usable_memory
    from fastdata.core._resume import ResumeState
    from fastdata.core._seeding import RepeatedEpochWarning, WorkerInit, compose_worker_init, worker_init_fn
    from fastdata.core._world import World

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "usable_cores": "._machine",
        "usable_memory": "._machine",
        "ResumeState": "._resume",
        "RepeatedEpochWarning": "._seeding",
        "WorkerInit": "._seeding",
        "compose_worker_init": "._seeding",
        "worker_init_fn": "._seeding",
        "World": "._world",
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
